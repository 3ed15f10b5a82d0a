//! Conversions between the WIT world's values and the `http` types the
//! host keeps: guest-supplied URLs, header names, values and lists, parsed
//! and checked; header maps given back as lists.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Uri};

use crate::bindings::inlay::policy::types::Headers;

/// Parses a guest-supplied path and query; it must start with `/`.
pub(crate) fn parse_path_and_query(url: &str) -> Result<Uri, String> {
    if !url.starts_with('/') {
        return Err(format!("url must start with `/`: {url:?}"));
    }
    let pq =
        http::uri::PathAndQuery::try_from(url).map_err(|e| format!("invalid url {url:?}: {e}"))?;
    Ok(Uri::from(pq))
}

/// Parses a guest-supplied header name (lower-cased by `http`).
pub(crate) fn parse_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("invalid header name {name:?}"))
}

/// Parses a guest-supplied header value (no control characters).
pub(crate) fn parse_value(name: &str, value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("invalid value for header {name:?}"))
}

/// Builds a header map from a WIT header list, refusing the first bad field.
pub(crate) fn headers_from_list(list: Headers) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(list.len());
    for (name, value) in list {
        let value = parse_value(&name, &value)?;
        map.append(parse_name(&name)?, value);
    }
    Ok(map)
}

/// A header map as a WIT header list, in the map's order.
pub(crate) fn headers_to_list(map: &HeaderMap) -> Headers {
    map.iter()
        .map(|(name, value)| (name.as_str().to_string(), lossy(value)))
        .collect()
}

/// Header values may hold non-UTF-8 bytes; the guest gets them lossily.
pub(crate) fn lossy(value: &HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

//! The knobs every endpoint shares, applied to the handler's response:
//! headers from the query, conditional requests (304), gzip and `cl=0`.

use std::time::{Duration, UNIX_EPOCH};

use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Method, Response, StatusCode};

use crate::body::OriginBody;
use crate::query::{BadRequest, Params};

/// Query parameters that set one well-known response header each.
static HEADER_KNOBS: [(&str, HeaderName); 8] = [
    ("ct", header::CONTENT_TYPE),
    ("cc", header::CACHE_CONTROL),
    ("sc", HeaderName::from_static("surrogate-control")),
    ("sk", HeaderName::from_static("surrogate-key")),
    ("etag", header::ETAG),
    ("lm", header::LAST_MODIFIED),
    ("vary", header::VARY),
    ("expires", header::EXPIRES),
];

/// Applies the shared knobs to `resp` for the request `req`.
///
/// Order matters: headers first (so `etag=`/`lm=` take part in the
/// conditional check), then 304, then gzip, then hiding the length.
pub fn finish(
    mut resp: Response<OriginBody>,
    params: &Params<'_>,
    req: &Parts,
    force_gzip: bool,
) -> Result<Response<OriginBody>, BadRequest> {
    apply_headers(&mut resp, params)?;
    if (req.method == Method::GET || req.method == Method::HEAD)
        && resp.status() == StatusCode::OK
        && not_modified(&req.headers, resp.headers())
    {
        return Ok(into_not_modified(resp));
    }
    if (force_gzip || params.flag("gzip")? == Some(true))
        && !resp.body().is_empty()
        && !resp.headers().contains_key(header::CONTENT_ENCODING)
    {
        resp.body_mut()
            .gzip()
            .map_err(|e| BadRequest(format!("gzip failed: {e}")))?;
        resp.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if params.flag("cl")? == Some(false) {
        resp.body_mut().hide_length();
    }
    Ok(resp)
}

fn apply_headers(resp: &mut Response<OriginBody>, params: &Params<'_>) -> Result<(), BadRequest> {
    if let Some(code) = params.u64("status", 999)? {
        *resp.status_mut() = u16::try_from(code)
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| BadRequest(format!("status={code} is not an HTTP status code")))?;
    }
    let headers = resp.headers_mut();
    for (knob, name) in &HEADER_KNOBS {
        let Some(raw) = params.get(knob) else {
            continue;
        };
        let value = match *knob {
            "etag" => quote_etag(raw),
            "lm" => http_date_or_raw(raw),
            _ => raw.to_string(),
        };
        headers.insert(name.clone(), header_value(knob, &value)?);
    }
    for cookie in params.all("set_cookie") {
        headers.append(header::SET_COOKIE, header_value("set_cookie", cookie)?);
    }
    // The first `h=` for a name replaces the handler's value, later ones
    // append, so `h=Via:a&h=Via:b` yields two Via lines.
    let mut replaced: Vec<HeaderName> = Vec::new();
    for raw in params.all("h") {
        let (name, value) = raw
            .split_once(':')
            .ok_or_else(|| BadRequest(format!("h={raw:?} is not Name:Value")))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| BadRequest(format!("h={raw:?}: invalid header name")))?;
        let value = header_value("h", value.trim())?;
        if replaced.contains(&name) {
            headers.append(name, value);
        } else {
            headers.insert(name.clone(), value);
            replaced.push(name);
        }
    }
    Ok(())
}

fn header_value(knob: &str, value: &str) -> Result<HeaderValue, BadRequest> {
    HeaderValue::from_str(value)
        .map_err(|_| BadRequest(format!("{knob}={value:?} is not a valid header value")))
}

/// `abc` becomes `"abc"`; already quoted or weak tags are kept as given.
fn quote_etag(raw: &str) -> String {
    if raw.starts_with('"') || raw.starts_with("W/") {
        raw.to_string()
    } else {
        format!("\"{raw}\"")
    }
}

/// Unix seconds become an HTTP date; anything else is sent as given.
fn http_date_or_raw(raw: &str) -> String {
    match raw.parse::<u64>() {
        Ok(secs) => httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs)),
        Err(_) => raw.to_string(),
    }
}

/// RFC 9110 section 13.2.2: If-None-Match wins over If-Modified-Since.
fn not_modified(req: &HeaderMap, resp: &HeaderMap) -> bool {
    if req.contains_key(header::IF_NONE_MATCH) {
        let Some(etag) = resp.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        return req
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|candidate| etag_matches_weakly(candidate.trim(), etag));
    }
    let date = |map: &HeaderMap, name| {
        map.get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
    };
    match (
        date(req, header::IF_MODIFIED_SINCE),
        date(resp, header::LAST_MODIFIED),
    ) {
        (Some(since), Some(modified)) => modified <= since,
        _ => false,
    }
}

/// Weak comparison (RFC 9110 section 8.8.3.2), plus `*`.
fn etag_matches_weakly(candidate: &str, etag: &str) -> bool {
    let strip = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_string();
    candidate == "*" || strip(candidate) == strip(etag)
}

/// The 304 keeps validators and caching headers but no body or content
/// description.
fn into_not_modified(resp: Response<OriginBody>) -> Response<OriginBody> {
    let (mut parts, _body) = resp.into_parts();
    parts.status = StatusCode::NOT_MODIFIED;
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
    ] {
        parts.headers.remove(name);
    }
    Response::from_parts(parts, OriginBody::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_quoted_unless_already_quoted_or_weak() {
        assert_eq!(quote_etag("v1"), "\"v1\"");
        assert_eq!(quote_etag("\"v1\""), "\"v1\"");
        assert_eq!(quote_etag("W/\"v1\""), "W/\"v1\"");
    }

    #[test]
    fn last_modified_accepts_unix_seconds() {
        assert_eq!(http_date_or_raw("0"), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date_or_raw("yesterday"), "yesterday");
    }

    #[test]
    fn if_none_match_lists_weak_tags_and_star() {
        let mut resp = HeaderMap::new();
        resp.insert(header::ETAG, HeaderValue::from_static("\"v2\""));
        let mut req = HeaderMap::new();
        req.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"v1\", W/\"v2\""),
        );
        assert!(not_modified(&req, &resp));
        req.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"v1\""));
        assert!(!not_modified(&req, &resp));
        req.insert(header::IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert!(not_modified(&req, &resp));
    }

    #[test]
    fn if_modified_since_compares_dates_and_yields_to_if_none_match() {
        let mut resp = HeaderMap::new();
        resp.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        let mut req = HeaderMap::new();
        req.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert!(not_modified(&req, &resp));
        req.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Sat, 05 Nov 1994 08:49:37 GMT"),
        );
        assert!(!not_modified(&req, &resp));
        req.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Mon, 07 Nov 1994 08:49:37 GMT"),
        );
        req.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"x\""));
        assert!(
            !not_modified(&req, &resp),
            "If-None-Match without an ETag never matches"
        );
    }
}

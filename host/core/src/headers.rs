//! Header rules every phase shares: hop-by-hop fields, `Via`, `X-Forwarded-For`.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The `Via` pseudonym Inlay adds to requests and responses.
pub const VIA: &str = "1.1 inlay";

/// Hop-by-hop fields (RFC 9110 section 7.6.1) that a proxy must not forward.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Remove hop-by-hop fields, including every field named in `Connection`.
/// `Upgrade` goes too: Inlay does not tunnel protocol upgrades.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Undo what a policy hook did to the framing of a message: the host alone
/// frames bodies. Hop-by-hop fields (`Connection`, `Transfer-Encoding`,
/// `Keep-Alive`, `Upgrade`...) the hook set are removed, and
/// `Content-Length` is put back to `length`, its value before the hook
/// (removed when there was none). A wrong length would truncate a body or
/// desynchronise the connection, and could be stored with the object.
pub fn restore_framing(headers: &mut HeaderMap, length: Option<HeaderValue>) {
    strip_hop_by_hop(headers);
    headers.remove(header::CONTENT_LENGTH);
    if let Some(length) = length {
        headers.insert(header::CONTENT_LENGTH, length);
    }
}

/// Append Inlay to the `Via` field.
pub fn add_via(headers: &mut HeaderMap) {
    headers.append(header::VIA, HeaderValue::from_static(VIA));
}

/// Append the client's address to `X-Forwarded-For`, as Varnish does.
pub fn add_forwarded_for(headers: &mut HeaderMap, client: IpAddr) {
    let name = HeaderName::from_static("x-forwarded-for");
    let joined = match headers.get(&name).and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => format!("{prev}, {client}"),
        _ => client.to_string(),
    };
    // An IP address and ASCII commas always make a valid value.
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_fields_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn framing_set_by_a_policy_is_undone() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        let before = h.get(header::CONTENT_LENGTH).cloned();
        // What a policy might set.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=1"));
        h.insert("x-policy", HeaderValue::from_static("kept"));
        restore_framing(&mut h, before);
        assert_eq!(h.get_all(header::CONTENT_LENGTH).iter().count(), 1);
        assert_eq!(h.get(header::CONTENT_LENGTH).unwrap(), "10");
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h.get("x-policy").unwrap(), "kept");
        // No length before: none after.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        restore_framing(&mut h, None);
        assert!(!h.contains_key(header::CONTENT_LENGTH));
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        add_forwarded_for(&mut h, "10.0.0.1".parse().unwrap());
        add_forwarded_for(&mut h, "::1".parse().unwrap());
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, ::1");
    }
}

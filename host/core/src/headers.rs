//! Header rules every phase shares: hop-by-hop fields, `Connection`
//! options, `Host`, `Via`, `X-Forwarded-For`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The `Via` pseudonym Inlay adds to requests and responses.
pub const VIA: &str = "1.1 inlay";

/// Hop-by-hop fields (RFC 9110 section 7.6.1) that a proxy must not forward.
/// (A static: a `const` array is a new array at each use, made and
/// dropped, here once per field of every message.)
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Request fields a `Connection` option may not name: the proxy reads
/// them before it removes the hop-by-hop fields (`Host`, the framing), or
/// the built-in rules decide with them (`Authorization` and `Cookie` make
/// a request a pass). RFC 9110 section 7.6.1 forbids naming end-to-end
/// fields; a client that does gets a 400 rather than a request whose
/// checks saw fields the backend and the cache key do not.
pub static CONNECTION_PROTECTED: [HeaderName; 5] = [
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::AUTHORIZATION,
    header::COOKIE,
];

/// The field names the `Connection` options of `headers` list (values
/// that are not text, and options that are not field names, are skipped).
pub fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = HeaderName> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
}

/// The first `Connection` option of `headers` that names a field in
/// `protected` (or in [`CONNECTION_PROTECTED`]).
pub fn protected_connection_option(
    headers: &HeaderMap,
    protected: &[&HeaderName],
) -> Option<HeaderName> {
    // Compared as text: no HeaderName is built for the options most
    // requests carry (`keep-alive`, `close`).
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|option| {
            let option = option.trim();
            CONNECTION_PROTECTED
                .iter()
                .chain(protected.iter().copied())
                .find(|name| option.eq_ignore_ascii_case(name.as_str()))
                .cloned()
        })
}

/// Remove hop-by-hop fields, including every field named in `Connection`.
/// `Upgrade` goes too: a request Inlay tunnels (a WebSocket) is found
/// before, and its tunnel sets the fields of the switch itself.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the message's few names (a known name compares as a
    // tag), then a hashed removal only for the fields it has: most
    // messages have none, or only `Connection`.
    let is_hop = |k: &HeaderName| *k == header::UPGRADE || HOP_BY_HOP.contains(k);
    if !headers.keys().any(is_hop) {
        return;
    }
    let mut named: Vec<HeaderName> = connection_options(headers).collect();
    named.extend(headers.keys().filter(|k| is_hop(k)).cloned());
    for name in &named {
        headers.remove(name);
    }
}

/// Remove every field of `names` from `headers`. The message's few names
/// are looked over first: one that has none of them (most) costs no
/// hashed removal.
pub fn remove_each(headers: &mut HeaderMap, names: &[HeaderName]) {
    if headers.keys().any(|k| names.contains(k)) {
        for name in names {
            headers.remove(name);
        }
    }
}

/// Whether `value` is a `Host` field value: `uri-host [ ":" port ]` (RFC
/// 9110 section 7.2, RFC 3986 section 3.2.2), that is a registered name
/// (letters, digits, `-._~`, the sub-delimiters `!$&'()*+,;=` and
/// `%HH` escapes), an IPv4 address or a bracketed IP literal, then an
/// optional port of digits. Userinfo (`u@host`), paths (`a/b`),
/// backslashes, spaces and anything else are not a host. An empty value
/// is (RFC 9112 section 3.2: a target without authority).
pub fn is_host(value: &[u8]) -> bool {
    let (host, port) = match value.first() {
        Some(b'[') => {
            let Some(end) = value.iter().position(|&b| b == b']') else {
                return false;
            };
            if !is_ip_literal(&value[1..end]) {
                return false;
            }
            match &value[end + 1..] {
                [] => return true,
                [b':', port @ ..] => (None, port),
                _ => return false,
            }
        }
        _ => match value.iter().position(|&b| b == b':') {
            Some(i) => (Some(&value[..i]), &value[i + 1..]),
            None => (Some(value), &[][..]),
        },
    };
    port.iter().all(u8::is_ascii_digit) && host.is_none_or(is_reg_name)
}

/// The host part of a `Host` value [`is_host`] accepts, without its port
/// and the brackets of an IP literal (`[::1]:80` is `::1`).
pub fn host_without_port(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    value.split(':').next().unwrap_or(value)
}

/// RFC 3986 `reg-name` (which includes `IPv4address`).
fn is_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        match name[i] {
            b'%' => {
                let escaped = name.get(i + 1..i + 3);
                if !escaped.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
            }
            b if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b) => i += 1,
            _ => return false,
        }
    }
    true
}

/// RFC 3986 `IP-literal` without its brackets: an IPv6 address, or
/// `IPvFuture` (`v` HEXDIG+ `.` then unreserved, sub-delimiters or `:`).
fn is_ip_literal(literal: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(literal) else {
        return false;
    };
    if text.parse::<Ipv6Addr>().is_ok() {
        return true;
    }
    let Some(future) = text.strip_prefix(['v', 'V']) else {
        return false;
    };
    let Some((version, rest)) = future.split_once('.') else {
        return false;
    };
    !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_hexdigit())
        && !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:".contains(&b))
}

/// Whether the host of a `Host` value [`is_host`] accepts is an IP
/// address (`127.0.0.1`, `[::1]`) rather than a name.
pub fn is_ip_host(value: &str) -> bool {
    let host = host_without_port(value);
    host.parse::<Ipv4Addr>().is_ok() || host.parse::<Ipv6Addr>().is_ok()
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

/// `X-Forwarded-For`.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `addr` in dotted decimal at the start of `buf`; its length. Written by
/// hand: `Display` for an address goes through the formatter's padding
/// machinery, octet by octet (as many instructions as the rest of the
/// field's handling).
fn write_ipv4(buf: &mut [u8; 48], addr: std::net::Ipv4Addr) -> usize {
    let mut n = 0;
    for (i, octet) in addr.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            buf[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            buf[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + octet % 10;
        n += 1;
    }
    n
}

/// Append the client's address to `X-Forwarded-For`, as Varnish does.
pub fn add_forwarded_for(headers: &mut HeaderMap, client: IpAddr) {
    use std::io::Write as _;
    // An address is at most 39 characters (IPv6): written on the stack.
    let mut buf = [0u8; 48];
    let n = match client {
        IpAddr::V4(v4) => write_ipv4(&mut buf, v4),
        IpAddr::V6(_) => {
            let mut at = std::io::Cursor::new(&mut buf[..]);
            let _ = write!(at, "{client}");
            usize::try_from(at.position()).unwrap_or(0)
        }
    };
    let addr = &buf[..n];
    let value = match headers.get(X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => {
            HeaderValue::from_bytes(&[prev.as_bytes(), b", ", addr].concat())
        }
        _ => HeaderValue::from_bytes(addr),
    };
    // Visible ASCII, an address and ", " always make a valid value.
    if let Ok(v) = value {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_addresses_are_written_as_display_writes_them() {
        for addr in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "255.255.255.255",
            "1.100.9.199",
        ] {
            let ip: std::net::Ipv4Addr = addr.parse().unwrap();
            let mut buf = [0u8; 48];
            let n = write_ipv4(&mut buf, ip);
            assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), ip.to_string());
        }
        let mut h = HeaderMap::new();
        add_forwarded_for(&mut h, "192.0.2.7".parse().unwrap());
        add_forwarded_for(&mut h, "2001:db8::1".parse().unwrap());
        assert_eq!(h[X_FORWARDED_FOR], "192.0.2.7, 2001:db8::1");
    }

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
    fn connection_options_naming_fields_the_proxy_relies_on_are_found() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONNECTION, HeaderValue::from_static(v));
            h
        };
        let id = HeaderName::from_static("x-request-id");
        for (value, found) in [
            ("keep-alive, host", Some("host")),
            ("Keep-Alive, HOST", Some("host")),
            ("cookie", Some("cookie")),
            ("close, authorization", Some("authorization")),
            ("content-length", Some("content-length")),
            ("transfer-encoding", Some("transfer-encoding")),
            ("x-request-id", Some("x-request-id")),
            ("keep-alive, te, x-private", None),
            ("close", None),
        ] {
            assert_eq!(
                protected_connection_option(&with(value), &[&id])
                    .as_ref()
                    .map(HeaderName::as_str),
                found,
                "{value}"
            );
        }
        assert_eq!(protected_connection_option(&HeaderMap::new(), &[&id]), None);
    }

    #[test]
    fn hosts_are_what_rfc_3986_allows() {
        for ok in [
            "example.com",
            "Example.COM:8080",
            "a-b_c~d.example",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:6082",
            "[2001:db8::1]:443",
            "[v1.fe80::a+en1]",
            "caf%C3%A9.example",
            "a!$&'()*+,;=b",
            "host:",
            "",
        ] {
            assert!(is_host(ok.as_bytes()), "{ok:?} refused");
        }
        for bad in [
            "u@a.example",
            "user:pass@a.example",
            "a/b",
            "a\\b",
            "a b",
            "a.example:80:80",
            "a.example:8o",
            "a.example/",
            "a?b",
            "a#b",
            "[::1",
            "[::1]x",
            "[not an address]",
            "[v.x]",
            "::1",
            "%zz.example",
            "a%2",
            "a\"b",
            "caf\u{e9}.example",
        ] {
            assert!(!is_host(bad.as_bytes()), "{bad:?} accepted");
        }
        assert_eq!(host_without_port("[::1]:80"), "::1");
        assert_eq!(host_without_port("localhost:80"), "localhost");
        assert!(is_ip_host("[::1]:80") && is_ip_host("10.0.0.1:6082"));
        assert!(!is_ip_host("localhost") && !is_ip_host("1.2.3.4.example"));
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

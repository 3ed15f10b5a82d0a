//! Invalidation by unsafe methods (RFC 9111 section 4.4): after a
//! non-error response to a request with an unsafe method (POST, PUT,
//! DELETE, PATCH and any unknown method), every stored variant of the
//! request's URL is removed, and of the URLs in `Location` and
//! `Content-Location` when they are on the same host (another host's
//! URLs are not ours to drop: a response could otherwise purge any site).
//!
//! Any client may send such a request, so with an origin that answers
//! `DELETE` or an unknown method with 2xx or 3xx any client can evict any
//! URL of its host, on this node: `cache.invalidate_on_unsafe = false`
//! turns it off (Varnish does not do it). Methods are case-sensitive (RFC
//! 9110 section 9.1): `Purge` is not `PURGE`, so it is not the purge route
//! and `cache.purge_allow` does not apply; it is an unknown method, passed
//! to the origin and, by this rule, unsafe like `DELETE`.

use http::{HeaderMap, Method, StatusCode, Uri, header};
use inlay_cache::{HttpCache, PrimaryKey};
use inlay_core::{RequestHead, path_and_query};
use tracing::{debug, warn};

/// Invalidate what a response to `head` makes stale, if its method is
/// unsafe and the status is not an error. Failures are logged: the
/// client's response does not depend on them.
pub async fn after_unsafe(
    cache: &HttpCache,
    head: &RequestHead,
    status: StatusCode,
    resp_headers: &HeaderMap,
) {
    if is_safe(&head.method) || !(status.is_success() || status.is_redirection()) {
        return;
    }
    let mut keys = vec![PrimaryKey::of(head)];
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let Some(target) = resp_headers.get(&name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        if let Some(path) = same_host_path(head, target) {
            keys.push(PrimaryKey::new(head.host(), &path, &head.cache_key_extra));
        }
    }
    keys.dedup_by(|a, b| a.as_str() == b.as_str());
    // This cache's own consequence of a write it forwarded: not sent to
    // the cluster (every POST would be a message to every node).
    for key in &keys {
        match cache.purge_url_local(key, false).await {
            Ok(n) => debug!(method = %head.method, key = key.as_str(), removed = n, "invalidated"),
            Err(e) => warn!(error = %e, key = key.as_str(), "invalidation failed"),
        }
    }
}

/// GET, HEAD, OPTIONS and TRACE are safe (RFC 9110 section 9.2.1); every
/// other method, known or not, is treated as unsafe.
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// The path and query `target` (a `Location` or `Content-Location` value)
/// names on the request's own host, resolved against the request's path;
/// `None` for another host or what is not a URI reference.
fn same_host_path(head: &RequestHead, target: &str) -> Option<String> {
    let target = target.trim();
    if target.starts_with("//") {
        // A network-path reference names a host: ours only if it is ours.
        let uri: Uri = format!("http:{target}").parse().ok()?;
        return same_host(head, &uri);
    }
    if target.starts_with('/') {
        let uri: Uri = target.parse().ok()?;
        return Some(path_and_query(&uri).to_owned());
    }
    let first_segment = target.split(['/', '?', '#']).next().unwrap_or_default();
    if first_segment.contains(':') {
        // Absolute (`http://host/path`; `mailto:` and the like name no URL of ours).
        let uri: Uri = target.parse().ok()?;
        let web = uri
            .scheme_str()
            .is_some_and(|s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"));
        return if web { same_host(head, &uri) } else { None };
    }
    if target.is_empty() {
        return None;
    }
    // A relative reference: beside the request's last path segment.
    let base = head.uri.path();
    let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
    let joined = format!("{}{target}", if dir.is_empty() { "/" } else { dir });
    let uri: Uri = joined.parse().ok()?;
    Some(path_and_query(&uri).to_owned())
}

fn same_host(head: &RequestHead, uri: &Uri) -> Option<String> {
    let authority = uri.authority()?;
    authority
        .as_str()
        .eq_ignore_ascii_case(head.host())
        .then(|| path_and_query(uri).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, uri: &str) -> RequestHead {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "example.com".parse().unwrap());
        RequestHead {
            method: method.parse().unwrap(),
            uri: uri.parse().unwrap(),
            headers,
            client_ip: [127, 0, 0, 1].into(),
            backend: "default".into(),
            cache_key_extra: Vec::new(),
        }
    }

    #[test]
    fn only_same_host_targets_are_resolved() {
        let h = head("POST", "/a/b?x=1");
        let p = |t: &str| same_host_path(&h, t);
        assert_eq!(p("/c?d").as_deref(), Some("/c?d"));
        assert_eq!(p("http://example.com/c").as_deref(), Some("/c"));
        assert_eq!(p("HTTPS://EXAMPLE.COM/c").as_deref(), Some("/c"));
        assert_eq!(p("c").as_deref(), Some("/a/c"));
        assert_eq!(p("http://other.example/c"), None);
        assert_eq!(p("//other.example/c"), None);
        assert_eq!(p("http://example.com:8080/c"), None);
        assert_eq!(p("ftp://example.com/c"), None);
        assert_eq!(p("mailto:a@example.com"), None);
        assert_eq!(p("not a uri"), None);
        assert_eq!(p(""), None);
    }

    #[test]
    fn unknown_methods_are_unsafe() {
        for m in ["POST", "PUT", "DELETE", "PATCH", "M-SEARCH"] {
            assert!(!is_safe(&m.parse().unwrap()), "{m}");
        }
        for m in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            assert!(is_safe(&m.parse().unwrap()), "{m}");
        }
    }
}

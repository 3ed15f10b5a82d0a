//! The heads of a request and a response as they pass through the phases.
//! Bodies travel separately (see [`crate::body`]).

use std::net::{IpAddr, Ipv4Addr};

use http::{HeaderMap, Method, StatusCode, Uri, header};

/// The client's request as the phases and the policy see and edit it.
#[derive(Clone, Debug)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// Path and query only (recv removes any scheme and authority; the
    /// authority is in the `Host` header).
    pub uri: Uri,
    /// Header fields.
    pub headers: HeaderMap,
    /// The client's address.
    pub client_ip: IpAddr,
    /// The configured backend the request goes to.
    pub backend: String,
    /// Data the policy added to the cache key (`add-to-cache-key`), in order.
    pub cache_key_extra: Vec<String>,
}

impl Default for RequestHead {
    /// An empty `GET /`; also what is left in the caller's place while a
    /// hook holds the real head.
    fn default() -> Self {
        Self {
            method: Method::GET,
            uri: Uri::from_static("/"),
            headers: HeaderMap::new(),
            client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            backend: String::new(),
            cache_key_extra: Vec::new(),
        }
    }
}

impl RequestHead {
    /// The path and query, `/` when the URI has none.
    pub fn path_and_query(&self) -> &str {
        path_and_query(&self.uri)
    }

    /// The `Host` header, empty when absent or not text.
    pub fn host(&self) -> &str {
        self.headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
    }

    /// Varnish's built-in `vcl_recv` decision: look up a `GET` or `HEAD`
    /// without `Authorization` or `Cookie` (they may be personal); pass
    /// the rest. The host's own rules without a policy, a policy hook left
    /// to its default, and the SDKs' `builtin` recv all decide this way.
    pub fn builtin_lookup(&self) -> bool {
        (self.method == Method::GET || self.method == Method::HEAD)
            && !self.headers.contains_key(header::AUTHORIZATION)
            && !self.headers.contains_key(header::COOKIE)
    }
}

/// The path and query of a URI, `/` when it has none.
pub fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |pq| pq.as_str())
}

/// A response's status and headers as the phases and the policy see them.
#[derive(Clone, Debug, Default)]
pub struct ResponseHead {
    /// The status code.
    pub status: StatusCode,
    /// Header fields.
    pub headers: HeaderMap,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_query_ignores_scheme_and_authority() {
        let absolute: Uri = "http://example.com/x?y".parse().expect("valid");
        assert_eq!(path_and_query(&absolute), "/x?y");
        let head = RequestHead::default();
        assert_eq!(head.path_and_query(), "/");
        assert_eq!(head.host(), "");
    }
}

//! Varnish's built-in behaviour, which the [`Policy`](crate::Policy) hooks
//! use by default. Call these from your own hooks to keep the built-in
//! rules for the cases you do not handle.
//!
//! ```
//! use inlay_policy::{builtin, Action, Request};
//!
//! assert_eq!(builtin::recv(&Request::new_local("GET", "/")), Action::Lookup);
//! assert_eq!(builtin::recv(&Request::new_local("POST", "/")), Action::Pass);
//! let with_cookie = Request::builder().header("cookie", "s=1").build();
//! assert_eq!(builtin::recv(&with_cookie), Action::Pass);
//! ```

use crate::{Action, CacheSettings, Request, Response};

/// Built-in recv: [`Action::Pass`] for methods other than `GET` and `HEAD`
/// and for requests with `Authorization` or `Cookie` (they may be
/// personal); otherwise [`Action::Lookup`]. The host decides it in one
/// call (the same rules as [`is_lookup_method`] and [`has_credentials`]).
pub fn recv(req: &Request) -> Action {
    if req.builtin_lookup() {
        Action::Lookup
    } else {
        Action::Pass
    }
}

/// Whether the built-in recv looks this method up in the cache (`GET` and
/// `HEAD`; methods are case-sensitive).
pub fn is_lookup_method(method: &str) -> bool {
    method == "GET" || method == "HEAD"
}

/// Whether the request carries an `Authorization` or `Cookie` header.
pub fn has_credentials(req: &Request) -> bool {
    req.header("authorization").is_some() || req.header("cookie").is_some()
}

/// Built-in backend response: keep the host's settings. The host has
/// already applied RFC 9111 and `Surrogate-Control` (no store for
/// `Set-Cookie`, `private`, `no-store`, `Vary: *`) when it filled them.
pub fn backend_response(
    _req: &Request,
    _resp: &Response,
    settings: CacheSettings,
) -> CacheSettings {
    settings
}

/// Built-in deliver: change nothing.
pub fn deliver(_req: &Request, _resp: &Response) {}

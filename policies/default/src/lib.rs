//! The built-in behaviour of Varnish: pass methods other than GET and HEAD
//! and requests with `Authorization`; pass requests with cookies unless the
//! policy config says `cache_cookies = "true"`; otherwise look up.

use inlay_policy::{Action, Policy, Request, builtin, config};

/// The default policy; reads `cache_cookies` once per instance.
pub struct BuiltinPolicy {
    /// Cache requests even when they carry a `Cookie` header.
    cache_cookies: bool,
}

impl Default for BuiltinPolicy {
    fn default() -> Self {
        BuiltinPolicy {
            cache_cookies: config::flag("cache_cookies"),
        }
    }
}

impl Policy for BuiltinPolicy {
    fn on_request(&self, req: &Request) -> Action {
        if self.cache_cookies
            && builtin::is_lookup_method(&req.method())
            && req.header("authorization").is_none()
        {
            return Action::Lookup;
        }
        builtin::recv(req)
    }
}

inlay_policy::export!(BuiltinPolicy);

#[cfg(test)]
mod tests {
    use inlay_policy::{Action, Policy, Request, testing};

    fn policy() -> super::BuiltinPolicy {
        super::BuiltinPolicy::default()
    }

    #[test]
    fn get_and_head_without_credentials_are_looked_up() {
        for method in ["GET", "HEAD"] {
            assert_eq!(
                policy().on_request(&Request::new_local(method, "/")),
                Action::Lookup
            );
        }
    }

    #[test]
    fn other_methods_pass() {
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get"] {
            assert_eq!(
                policy().on_request(&Request::new_local(method, "/")),
                Action::Pass,
                "{method}"
            );
        }
    }

    #[test]
    fn authorization_and_cookies_pass_by_default() {
        let auth = Request::builder()
            .header("Authorization", "Bearer x")
            .build();
        assert_eq!(policy().on_request(&auth), Action::Pass);
        let cookie = Request::builder().header("Cookie", "session=1").build();
        assert_eq!(policy().on_request(&cookie), Action::Pass);
    }

    #[test]
    fn cache_cookies_caches_cookie_requests_but_not_authorization() {
        testing::set_config("cache_cookies", "true");
        let policy = policy();
        let cookie = Request::builder().header("Cookie", "session=1").build();
        assert_eq!(policy.on_request(&cookie), Action::Lookup);
        let both = Request::builder()
            .header("Cookie", "session=1")
            .header("Authorization", "Basic eA==")
            .build();
        assert_eq!(policy.on_request(&both), Action::Pass);
        let post = Request::builder()
            .method("POST")
            .header("Cookie", "a=1")
            .build();
        assert_eq!(policy.on_request(&post), Action::Pass);
    }
}

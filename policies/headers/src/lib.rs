//! Header hygiene: strips tracking query parameters (`utm_*`, `fbclid`,
//! `gclid`) before the cache lookup, so they do not split the cache or
//! reach the origin; on delivery removes `Server` and `X-Powered-By` and
//! adds `x-inlay-policy: headers`.

use std::borrow::Cow;

use inlay_policy::{Action, Policy, Request, Response, builtin, log};

/// The header-hygiene policy.
#[derive(Default)]
pub struct Headers;

/// Whether a query parameter name is a tracking parameter (ASCII case is
/// ignored: some campaign tools upper-case them).
fn is_tracking(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("utm_") || lower == "fbclid" || lower == "gclid"
}

/// The name part of a `name=value` query parameter.
fn param_name(param: &str) -> &str {
    param.split_once('=').map_or(param, |(name, _)| name)
}

/// `url` without tracking query parameters; the other parameters keep their
/// order and exact text. The `?` goes when no parameter is left.
pub fn strip_tracking_params(url: &str) -> Cow<'_, str> {
    let Some((path, query)) = url.split_once('?') else {
        return Cow::Borrowed(url);
    };
    if !query.split('&').any(|param| is_tracking(param_name(param))) {
        return Cow::Borrowed(url);
    }
    let kept: Vec<&str> = query
        .split('&')
        .filter(|param| !param.is_empty() && !is_tracking(param_name(param)))
        .collect();
    if kept.is_empty() {
        Cow::Owned(path.to_owned())
    } else {
        Cow::Owned(format!("{path}?{}", kept.join("&")))
    }
}

impl Policy for Headers {
    fn on_request(&self, req: &Request) -> Action {
        let url = req.url();
        if let Cow::Owned(clean) = strip_tracking_params(&url)
            && let Err(err) = req.set_url(&clean)
        {
            // The cleaned URL is a sub-string of a valid one, so this is not
            // expected; the original URL stays.
            log::warn(format_args!("could not strip tracking parameters: {err}"));
        }
        builtin::recv(req)
    }

    fn on_deliver(&self, _req: &Request, resp: &Response) {
        resp.remove_header("server");
        resp.remove_header("x-powered-by");
        if let Err(err) = resp.set_header("x-inlay-policy", "headers") {
            log::warn(format_args!("could not set x-inlay-policy: {err}"));
        }
    }
}

inlay_policy::export!(Headers);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracking_params_are_removed_and_others_keep_order() {
        assert_eq!(
            strip_tracking_params("/p?b=2&utm_source=x&a=1&fbclid=y&UTM_Medium=z&gclid=q&c"),
            "/p?b=2&a=1&c"
        );
        assert_eq!(strip_tracking_params("/p?utm_source=x&gclid=1"), "/p");
        assert_eq!(strip_tracking_params("/p?utm_campaign"), "/p");
    }

    #[test]
    fn urls_without_tracking_are_borrowed_unchanged() {
        for url in ["/", "/p?", "/p?a=1&&b=2", "/p?utm=1&fbclidx=2&xgclid=3"] {
            assert!(
                matches!(strip_tracking_params(url), Cow::Borrowed(u) if u == url),
                "{url}"
            );
        }
    }

    #[test]
    fn on_request_rewrites_the_url_then_applies_builtin_rules() {
        let req = Request::new_local("GET", "/a?utm_source=news&id=3");
        assert_eq!(Headers.on_request(&req), Action::Lookup);
        assert_eq!(req.url(), "/a?id=3");

        let post = Request::new_local("POST", "/a?fbclid=1");
        assert_eq!(Headers.on_request(&post), Action::Pass);
        assert_eq!(post.url(), "/a");
    }

    #[test]
    fn on_deliver_hides_server_details_and_marks_the_response() {
        let req = Request::new_local("GET", "/");
        let resp = Response::builder()
            .header("Server", "nginx/1.25")
            .header("X-Powered-By", "PHP/8")
            .header("Content-Type", "text/html")
            .build();
        Headers.on_deliver(&req, &resp);
        assert_eq!(resp.header("server"), None);
        assert_eq!(resp.header("x-powered-by"), None);
        assert_eq!(resp.header("content-type").as_deref(), Some("text/html"));
        assert_eq!(resp.header("x-inlay-policy").as_deref(), Some("headers"));
    }
}

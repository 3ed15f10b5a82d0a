//! A sticky A/B test that still caches.
//!
//! The bucket comes from the cookie `inlay_ab` (`a` or `b`). A client
//! without a valid cookie gets a bucket derived from a hash of its IP and
//! `User-Agent` (stable, so it does not flip if cookies are refused), and
//! the cookie is set on delivery. The origin sees the bucket as the request
//! header `x-ab-bucket`, and the bucket is added to the cache key, so each
//! URL is cached once per bucket. The `inlay_ab` cookie itself is removed
//! from the request: it neither reaches the origin nor makes the request
//! pass; any other cookie still passes, as in the built-in rules.

use inlay_policy::{Action, Policy, Request, Response, builtin, log};

/// The cookie holding the bucket.
pub const COOKIE: &str = "inlay_ab";
/// The request header the origin reads the bucket from.
pub const BUCKET_HEADER: &str = "x-ab-bucket";
/// Request header marking a bucket assigned by this request (no valid
/// cookie came in), so `on_deliver` knows to set the cookie.
pub const NEW_BUCKET_HEADER: &str = "x-ab-new";
/// How long the cookie lives: 30 days.
const COOKIE_MAX_AGE: u32 = 30 * 24 * 3600;

/// The A/B test policy.
#[derive(Default)]
pub struct AbTest;

/// The bucket for a client without a cookie: FNV-1a of IP and user agent,
/// even hashes go to `a`.
pub fn assign_bucket(client_ip: &str, user_agent: &str) -> &'static str {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in client_ip.bytes().chain([0]).chain(user_agent.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    if hash.is_multiple_of(2) { "a" } else { "b" }
}

impl Policy for AbTest {
    fn on_request(&self, req: &Request) -> Action {
        // Only this policy may set the marker, never the client.
        req.remove_header(NEW_BUCKET_HEADER);
        let bucket = match req.cookie(COOKIE).as_deref() {
            Some("a") => "a",
            Some("b") => "b",
            _ => {
                let bucket = assign_bucket(
                    &req.client_ip(),
                    req.header("user-agent").as_deref().unwrap_or(""),
                );
                set(req, NEW_BUCKET_HEADER, "1");
                bucket
            }
        };
        req.remove_cookie(COOKIE);
        set(req, BUCKET_HEADER, bucket);
        req.add_to_cache_key(&format!("ab={bucket}"));
        builtin::recv(req)
    }

    fn on_deliver(&self, req: &Request, resp: &Response) {
        if req.header(NEW_BUCKET_HEADER).is_none() {
            return;
        }
        let Some(bucket) = req.header(BUCKET_HEADER) else {
            return;
        };
        let cookie = format!("{COOKIE}={bucket}; Path=/; Max-Age={COOKIE_MAX_AGE}; SameSite=Lax");
        if let Err(err) = resp.append_header("set-cookie", &cookie) {
            log::warn(format_args!("could not set the A/B cookie: {err}"));
        }
    }
}

/// Set a request header whose value we built; log if the host refuses it.
fn set(req: &Request, name: &str, value: &str) {
    if let Err(err) = req.set_header(name, value) {
        log::warn(format_args!("could not set {name}: {err}"));
    }
}

inlay_policy::export!(AbTest);

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cookie: Option<&str>, ip: &str, ua: &str) -> Request {
        let mut builder = Request::builder().client_ip(ip).header("user-agent", ua);
        if let Some(cookie) = cookie {
            builder = builder.header("cookie", cookie);
        }
        builder.build()
    }

    #[test]
    fn cookie_bucket_is_kept_cached_and_sent_to_origin() {
        for bucket in ["a", "b"] {
            let req = request(Some(&format!("inlay_ab={bucket}")), "192.0.2.1", "ua");
            assert_eq!(
                AbTest.on_request(&req),
                Action::Lookup,
                "only the A/B cookie: cached"
            );
            assert_eq!(req.header(BUCKET_HEADER).as_deref(), Some(bucket));
            assert_eq!(req.cache_key_data(), [format!("ab={bucket}")]);
            assert_eq!(
                req.header("cookie"),
                None,
                "the A/B cookie does not reach the origin"
            );
            let resp = Response::new_local(200);
            AbTest.on_deliver(&req, &resp);
            assert_eq!(
                resp.header("set-cookie"),
                None,
                "a valid cookie is not set again"
            );
        }
    }

    #[test]
    fn other_cookies_still_pass() {
        let req = request(Some("session=xyz; inlay_ab=b"), "192.0.2.1", "ua");
        assert_eq!(AbTest.on_request(&req), Action::Pass);
        assert_eq!(req.header("cookie").as_deref(), Some("session=xyz"));
        assert_eq!(req.header(BUCKET_HEADER).as_deref(), Some("b"));
    }

    #[test]
    fn new_client_gets_a_stable_bucket_and_a_cookie() {
        let req = request(None, "198.51.100.7", "Firefox");
        assert_eq!(AbTest.on_request(&req), Action::Lookup);
        let bucket = req.header(BUCKET_HEADER).expect("bucket header");
        assert_eq!(bucket, assign_bucket("198.51.100.7", "Firefox"));
        let resp = Response::new_local(200);
        AbTest.on_deliver(&req, &resp);
        assert_eq!(
            resp.header("set-cookie"),
            Some(format!(
                "inlay_ab={bucket}; Path=/; Max-Age=2592000; SameSite=Lax"
            ))
        );
    }

    #[test]
    fn client_cannot_fake_the_new_bucket_marker() {
        let req = Request::builder()
            .header("cookie", "inlay_ab=a")
            .header(NEW_BUCKET_HEADER, "1")
            .build();
        AbTest.on_request(&req);
        let resp = Response::new_local(200);
        AbTest.on_deliver(&req, &resp);
        assert_eq!(resp.header("set-cookie"), None);
    }

    #[test]
    fn invalid_cookie_value_is_replaced() {
        let req = request(Some("inlay_ab=zzz"), "192.0.2.9", "ua");
        AbTest.on_request(&req);
        let resp = Response::new_local(200);
        AbTest.on_deliver(&req, &resp);
        assert!(resp.header("set-cookie").is_some());
    }

    #[test]
    fn assignment_spreads_over_both_buckets() {
        let a = (0..200)
            .filter(|i| assign_bucket(&format!("10.0.0.{i}"), "ua") == "a")
            .count();
        assert!((60..=140).contains(&a), "{a} of 200 in bucket a");
    }
}

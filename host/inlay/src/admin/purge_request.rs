//! The body of `POST /purge`: what to purge, checked as a client's PURGE
//! request would be (the URL normalised by recv, surrogate keys as words of
//! a header field).

use std::net::SocketAddr;

use http::{HeaderValue, Request, header};
use inlay_cache::PrimaryKey;
use serde::Deserialize;

use crate::pipeline::PurgeTarget;

/// Most surrogate keys one purge may name.
const MAX_PURGE_KEYS: usize = 1000;
/// Longest surrogate key or URL accepted.
const MAX_KEY_LEN: usize = 1024;
const MAX_URL_LEN: usize = 8192;

/// The body of `POST /purge`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PurgeRequest {
    /// `http://host/path?query`, or `/path?query` with `host`.
    url: Option<String>,
    host: Option<String>,
    surrogate_keys: Option<Vec<String>>,
    #[serde(default)]
    pub(super) soft: bool,
}

impl PurgeRequest {
    /// What to purge, and how the answer names it (`url HOST/PATH`, `keys A B`).
    pub(super) fn target(&self) -> Result<(PurgeTarget, String), String> {
        match (&self.url, &self.surrogate_keys) {
            (Some(url), None) => self.url_target(url),
            (None, Some(keys)) => {
                if self.host.is_some() {
                    return Err("\"host\" goes with \"url\", not with surrogate keys".into());
                }
                if keys.is_empty() || keys.len() > MAX_PURGE_KEYS {
                    return Err(format!("give 1 to {MAX_PURGE_KEYS} surrogate keys"));
                }
                for k in keys {
                    // Keys are words of a header field (Surrogate-Key: a b).
                    if k.is_empty()
                        || k.len() > MAX_KEY_LEN
                        || !k.bytes().all(|b| (0x21..=0x7e).contains(&b))
                    {
                        return Err(format!(
                            "surrogate keys are words of visible ASCII, 1 to {MAX_KEY_LEN} bytes: {:?}",
                            truncated(k)
                        ));
                    }
                }
                Ok((
                    PurgeTarget::Keys(keys.clone()),
                    format!("keys {}", keys.join(" ")),
                ))
            }
            _ => Err("give either \"url\" or \"surrogate_keys\"".into()),
        }
    }

    /// The key the public `PURGE` method computes for this URL: the
    /// request goes through the same normalisation as a client's.
    fn url_target(&self, url: &str) -> Result<(PurgeTarget, String), String> {
        if url.len() > MAX_URL_LEN {
            return Err(format!("the URL is longer than {MAX_URL_LEN} bytes"));
        }
        let uri: http::Uri = url
            .parse()
            .map_err(|_| format!("not a URL: {:?}", truncated(url)))?;
        let mut req = Request::builder().method("PURGE");
        match (uri.authority(), &self.host) {
            (Some(_), Some(_)) => {
                return Err("give the host in the URL or in \"host\", not both".into());
            }
            (Some(_), None) => {
                if !matches!(uri.scheme_str(), Some("http" | "https")) {
                    return Err(format!("not an http URL: {:?}", truncated(url)));
                }
            }
            (None, Some(host)) => {
                let host = HeaderValue::from_str(host)
                    .map_err(|_| format!("not a host name: {:?}", truncated(host)))?;
                req = req.header(header::HOST, host);
            }
            (None, None) => return Err("a path needs \"host\" (or give a full URL)".into()),
        }
        let (parts, ()) = req
            .uri(uri)
            .body(())
            .map_err(|e| format!("bad URL: {e}"))?
            .into_parts();
        let peer = SocketAddr::from(([127, 0, 0, 1], 0));
        let head = crate::pipeline::recv::normalise(parts, peer, "")
            .map_err(|e| format!("{e} in {:?}", truncated(url)))?;
        let shown = format!("url {}{}", head.host(), head.path_and_query());
        Ok((PurgeTarget::Url(PrimaryKey::of(&head)), shown))
    }
}

/// At most 100 characters of client text, for error messages.
pub(super) fn truncated(s: &str) -> String {
    s.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn target(v: Value) -> Result<PurgeTarget, String> {
        let (target, _) = serde_json::from_value::<PurgeRequest>(v)
            .map_err(|e| e.to_string())?
            .target()?;
        Ok(target)
    }

    #[test]
    fn a_purge_url_has_the_key_of_the_request_a_client_sends() {
        let client_head = || {
            let (parts, ()) = Request::builder()
                .uri("/a/b?x=1")
                .header("host", "WWW.Example.com")
                .body(())
                .unwrap()
                .into_parts();
            crate::pipeline::recv::normalise(parts, SocketAddr::from(([1, 2, 3, 4], 5)), "d")
                .unwrap()
        };
        let want = PrimaryKey::of(&client_head());
        for v in [
            json!({ "url": "http://WWW.Example.com/a/b?x=1" }),
            json!({ "url": "/a/b?x=1", "host": "www.example.com" }),
        ] {
            let Ok(PurgeTarget::Url(key)) = target(v.clone()) else {
                panic!("{v} refused")
            };
            assert_eq!(key, want, "{v}");
        }
    }

    #[test]
    fn bad_purge_requests_are_refused_with_a_reason() {
        for v in [
            json!({}),
            json!({ "url": "/a" }),
            json!({ "url": "http://h/a", "host": "h" }),
            json!({ "url": "ftp://h/a" }),
            json!({ "url": "/a", "host": "bad host" }),
            json!({ "url": "/a", "host": "u@h" }),
            json!({ "url": "/a", "host": "h/x" }),
            json!({ "url": "http://u@h/a" }),
            json!({ "url": "not a url" }),
            json!({ "url": "/a", "surrogate_keys": ["k"], "host": "h" }),
            json!({ "surrogate_keys": [] }),
            json!({ "surrogate_keys": ["a b"] }),
            json!({ "surrogate_keys": [""] }),
            json!({ "surrogate_keys": ["k"], "host": "h" }),
            json!({ "surrogate_keys": vec!["k"; MAX_PURGE_KEYS + 1] }),
            json!({ "url": format!("/{}", "a".repeat(MAX_URL_LEN)), "host": "h" }),
            json!({ "url": "/a", "host": "h", "extra": 1 }),
            json!({ "url": 5 }),
        ] {
            assert!(target(v.clone()).is_err(), "{v} accepted");
        }
    }
}

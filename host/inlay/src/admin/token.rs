//! What the admin API keeps between requests: whether the proxy is ready
//! for traffic, and the bearer token it asks for.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::Context as _;
use http::{HeaderMap, header};
use subtle::ConstantTimeEq;

/// Whether the proxy should get traffic: starting (the cache is not open
/// yet), ready, or stopping (a shutdown signal came; the drain runs).
/// Clones share one state.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicU8>);

const STARTING: u8 = 0;
const READY: u8 = 1;
const STOPPING: u8 = 2;

impl Readiness {
    /// A process that is starting: not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cache is open and the policy loaded. Has no effect once stopping.
    pub fn set_ready(&self) {
        let _ = self
            .0
            .compare_exchange(STARTING, READY, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// A shutdown signal came: load balancers must stop sending. Final.
    pub fn set_stopping(&self) {
        self.0.store(STOPPING, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst) == READY
    }

    /// `"starting"`, `"ready"` or `"stopping"`.
    pub fn state(&self) -> &'static str {
        match self.0.load(Ordering::SeqCst) {
            STARTING => "starting",
            READY => "ready",
            _ => "stopping",
        }
    }
}

/// The admin API's bearer token (`admin.token_file`).
#[derive(Clone)]
pub struct AdminToken(Arc<[u8]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// Read the token from `path`: its text without the trailing newline.
    /// An empty file, or one that is not a single word of visible ASCII
    /// (a header cannot carry anything else), is an error.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::new(&text).map_err(|m| anyhow::anyhow!("{}: {m}", path.display()))
    }

    /// The token from its bytes; a trailing newline (`\n` or `\r\n`) is dropped.
    pub fn new(text: &[u8]) -> Result<Self, String> {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.is_empty() {
            return Err("the token is empty".into());
        }
        if !text.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err("the token must be one word of visible ASCII".into());
        }
        Ok(Self(text.into()))
    }

    /// The token, for a client's `Authorization` header.
    pub fn secret(&self) -> &[u8] {
        &self.0
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`; the
    /// token is compared in constant time.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(v) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let v = v.as_bytes();
        let Some((scheme, given)) = v.split_at_checked(7) else {
            return false;
        };
        scheme.eq_ignore_ascii_case(b"bearer ") && bool::from(given.trim_ascii().ct_eq(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn with_auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn the_token_is_read_without_its_newline_and_checked_exactly() {
        let t = AdminToken::new(b"s3cret\n").unwrap();
        assert!(t.admits(&with_auth("Bearer s3cret")));
        assert!(t.admits(&with_auth("bearer s3cret")));
        assert!(!t.admits(&with_auth("Bearer s3cre")));
        assert!(!t.admits(&with_auth("Bearer s3cret2")));
        assert!(!t.admits(&with_auth("Basic s3cret")));
        assert!(!t.admits(&with_auth("s3cret")));
        assert!(!t.admits(&HeaderMap::new()));
        assert!(
            AdminToken::new(b"tok\r\n")
                .unwrap()
                .admits(&with_auth("Bearer tok"))
        );
        assert!(AdminToken::new(b"\n").is_err());
        assert!(AdminToken::new(b"").is_err());
        assert!(AdminToken::new(b"two words").is_err());
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn readiness_goes_ready_then_stopping_and_never_back() {
        let r = Readiness::new();
        assert!(!r.is_ready());
        assert_eq!(r.state(), "starting");
        r.set_ready();
        assert!(r.is_ready());
        r.set_stopping();
        r.set_ready();
        assert!(!r.is_ready());
        assert_eq!(r.state(), "stopping");
    }
}

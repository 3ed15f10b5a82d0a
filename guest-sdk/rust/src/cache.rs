//! The host's HTTP cache: look objects up, insert them, purge by URL or by
//! surrogate key.
//!
//! ```
//! use inlay_policy::cache::{self, NewObject};
//!
//! # fn main() -> Result<(), cache::CacheError> {
//! let obj = NewObject::new(200, "hello").ttl(60).surrogate_key("greeting");
//! cache::insert("example.com", "/hello", &obj)?;
//! let hit = cache::lookup("example.com", "/hello")?.expect("fresh");
//! assert_eq!(hit.body, b"hello");
//! assert_eq!(cache::purge_key("greeting", false)?, 1);
//! assert!(cache::lookup("example.com", "/hello")?.is_none());
//! # Ok(())
//! # }
//! ```

use crate::Headers;

/// A cached object as seen by a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedObject {
    /// Status code.
    pub status: u16,
    /// Stored header fields.
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
    /// Seconds since it was stored.
    pub age: u32,
    /// Seconds of freshness left (0 when stale).
    pub ttl_left: u32,
}

/// An object to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewObject {
    /// Status code.
    pub status: u16,
    /// Header fields.
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
    /// Seconds fresh.
    pub ttl: u32,
    /// Seconds of grace after expiry.
    pub grace: u32,
    /// Surrogate keys.
    pub surrogate_keys: Vec<String>,
}

impl NewObject {
    /// An object with this status and body, no headers, 0 ttl and grace.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        NewObject {
            status,
            headers: Vec::new(),
            body: body.into(),
            ttl: 0,
            grace: 0,
            surrogate_keys: Vec::new(),
        }
    }

    /// Add a header field (the name is lower-cased).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }

    /// Seconds fresh.
    pub fn ttl(mut self, ttl: u32) -> Self {
        self.ttl = ttl;
        self
    }

    /// Seconds of grace after expiry.
    pub fn grace(mut self, grace: u32) -> Self {
        self.grace = grace;
        self
    }

    /// Add a surrogate key.
    pub fn surrogate_key(mut self, key: &str) -> Self {
        self.surrogate_keys.push(key.to_owned());
        self
    }
}

/// Why a cache call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// The storage refused the write (full, I/O error).
    #[error("cache storage error: {0}")]
    Storage(String),
    /// The arguments were invalid (empty key, bad URL).
    #[error("invalid cache call: {0}")]
    Invalid(String),
    /// The per-request cap on host calls was reached.
    #[error("per-request host call limit reached")]
    LimitExceeded,
}

/// Look up an object by host and path+query. Only fresh or in-grace
/// objects are returned.
pub fn lookup(host: &str, url: &str) -> Result<Option<CachedObject>, CacheError> {
    crate::sys::cache_lookup(host, url)
}

/// Insert or replace an object under host and path+query.
pub fn insert(host: &str, url: &str, obj: &NewObject) -> Result<(), CacheError> {
    crate::sys::cache_insert(host, url, obj)
}

/// Purge one URL (all its variants). `soft` marks it stale instead of
/// removing it. Returns how many objects were affected.
pub fn purge_url(host: &str, url: &str, soft: bool) -> Result<u32, CacheError> {
    crate::sys::cache_purge_url(host, url, soft)
}

/// Purge every object tagged with a surrogate key; `soft` as in
/// [`purge_url`]. Returns how many objects were affected.
pub fn purge_key(key: &str, soft: bool) -> Result<u32, CacheError> {
    crate::sys::cache_purge_key(key, soft)
}

//! `[cache]`: the object store's sizes and the caching defaults.

use std::path::PathBuf;
use std::time::Duration;

use super::read::{IpNet, Reader, Table};

/// `[cache]`.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Directory of the persistent (sled) tier; none means memory only.
    pub dir: Option<PathBuf>,
    /// Bound of the memory tier, bytes.
    pub memory_size: u64,
    /// Bound of the disk tier, bytes.
    pub disk_size: u64,
    /// sled's cache of the disk tier's records, bytes; `None`: the store's
    /// default (`disk_size` within 32 MiB..=1 GiB). Read when the store
    /// opens.
    pub disk_index_cache: Option<u64>,
    /// TTL when the response says nothing (Varnish's `default_ttl`).
    pub default_ttl: Duration,
    /// Grace when the response says nothing (Varnish's `default_grace`).
    pub default_grace: Duration,
    /// Keep after TTL + grace, for revalidation (Varnish's `default_keep`).
    pub default_keep: Duration,
    /// Responses with bodies larger than this are streamed but not stored.
    pub max_object_size: u64,
    /// Client addresses (CIDR) allowed to send `PURGE`.
    pub purge_allow: Vec<IpNet>,
    /// Whether a non-error answer to an unsafe method (POST, PUT, DELETE,
    /// any unknown method) removes the URL it names (RFC 9111 section
    /// 4.4); any client can then evict a URL whose origin answers such a
    /// method with 2xx or 3xx.
    pub invalidate_on_unsafe: bool,
    /// Content codings that are variants of their own, most preferred
    /// first; a fetch for the cache asks for exactly one of them or
    /// `identity`.
    pub accept_encoding: Vec<String>,
    /// Request fields removed from fetches for the cache: the origin may
    /// trust them, and they are not in the key.
    pub strip_request_headers: Vec<http::HeaderName>,
    /// Most memory the bans in effect may take together, bytes.
    pub ban_memory: u64,
}

/// The default of `cache.strip_request_headers`: fields frameworks trust to
/// build absolute links and redirects, or to rewrite the URL or method,
/// none of them in the cache key (see docs/cache.md, "Forwarding headers").
pub const STRIP_REQUEST_HEADERS: [&str; 13] = [
    "forwarded",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-host",
    "x-forwarded-proto",
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

impl CacheConfig {
    /// The store this section describes (its directory and sizes).
    pub fn store_config(&self) -> inlay_storage::StoreConfig {
        use inlay_storage::StoreConfig;
        let mut sc = match &self.dir {
            Some(dir) => StoreConfig::on_disk(dir),
            None => StoreConfig::memory_only(self.memory_size),
        };
        sc.memory_bytes = self.memory_size;
        sc.disk_bytes = self.disk_size;
        if let Some(bytes) = self.disk_index_cache {
            sc.disk_cache_bytes = bytes;
        }
        sc
    }

    /// What the cache needs of this section (no compression:
    /// `Config::cache_rules` adds `[compression]`).
    pub fn rules(&self) -> inlay_cache::CacheRules {
        inlay_cache::CacheRules {
            defaults: inlay_cache::Defaults {
                ttl: self.default_ttl,
                grace: self.default_grace,
                keep: self.default_keep,
            },
            max_object_size: self.max_object_size,
            accept_encoding: inlay_cache::ContentCodings::new(&self.accept_encoding),
            ban_memory: usize::try_from(self.ban_memory).unwrap_or(usize::MAX),
            compression: None,
        }
    }
}

impl Reader {
    pub(super) fn cache(&mut self, t: &Table) -> CacheConfig {
        let p = "cache";
        let mut purge_allow = Vec::new();
        for (i, s) in self
            .strings(t, p, "purge_allow")
            .unwrap_or_else(|| vec!["127.0.0.1/32".into(), "::1/128".into()])
            .iter()
            .enumerate()
        {
            match IpNet::parse(s) {
                Ok(n) => purge_allow.push(n),
                Err(m) => self.err(format!("cache.purge_allow[{i}]"), m),
            }
        }
        let accept_encoding = self.accept_encoding(t);
        let strip_request_headers = self.strip_request_headers(t);
        let memory_size = self.size(t, p, "memory_size", 256 << 20);
        if memory_size < 1 << 20 {
            self.err(
                "cache.memory_size",
                format!("must be at least 1MiB, got {memory_size}"),
            );
        }
        let disk_index_cache = self
            .get(t, p, "disk_index_cache")
            .is_some()
            .then(|| self.size(t, p, "disk_index_cache", 32 << 20));
        if let Some(n) = disk_index_cache.filter(|n| *n < 1 << 20) {
            self.err(
                "cache.disk_index_cache",
                format!("must be at least 1MiB, got {n}"),
            );
        }
        let ban_memory = self.size(t, p, "ban_memory", inlay_cache::DEFAULT_BAN_MEMORY as u64);
        if ban_memory < 1 << 20 {
            self.err(
                "cache.ban_memory",
                format!("must be at least 1MiB, got {ban_memory}"),
            );
        }
        let section = CacheConfig {
            dir: self.string(t, p, "dir").map(PathBuf::from),
            memory_size,
            disk_size: self.size(t, p, "disk_size", 1 << 30),
            disk_index_cache,
            default_ttl: self.duration(t, p, "default_ttl", Duration::from_secs(120)),
            default_grace: self.duration(t, p, "default_grace", Duration::from_secs(10)),
            default_keep: self.duration(t, p, "default_keep", Duration::ZERO),
            max_object_size: self.size(t, p, "max_object_size", 64 << 20),
            purge_allow,
            invalidate_on_unsafe: self.boolean(t, p, "invalidate_on_unsafe", true),
            accept_encoding,
            strip_request_headers,
            ban_memory,
        };
        self.unknown_keys(t, p);
        section
    }

    /// `cache.accept_encoding`: content-coding tokens, each once; not
    /// `identity` or `*` (identity is what is left when none matches).
    fn accept_encoding(&mut self, t: &Table) -> Vec<String> {
        let Some(list) = self.strings(t, "cache", "accept_encoding") else {
            return vec!["br".into(), "gzip".into()];
        };
        let mut out: Vec<String> = Vec::new();
        for (i, c) in list.iter().enumerate() {
            let path = format!("cache.accept_encoding[{i}]");
            let lower = c.to_ascii_lowercase();
            if lower == "identity" || lower == "*" {
                self.err(path, format!("{c:?} is not a coding to prefer: identity is what is sent when no listed coding is accepted"));
            } else if lower.is_empty()
                || !lower
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.+!".contains(ch))
            {
                self.err(path, format!("{c:?} is not a content-coding name"));
            } else if out.contains(&lower) {
                self.err(path, format!("{c:?} is listed twice"));
            } else {
                out.push(lower);
            }
        }
        out
    }

    /// `cache.strip_request_headers`: header names; Host cannot be one.
    fn strip_request_headers(&mut self, t: &Table) -> Vec<http::HeaderName> {
        let list = self
            .strings(t, "cache", "strip_request_headers")
            .unwrap_or_else(|| STRIP_REQUEST_HEADERS.map(String::from).to_vec());
        let mut out = Vec::new();
        for (i, name) in list.iter().enumerate() {
            let path = format!("cache.strip_request_headers[{i}]");
            match http::HeaderName::from_bytes(name.trim().as_bytes()) {
                Ok(n) if n == http::header::HOST => {
                    self.err(path, "Host is part of the cache key and cannot be stripped")
                }
                Ok(n) => out.push(n),
                Err(_) => self.err(path, format!("{name:?} is not a header name")),
            }
        }
        out
    }
}

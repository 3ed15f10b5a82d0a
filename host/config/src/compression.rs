//! `[compression]`: what Inlay compresses at the edge, and how hard.

use std::sync::Arc;

use inlay_cache::coding::{CompressionRules, DEFAULT_TYPES, Levels, MediaPattern};

use super::read::{Reader, Table};

/// `[compression]`.
#[derive(Debug, Clone)]
pub struct CompressionConfig {
    /// Whether Inlay compresses at all.
    pub enabled: bool,
    /// The media types compressed.
    pub types: Vec<MediaPattern>,
    /// Bodies shorter than this are left alone, bytes.
    pub min_size: u64,
    /// Levels of the codings stored with a cached object (made once).
    pub store_levels: Levels,
    /// Levels of the codings made as a response streams (pass, misses,
    /// ESI pages).
    pub stream_levels: Levels,
    /// Responses compressed as they stream at once; past it, identity.
    pub max_streams: usize,
}

impl CompressionConfig {
    /// What the cache needs of this section; `None` when it is off.
    pub fn rules(&self) -> Option<CompressionRules> {
        self.enabled.then(|| CompressionRules {
            types: Arc::from(self.types.as_slice()),
            min_size: self.min_size,
            store_levels: self.store_levels,
            stream_levels: self.stream_levels,
        })
    }
}

impl Reader {
    pub(super) fn compression(&mut self, t: &Table) -> CompressionConfig {
        let p = "compression";
        let list = self
            .strings(t, p, "types")
            .unwrap_or_else(|| DEFAULT_TYPES.map(String::from).to_vec());
        let mut types = Vec::new();
        for (i, s) in list.iter().enumerate() {
            match MediaPattern::parse(s) {
                Ok(m) if !types.contains(&m) => types.push(m),
                Ok(_) => self.err(format!("{p}.types[{i}]"), format!("{s:?} is listed twice")),
                Err(m) => self.err(format!("{p}.types[{i}]"), m),
            }
        }
        let level = |r: &mut Self, key: &str, default: u64, min: u64, max: u64| {
            r.uint(t, p, key, default, min, max) as i32
        };
        let store_levels = Levels {
            br: level(self, "br_level", 9, 0, 11),
            gzip: level(self, "gzip_level", 6, 1, 9),
            zstd: level(self, "zstd_level", 15, 1, 19),
        };
        let stream_levels = Levels {
            br: level(self, "stream_br_level", 4, 0, 11),
            gzip: level(self, "stream_gzip_level", 3, 1, 9),
            zstd: level(self, "stream_zstd_level", 3, 1, 19),
        };
        let section = CompressionConfig {
            enabled: self.boolean(t, p, "enabled", true),
            types,
            min_size: self.size(t, p, "min_size", 1024),
            store_levels,
            stream_levels,
            max_streams: self.uint(t, p, "max_streams", 1024, 0, 1_000_000) as usize,
        };
        self.unknown_keys(t, p);
        section
    }
}

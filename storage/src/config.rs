//! Store configuration.

use std::path::PathBuf;
use std::time::Duration;

use crate::StoreError;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Smallest accepted chunk size.
pub const MIN_CHUNK_SIZE: usize = 4 * 1024;
/// Largest accepted chunk size. Chunks are files of their own (sled holds a
/// pointer to each), so the bound is about memory per read, not sled.
pub const MAX_CHUNK_SIZE: usize = 4 * 1024 * 1024;
/// Largest accepted [`StoreConfig::inline_body_bytes`]: with at most 32 KiB
/// of metadata ([`crate::MAX_META_LEN`]), a record stays far below the size
/// at which sled writes a node as a blob file of its own (see the crate docs).
pub const MAX_INLINE_BODY: usize = 16 * 1024;

/// How a [`crate::TieredStore`] is set up.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `dir` | none | sled directory; none = memory only |
/// | `memory_bytes` | 256 MiB | memory tier budget (bodies + metadata) |
/// | `disk_bytes` | 1 GiB | bound on the logical bytes kept on disk |
/// | `chunk_size` | 1 MiB | body chunk size on disk (one file per chunk; a body of one chunk is read without a copy) |
/// | `flush_every_ms` | 500 | sled's periodic fsync interval |
/// | `sweep_interval` | 30 s | how often expired objects are removed |
/// | `disk_cache_bytes` | 0: a quarter of `disk_bytes`, within 32 MiB..=1 GiB | memory for the disk tier's index: three quarters hold records in a hash map, one quarter is sled's page cache (see [`StoreConfig::index_bytes`]) |
/// | `inline_body_bytes` | 4 KiB | bodies up to this size are stored in their record, not in chunk files |
/// | `kv_bytes` | 64 MiB | bound on all kv records together |
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Directory of the disk tier; `None` keeps everything in memory.
    pub dir: Option<PathBuf>,
    /// Memory tier budget in bytes.
    pub memory_bytes: u64,
    /// Disk tier bound in logical bytes (keys, records and bodies). sled's
    /// files can be a few times larger than this (see the crate docs).
    pub disk_bytes: u64,
    /// Body chunk size on disk, within
    /// [`MIN_CHUNK_SIZE`]..=[`MAX_CHUNK_SIZE`].
    pub chunk_size: usize,
    /// sled fsyncs its log this often; writes in the last window can be lost
    /// in a crash (they are then misses, never corrupt hits).
    pub flush_every_ms: u64,
    /// Interval of the background sweeper that removes expired objects and
    /// enforces the disk bound.
    pub sweep_interval: Duration,
    /// Memory for the disk tier's index in bytes (records held in memory
    /// and sled's page cache); 0 (the default) derives it from
    /// `disk_bytes` (see [`StoreConfig::index_bytes`]).
    pub disk_cache_bytes: u64,
    /// Bound on the bytes of all kv records (keys and values) together.
    pub kv_bytes: u64,
    /// Bodies of at most this many bytes are stored inside their metadata
    /// record (one engine read per hit, no file per object); longer ones in
    /// chunks. At most [`MAX_INLINE_BODY`]; 0 stores every body in chunks.
    pub inline_body_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            dir: None,
            memory_bytes: 256 * MIB,
            disk_bytes: 1024 * MIB,
            chunk_size: MIB as usize,
            flush_every_ms: 500,
            sweep_interval: Duration::from_secs(30),
            disk_cache_bytes: 0,
            kv_bytes: 64 * MIB,
            inline_body_bytes: 4 * KIB as usize,
        }
    }
}

impl StoreConfig {
    /// A memory-only configuration with the given memory budget.
    pub fn memory_only(memory_bytes: u64) -> Self {
        StoreConfig {
            memory_bytes,
            ..StoreConfig::default()
        }
    }

    /// A configuration with a disk tier in `dir` and default sizes.
    pub fn on_disk(dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            dir: Some(dir.into()),
            ..StoreConfig::default()
        }
    }

    /// Memory for the disk tier's index: `disk_cache_bytes`, or if that is
    /// 0, a quarter of `disk_bytes` within 32 MiB..=1 GiB (a default that
    /// keeps the memory a disk tier may cost below its size).
    ///
    /// Three quarters ([`StoreConfig::record_cache_bytes`]) hold records
    /// (with their small bodies inline) in a hash map, so that while they
    /// fit a disk-tier lookup at 1M objects costs what a hash table in RAM
    /// costs, not a walk of sled's tree: a
    /// record of a 200 B object weighs about 515 B there, so 1M such objects
    /// need about 700 MiB of it (`loadtests/reports/scale.md`). Records it cannot
    /// hold are read from sled, whose page cache is the other quarter
    /// ([`StoreConfig::sled_cache_bytes`]). Both fill only with what is
    /// read or written, so a tier of large objects (few records) uses
    /// little of it. Read at open: a new `disk_bytes` (a reload) does not
    /// change it.
    pub fn index_bytes(&self) -> u64 {
        if self.disk_cache_bytes != 0 {
            return self.disk_cache_bytes;
        }
        (self.disk_bytes / 4).clamp(32 * MIB, 1024 * MIB)
    }

    /// sled's page cache: a quarter of [`StoreConfig::index_bytes`].
    pub fn sled_cache_bytes(&self) -> u64 {
        self.index_bytes() / 4
    }

    /// The records held in memory: the rest of
    /// [`StoreConfig::index_bytes`].
    pub fn record_cache_bytes(&self) -> u64 {
        self.index_bytes() - self.sled_cache_bytes()
    }

    /// Checks the values; every problem is reported, not only the first.
    pub fn validate(&self) -> Result<(), StoreError> {
        let mut problems = bound_problems(self.memory_bytes, self.disk_bytes, self.dir.is_some());
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.chunk_size) {
            problems.push(format!(
                "chunk_size {} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}",
                self.chunk_size
            ));
        }
        if self.inline_body_bytes > MAX_INLINE_BODY {
            problems.push(format!(
                "inline_body_bytes {} is above {MAX_INLINE_BODY}",
                self.inline_body_bytes
            ));
        }
        if self.flush_every_ms == 0 {
            problems.push("flush_every_ms must be at least 1".to_string());
        }
        if self.sweep_interval.is_zero() {
            problems.push("sweep_interval must not be zero".to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Config(problems.join("; ")))
        }
    }
}

/// What is wrong with the memory and disk bounds (the disk bound only
/// counts with a disk tier); empty when both are acceptable.
pub(crate) fn bound_problems(memory_bytes: u64, disk_bytes: u64, on_disk: bool) -> Vec<String> {
    let mut problems = Vec::new();
    if memory_bytes < 64 * KIB {
        problems.push(format!("memory_bytes {memory_bytes} is below 64 KiB"));
    }
    if on_disk && disk_bytes < MIB {
        problems.push(format!("disk_bytes {disk_bytes} is below 1 MiB"));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        StoreConfig::default().validate().unwrap();
        StoreConfig::on_disk("/tmp/x").validate().unwrap();
    }

    #[test]
    fn index_memory_follows_the_disk_bound_within_its_limits_and_is_split() {
        let with = |disk_bytes, disk_cache_bytes| StoreConfig {
            disk_bytes,
            disk_cache_bytes,
            ..StoreConfig::default()
        };
        assert_eq!(with(MIB, 0).index_bytes(), 32 * MIB);
        assert_eq!(with(1200 * MIB, 0).index_bytes(), 300 * MIB);
        assert_eq!(with(64 << 30, 0).index_bytes(), 1024 * MIB);
        assert_eq!(with(64 << 30, 5 * MIB).index_bytes(), 5 * MIB);
        let c = with(1024 * MIB, 0);
        assert_eq!(c.sled_cache_bytes(), 64 * MIB);
        assert_eq!(c.record_cache_bytes(), 192 * MIB);
    }

    #[test]
    fn validate_reports_every_problem() {
        let c = StoreConfig {
            memory_bytes: 1,
            chunk_size: 1,
            inline_body_bytes: MAX_INLINE_BODY + 1,
            sweep_interval: std::time::Duration::ZERO,
            ..StoreConfig::default()
        };
        let Err(StoreError::Config(msg)) = c.validate() else {
            panic!("invalid config accepted");
        };
        assert!(
            msg.contains("memory_bytes")
                && msg.contains("chunk_size")
                && msg.contains("inline_body_bytes")
                && msg.contains("sweep")
        );
    }
}

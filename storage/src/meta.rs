//! Object metadata, its lifetime arithmetic and its checksummed encoding.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::StoreError;
use crate::codec::{Reader, Writer};

/// Version byte of the [`ObjectMeta`] encoding. Version 2 added
/// `created_ms` and `full_key`, version 3 `codings`; records of versions 1
/// and 2 still decode. A binary that knows only version 2 reads a version 3
/// record as corrupt, hence a miss: it never serves a body of several
/// codings as one.
const META_VERSION: u8 = 3;
/// The first version, still read.
const META_VERSION_1: u8 = 1;
/// The second version, still read.
const META_VERSION_2: u8 = 2;

/// What the store keeps about a cached response besides its body.
///
/// Times are unix milliseconds. An object is *fresh* until
/// `stored_at_ms + ttl_ms`, may be served stale for `grace_ms` more, and is
/// kept `keep_ms` beyond that for conditional revalidation; after that it is
/// *removable* and the store drops it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// HTTP status code of the stored response.
    pub status: u16,
    /// Response headers: lower-case names, raw values, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// When the object was stored or last refreshed (unix ms).
    pub stored_at_ms: u64,
    /// How long after `stored_at_ms` the object is fresh.
    pub ttl_ms: u64,
    /// How long after expiry the object may still be served stale.
    pub grace_ms: u64,
    /// How long after grace the object is kept for revalidation.
    pub keep_ms: u64,
    /// Surrogate keys (tags) for purge-by-key.
    pub surrogate_keys: Vec<String>,
    /// Lower-case request header names this object varies on.
    pub vary: Vec<String>,
    /// The response's `ETag`, for conditional revalidation.
    pub etag: Option<String>,
    /// The response's `Last-Modified`, for conditional revalidation.
    pub last_modified: Option<String>,
    /// Body length in bytes; set by `put`.
    pub body_len: u64,
    /// CRC-32 (IEEE) of the body; set by `put`.
    pub checksum: u32,
    /// When this response entered the cache (unix ms). Unlike
    /// `stored_at_ms` it is neither dated back by `Age` nor moved by a 304
    /// refresh, so a ban (which applies to what was cached before it)
    /// compares against it. Records written before it existed decode it
    /// as their `stored_at_ms`.
    pub created_ms: u64,
    /// The full key the host built the storage key from, when the storage
    /// key holds only a digest of it (long keys): lets a walk over the
    /// store see what an object stands for. `None` when the storage key
    /// says it all.
    pub full_key: Option<String>,
    /// The content codings the body holds side by side, as `(name,
    /// length)` in the order they are concatenated (for example
    /// `identity`, `br`, `gzip`: a response the cache compressed once, each
    /// coding ready for its clients); their lengths add up to `body_len`.
    /// Empty: the body is the one representation the headers describe.
    pub codings: Vec<(String, u64)>,
}

impl ObjectMeta {
    /// When the object stops being fresh (unix ms).
    pub fn expires_at_ms(&self) -> u64 {
        self.stored_at_ms.saturating_add(self.ttl_ms)
    }

    /// When the grace period ends (unix ms).
    pub fn grace_until_ms(&self) -> u64 {
        self.expires_at_ms().saturating_add(self.grace_ms)
    }

    /// When the object may be removed: after ttl, grace and keep (unix ms).
    pub fn removable_at_ms(&self) -> u64 {
        self.grace_until_ms().saturating_add(self.keep_ms)
    }

    /// Whether the object is fresh at `now_ms`.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms()
    }

    /// Whether the object is expired but still within its grace period.
    pub fn in_grace(&self, now_ms: u64) -> bool {
        !self.is_fresh(now_ms) && now_ms < self.grace_until_ms()
    }

    /// Whether the object is past grace but still kept for revalidation.
    pub fn in_keep(&self, now_ms: u64) -> bool {
        now_ms >= self.grace_until_ms() && now_ms < self.removable_at_ms()
    }

    /// Whether the object is past ttl, grace and keep and must not be used.
    pub fn is_removable(&self, now_ms: u64) -> bool {
        now_ms >= self.removable_at_ms()
    }

    /// Age of the object at `now_ms` in milliseconds (for the `Age` header).
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.stored_at_ms)
    }

    /// The object made stale at `now_ms` (soft purge): it expires now but
    /// keeps its grace and keep windows, so it can still be served stale and
    /// revalidated. An object already expired is left as it is.
    pub fn made_stale(&self, now_ms: u64) -> ObjectMeta {
        let mut m = self.clone();
        if m.stored_at_ms > now_ms {
            // A clock step backwards: without this the object would stay fresh.
            m.stored_at_ms = now_ms;
            m.ttl_ms = 0;
        } else if m.is_fresh(now_ms) {
            m.ttl_ms = now_ms - m.stored_at_ms;
        }
        m
    }

    /// First value of header `name` (lower-case), if present.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Approximate heap bytes used by this metadata (for memory accounting).
    pub fn approx_size(&self) -> usize {
        let strings = |v: &[String]| v.iter().map(|s| s.len() + 24).sum::<usize>();
        std::mem::size_of::<Self>()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 48)
                .sum::<usize>()
            + strings(&self.surrogate_keys)
            + strings(&self.vary)
            + self.etag.as_ref().map_or(0, String::len)
            + self.last_modified.as_ref().map_or(0, String::len)
            + self.full_key.as_ref().map_or(0, String::len)
            + self
                .codings
                .iter()
                .map(|(c, _)| c.len() + 32)
                .sum::<usize>()
    }

    /// Where coding `name` lies in the body ([`codings`](Self::codings)),
    /// as a byte range; `None` when the body holds no such coding.
    pub fn coding_range(&self, name: &str) -> Option<std::ops::Range<usize>> {
        let mut start = 0usize;
        for (c, len) in &self.codings {
            let end = start.checked_add(usize::try_from(*len).ok()?)?;
            if c == name {
                return Some(start..end);
            }
            start = end;
        }
        None
    }

    /// Encodes the metadata; the encoding ends with a CRC-32 of itself so a
    /// torn or bit-flipped record is detected by [`ObjectMeta::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.approx_size() + 64);
        w.u8(META_VERSION);
        self.write_v1_fields(&mut w);
        // Version 2 appends these.
        w.u64(self.created_ms);
        w.opt_str(self.full_key.as_deref());
        // Version 3 appends these.
        w.u32(len_u32(self.codings.len()));
        for (name, len) in &self.codings {
            w.str(name);
            w.u64(*len);
        }
        let crc = crc32fast::hash(&w.buf);
        w.u32(crc);
        w.buf
    }

    /// The fields every version has, in their order.
    fn write_v1_fields(&self, w: &mut Writer) {
        w.u16(self.status);
        w.u64(self.stored_at_ms);
        w.u64(self.ttl_ms);
        w.u64(self.grace_ms);
        w.u64(self.keep_ms);
        w.u64(self.body_len);
        w.u32(self.checksum);
        w.u32(len_u32(self.headers.len()));
        for (name, value) in &self.headers {
            w.str(name);
            w.bytes(value);
        }
        w.u32(len_u32(self.surrogate_keys.len()));
        for k in &self.surrogate_keys {
            w.str(k);
        }
        w.u32(len_u32(self.vary.len()));
        for v in &self.vary {
            w.str(v);
        }
        w.opt_str(self.etag.as_deref());
        w.opt_str(self.last_modified.as_deref());
    }

    /// Decodes what [`ObjectMeta::encode`] produced, verifying its checksum.
    pub fn decode(buf: &[u8]) -> Result<ObjectMeta, StoreError> {
        let Some(body_len) = buf.len().checked_sub(4) else {
            return Err(StoreError::Corrupt(
                "metadata shorter than its checksum".into(),
            ));
        };
        let (body, crc) = buf.split_at(body_len);
        let mut crc_bytes = [0u8; 4];
        crc_bytes.copy_from_slice(crc);
        if crc32fast::hash(body) != u32::from_be_bytes(crc_bytes) {
            return Err(StoreError::Corrupt("metadata checksum mismatch".into()));
        }
        let mut r = Reader::new(body);
        let version = r.u8("version")?;
        if !(META_VERSION_1..=META_VERSION).contains(&version) {
            return Err(StoreError::Corrupt(format!(
                "unknown metadata version {version}"
            )));
        }
        let status = r.u16("status")?;
        let stored_at_ms = r.u64("stored_at")?;
        let ttl_ms = r.u64("ttl")?;
        let grace_ms = r.u64("grace")?;
        let keep_ms = r.u64("keep")?;
        let body_len = r.u64("body_len")?;
        let checksum = r.u32("checksum")?;
        let n = r.count(8, "headers")?;
        let mut headers = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.string("header name")?;
            let value = r.bytes("header value")?.to_vec();
            headers.push((name, value));
        }
        let surrogate_keys = read_strings(&mut r, "surrogate keys")?;
        let vary = read_strings(&mut r, "vary")?;
        let etag = r.opt_string("etag")?;
        let last_modified = r.opt_string("last-modified")?;
        let (created_ms, full_key) = if version == META_VERSION_1 {
            (stored_at_ms, None)
        } else {
            (r.u64("created")?, r.opt_string("full key")?)
        };
        let mut codings = Vec::new();
        if version > META_VERSION_2 {
            let n = r.count(12, "codings")?;
            codings.reserve(n);
            for _ in 0..n {
                codings.push((r.string("coding")?, r.u64("coding length")?));
            }
            let sum = codings
                .iter()
                .try_fold(0u64, |sum: u64, (_, len)| sum.checked_add(*len));
            if !codings.is_empty() && sum != Some(body_len) {
                return Err(StoreError::Corrupt(
                    "the codings' lengths do not add up to the body's".into(),
                ));
            }
        }
        r.finish("metadata")?;
        Ok(ObjectMeta {
            status,
            headers,
            stored_at_ms,
            ttl_ms,
            grace_ms,
            keep_ms,
            surrogate_keys,
            vary,
            etag,
            last_modified,
            body_len,
            checksum,
            created_ms,
            full_key,
            codings,
        })
    }
}

fn read_strings(r: &mut Reader<'_>, what: &str) -> Result<Vec<String>, StoreError> {
    let n = r.count(4, what)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(r.string(what)?);
    }
    Ok(out)
}

/// Collection lengths are bounded by the put-time limits far below 4 Gi.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A cached object as returned by a store: shared metadata and the body.
#[derive(Debug, Clone)]
pub struct StoredObject {
    /// The object's metadata (with `body_len` and `checksum` filled).
    pub meta: Arc<ObjectMeta>,
    /// The whole body (every coding of [`ObjectMeta::codings`], when it
    /// holds several).
    pub body: Bytes,
}

impl StoredObject {
    /// The body in coding `name` (no copy), when it holds that coding
    /// side by side with others ([`ObjectMeta::codings`]).
    pub fn coding(&self, name: &str) -> Option<Bytes> {
        let range = self.meta.coding_range(name)?;
        (range.end <= self.body.len()).then(|| self.body.slice(range))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> ObjectMeta {
        ObjectMeta {
            status: 200,
            headers: vec![
                ("content-type".into(), b"text/html".to_vec()),
                ("x-raw".into(), vec![0, 255, 10]),
            ],
            stored_at_ms: 1_000,
            ttl_ms: 100,
            grace_ms: 50,
            keep_ms: 25,
            surrogate_keys: vec!["a".into(), "b".into()],
            vary: vec!["accept-encoding".into()],
            etag: Some("\"x\"".into()),
            last_modified: None,
            body_len: 3,
            checksum: 7,
            created_ms: 1_000,
            full_key: Some("example.com/long".into()),
            codings: Vec::new(),
        }
    }

    /// What version 2 wrote: no codings.
    fn encode_v2(m: &ObjectMeta) -> Vec<u8> {
        let mut w = Writer::with_capacity(256);
        w.u8(META_VERSION_2);
        m.write_v1_fields(&mut w);
        w.u64(m.created_ms);
        w.opt_str(m.full_key.as_deref());
        let crc = crc32fast::hash(&w.buf);
        w.u32(crc);
        w.buf
    }

    #[test]
    fn version_2_records_still_decode_as_one_representation() {
        let m = sample();
        let old = ObjectMeta::decode(&encode_v2(&m)).expect("a v2 record decodes");
        assert_eq!(old, m);
        assert!(old.codings.is_empty());
    }

    #[test]
    fn codings_are_slices_of_the_body_and_must_add_up() {
        let mut m = sample();
        m.codings = vec![("identity".into(), 5), ("br".into(), 2), ("gzip".into(), 3)];
        m.body_len = 10;
        let back = ObjectMeta::decode(&m.encode()).unwrap();
        assert_eq!(back.codings, m.codings);
        let obj = StoredObject {
            meta: Arc::new(back),
            body: Bytes::from_static(b"hellobrgzz"),
        };
        assert_eq!(obj.coding("identity").unwrap(), "hello");
        assert_eq!(obj.coding("br").unwrap(), "br");
        assert_eq!(obj.coding("gzip").unwrap(), "gzz");
        assert_eq!(obj.coding("zstd"), None);
        // Lengths that do not add up to the body are a corrupt record.
        m.body_len = 11;
        assert!(ObjectMeta::decode(&m.encode()).is_err());
        // A body shorter than its codings says (a bug elsewhere) gives none.
        let short = StoredObject {
            meta: obj.meta.clone(),
            body: Bytes::from_static(b"hello"),
        };
        assert_eq!(short.coding("gzip"), None);
    }

    /// What version 1 wrote: no creation time, no full key.
    fn encode_v1(m: &ObjectMeta) -> Vec<u8> {
        let mut w = Writer::with_capacity(256);
        w.u8(META_VERSION_1);
        m.write_v1_fields(&mut w);
        let crc = crc32fast::hash(&w.buf);
        w.u32(crc);
        w.buf
    }

    #[test]
    fn version_1_records_still_decode_with_their_stored_time_as_creation() {
        let mut m = sample();
        m.stored_at_ms = 5_000;
        let old = ObjectMeta::decode(&encode_v1(&m)).expect("a v1 record decodes");
        assert_eq!(old.created_ms, 5_000);
        assert_eq!(old.full_key, None);
        assert_eq!(old.headers, m.headers);
        assert_eq!(old.etag, m.etag);
    }

    #[test]
    fn lifetime_windows() {
        let m = sample();
        assert_eq!(m.expires_at_ms(), 1_100);
        assert_eq!(m.removable_at_ms(), 1_175);
        assert!(m.is_fresh(1_099) && !m.is_fresh(1_100));
        assert!(m.in_grace(1_100) && m.in_grace(1_149) && !m.in_grace(1_150));
        assert!(m.in_keep(1_150) && !m.in_keep(1_175));
        assert!(!m.is_removable(1_174) && m.is_removable(1_175));
        assert_eq!(m.header("content-type"), Some(&b"text/html"[..]));
    }

    #[test]
    fn made_stale_expires_now_and_keeps_grace() {
        let m = sample().made_stale(1_040);
        assert!(!m.is_fresh(1_040));
        assert!(m.in_grace(1_040));
        assert_eq!(m.removable_at_ms(), 1_040 + 50 + 25);
        // Already stale: unchanged.
        let late = sample();
        assert_eq!(late.made_stale(1_120), late);
        // Stored "in the future" (clock went back): still made stale.
        let f = sample().made_stale(500);
        assert!(!f.is_fresh(500));
    }

    #[test]
    fn decode_rejects_every_single_bit_flip() {
        let enc = sample().encode();
        for i in 0..enc.len() {
            for bit in 0..8 {
                let mut bad = enc.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    ObjectMeta::decode(&bad).is_err(),
                    "flip at {i}:{bit} accepted"
                );
            }
        }
    }

    #[test]
    fn decode_rejects_truncation() {
        let enc = sample().encode();
        for n in 0..enc.len() {
            assert!(
                ObjectMeta::decode(&enc[..n]).is_err(),
                "prefix of {n} accepted"
            );
        }
    }

    fn arb_meta() -> impl Strategy<Value = ObjectMeta> {
        let headers = proptest::collection::vec(
            (".{0,12}", proptest::collection::vec(any::<u8>(), 0..40)),
            0..8,
        );
        let strings = || proptest::collection::vec(".{0,16}", 0..5);
        (
            (
                any::<u16>(),
                headers,
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
            ),
            (
                strings(),
                strings(),
                proptest::option::of(".{0,10}"),
                proptest::option::of(".{0,10}"),
                any::<u64>(),
                any::<u32>(),
            ),
            (
                any::<u64>(),
                proptest::option::of(".{0,10}"),
                proptest::collection::vec((".{0,8}", 0u64..1 << 40), 0..4),
            ),
        )
            .prop_map(
                |(
                    (status, headers, stored_at_ms, ttl_ms, grace_ms, keep_ms),
                    (surrogate_keys, vary, etag, last_modified, body_len, checksum),
                    (created_ms, full_key, codings),
                )| ObjectMeta {
                    status,
                    headers,
                    stored_at_ms,
                    ttl_ms,
                    grace_ms,
                    keep_ms,
                    surrogate_keys,
                    vary,
                    etag,
                    last_modified,
                    // A body of several codings is as long as they are.
                    body_len: if codings.is_empty() {
                        body_len
                    } else {
                        codings.iter().map(|(_, n)| n).sum()
                    },
                    checksum,
                    created_ms,
                    full_key,
                    codings,
                },
            )
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(m in arb_meta()) {
            let enc = m.encode();
            prop_assert_eq!(ObjectMeta::decode(&enc).unwrap(), m);
        }

        #[test]
        fn decode_never_panics_on_garbage(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ObjectMeta::decode(&data);
        }

        #[test]
        fn lifetime_windows_are_ordered(m in arb_meta(), now in any::<u64>()) {
            prop_assert!(m.expires_at_ms() <= m.grace_until_ms());
            prop_assert!(m.grace_until_ms() <= m.removable_at_ms());
            // Exactly one of the four states holds at any instant.
            let states = [m.is_fresh(now), m.in_grace(now), m.in_keep(now), m.is_removable(now)];
            prop_assert_eq!(states.iter().filter(|s| **s).count(), 1);
        }
    }
}

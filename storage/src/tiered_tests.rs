//! White-box tests of the tiered store: they reach into the disk engine to
//! damage data and inject faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::engine::{DiskEngine, Entries, TreeId, Value, open_sled};
use crate::{MAX_KEY_LEN, MAX_KV_VALUE_LEN, MAX_META_LEN};

fn config(dir: &std::path::Path) -> StoreConfig {
    StoreConfig {
        dir: Some(dir.to_path_buf()),
        memory_bytes: 64 << 20,
        disk_bytes: 64 << 20,
        flush_every_ms: 100,
        sweep_interval: Duration::from_secs(3600),
        ..StoreConfig::default()
    }
}

fn meta(ttl_ms: u64, skeys: &[&str]) -> ObjectMeta {
    ObjectMeta {
        status: 200,
        headers: vec![("content-type".into(), b"text/plain".to_vec())],
        stored_at_ms: now_ms(),
        ttl_ms,
        surrogate_keys: skeys.iter().map(|s| s.to_string()).collect(),
        ..ObjectMeta::default()
    }
}

fn body(seed: u64, len: usize) -> Bytes {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Bytes::from(
        (0..len)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 33) as u8
            })
            .collect::<Vec<u8>>(),
    )
}

/// Opens a store and waits for its background count, so tests that check
/// byte counts do not race it.
fn open_counted(cfg: StoreConfig) -> TieredStore {
    let s = TieredStore::open(cfg).unwrap();
    wait_counted(&s);
    s
}

/// Waits for the background count (and its reads) to finish.
fn wait_counted(s: &TieredStore) {
    for _ in 0..500 {
        if s.disk_counted() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("background count did not finish");
}

/// Forces the next get to read from disk.
fn forget_memory(s: &TieredStore) {
    s.memory().tier.clear();
}

/// Chunks a body of `len` bytes takes at the default chunk size (none if
/// it is small enough to go inline in its record).
fn chunks(len: usize) -> usize {
    let cfg = StoreConfig::default();
    if len <= cfg.inline_body_bytes {
        return 0;
    }
    len.div_ceil(cfg.chunk_size)
}

fn count(engine: &dyn DiskEngine, tree: TreeId) -> usize {
    engine.range_from(tree, &[]).count()
}

#[test]
fn round_trip_small_and_multi_chunk_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    let small = body(1, 100);
    let big = body(2, 1 << 20);
    let empty = Bytes::new();
    s.put("small\u{1}", meta(60_000, &[]), small.clone())
        .unwrap();
    let m = s.put("big\u{1}", meta(60_000, &[]), big.clone()).unwrap();
    s.put("empty\u{1}", meta(60_000, &[]), empty.clone())
        .unwrap();
    assert_eq!(m.body_len, 1 << 20);
    // 1 MiB in chunks; the small body is inline in its record.
    assert_eq!(
        count(s.disk().unwrap().engine(), TreeId::Chunks),
        chunks(1 << 20)
    );
    assert_eq!(s.get("big\u{1}").unwrap().unwrap().body, big);
    assert_eq!(s.stats().hits_memory, 1);
    forget_memory(&s);
    let got = s.get("big\u{1}").unwrap().unwrap();
    assert_eq!(got.body, big);
    assert_eq!(*got.meta, *m);
    assert_eq!(s.get("small\u{1}").unwrap().unwrap().body, small);
    assert_eq!(s.get("empty\u{1}").unwrap().unwrap().body, empty);
    assert_eq!(s.stats().hits_disk, 3);
    // Promoted: the next read is a memory hit.
    s.get("big\u{1}").unwrap().unwrap();
    assert_eq!(s.stats().hits_memory, 2);
}

#[test]
fn overwrite_replaces_chunks_and_index_entries() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    s.put("k", meta(60_000, &["a", "b"]), body(1, 200_000))
        .unwrap();
    s.put("k", meta(120_000, &["b", "c"]), body(2, 70_000))
        .unwrap();
    let e = s.disk().unwrap().engine();
    assert_eq!(
        count(e, TreeId::Chunks),
        chunks(70_000),
        "old chunks must be deleted"
    );
    assert_eq!(count(e, TreeId::Fifo), 1);
    assert_eq!(count(e, TreeId::Expiry), 1);
    assert_eq!(count(e, TreeId::Surrogate), 2);
    assert_eq!(count(e, TreeId::Pending), 0);
    assert!(s.keys_for_surrogate("a").unwrap().is_empty());
    assert_eq!(s.keys_for_surrogate("c").unwrap(), vec!["k".to_string()]);
    forget_memory(&s);
    assert_eq!(s.get("k").unwrap().unwrap().body, body(2, 70_000));
}

/// Finds the first chunk key of `key`.
fn first_chunk(engine: &dyn DiskEngine, key: &str) -> (Value, Value) {
    let mut prefix = (key.len() as u32).to_be_bytes().to_vec();
    prefix.extend_from_slice(key.as_bytes());
    engine
        .scan_prefix(TreeId::Chunks, &prefix)
        .next()
        .unwrap()
        .unwrap()
}

#[test]
fn flipped_byte_in_a_chunk_is_a_miss_and_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    s.put("victim", meta(60_000, &["t"]), body(3, 1 << 20))
        .unwrap();
    s.put("bystander", meta(60_000, &["t"]), body(4, 1000))
        .unwrap();
    let e = s.disk().unwrap().engine();
    let (k, v) = first_chunk(e, "victim");
    let mut bad = v.to_vec();
    bad[1234] ^= 0x20;
    e.insert(TreeId::Chunks, &k, &bad).unwrap();
    forget_memory(&s);
    assert!(s.get("victim").unwrap().is_none());
    let st = s.stats();
    assert_eq!(st.corrupt_dropped, 1);
    assert_eq!(st.misses, 1);
    // Removed, with all its parts; the bystander is untouched.
    assert!(e.get(TreeId::Meta, b"victim").unwrap().is_none());
    assert_eq!(count(e, TreeId::Chunks), chunks(1000));
    assert_eq!(
        s.keys_for_surrogate("t").unwrap(),
        vec!["bystander".to_string()]
    );
    assert_eq!(s.get("bystander").unwrap().unwrap().body, body(4, 1000));
    assert_eq!(s.stats().disk_objects, 1);
}

#[test]
fn missing_or_extra_chunks_and_bad_records_are_misses() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    let e = s.disk().unwrap().engine();

    // A torn write: the record made it, a chunk did not.
    s.put("torn", meta(60_000, &[]), body(5, 300_000)).unwrap();
    let (k, _) = first_chunk(e, "torn");
    e.remove(TreeId::Chunks, &k).unwrap();

    // A truncated last chunk.
    s.put("short", meta(60_000, &[]), body(6, 100_000)).unwrap();
    let mut prefix = 5u32.to_be_bytes().to_vec();
    prefix.extend_from_slice(b"short");
    let last = e
        .scan_prefix(TreeId::Chunks, &prefix)
        .last()
        .unwrap()
        .unwrap();
    e.insert(TreeId::Chunks, &last.0, &last.1[..last.1.len() - 1])
        .unwrap();

    // A record with a flipped bit.
    s.put("badmeta", meta(60_000, &[]), body(7, 10)).unwrap();
    let mut rec = e.get(TreeId::Meta, b"badmeta").unwrap().unwrap().to_vec();
    let n = rec.len();
    rec[n - 10] ^= 1;
    e.insert(TreeId::Meta, b"badmeta", &rec).unwrap();

    // Garbage instead of a record.
    e.insert(TreeId::Meta, b"garbage", b"\x00\x01junk").unwrap();

    forget_memory(&s);
    for k in ["torn", "short", "badmeta", "garbage"] {
        assert!(s.get(k).unwrap().is_none(), "{k} served");
        assert!(
            e.get(TreeId::Meta, k.as_bytes()).unwrap().is_none(),
            "{k} kept"
        );
    }
    assert_eq!(s.stats().corrupt_dropped, 4);
    assert_eq!(
        count(e, TreeId::Chunks),
        0,
        "chunks of dropped objects remain"
    );
}

#[test]
fn persistence_across_reopen_and_exact_recount() {
    let dir = tempfile::tempdir().unwrap();
    let before;
    {
        let s = TieredStore::open(config(dir.path())).unwrap();
        for i in 0..20 {
            s.put(
                &format!("k{i}"),
                meta(60_000, &["x"]),
                body(i, 10_000 * i as usize),
            )
            .unwrap();
        }
        s.kv_set("policy-a", "counter", b"41").unwrap();
        before = s.stats();
    }
    let s = open_counted(config(dir.path()));
    let after = s.stats();
    assert_eq!(
        after.disk_bytes, before.disk_bytes,
        "recount differs from live count"
    );
    assert_eq!(after.disk_objects, 20);
    assert_eq!(after.kv_bytes, before.kv_bytes);
    for i in 0..20 {
        let got = s.get(&format!("k{i}")).unwrap().unwrap();
        assert_eq!(got.body, body(i, 10_000 * i as usize));
    }
    assert_eq!(s.stats().hits_disk, 20);
    assert_eq!(s.keys_for_surrogate("x").unwrap().len(), 20);
    assert_eq!(
        s.kv_get("policy-a", "counter").unwrap().unwrap(),
        Bytes::from_static(b"41")
    );
}

#[test]
fn interrupted_writes_are_cleaned_up_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = TieredStore::open(config(dir.path())).unwrap();
        s.put("kept", meta(60_000, &[]), body(1, 100_000)).unwrap();
        let e = s.disk().unwrap().engine();
        // What a crash between steps 2 and 4 of a put leaves behind: a
        // pending entry and chunks, for a new key and for an existing one.
        for key in ["ghost", "kept"] {
            let id = e.generate_id().unwrap();
            e.insert(TreeId::Pending, &id.to_be_bytes(), key.as_bytes())
                .unwrap();
            let mut ck = (key.len() as u32).to_be_bytes().to_vec();
            ck.extend_from_slice(key.as_bytes());
            ck.extend_from_slice(&id.to_be_bytes());
            ck.extend_from_slice(&0u32.to_be_bytes());
            e.insert(TreeId::Chunks, &ck, b"half written").unwrap();
        }
        assert_eq!(count(e, TreeId::Chunks), chunks(100_000) + 2);
    }
    let s = open_counted(config(dir.path()));
    let e = s.disk().unwrap().engine();
    assert_eq!(count(e, TreeId::Pending), 0);
    assert_eq!(
        count(e, TreeId::Chunks),
        chunks(100_000),
        "only the kept object's chunks remain"
    );
    assert_eq!(s.get("kept").unwrap().unwrap().body, body(1, 100_000));
    assert!(s.get("ghost").unwrap().is_none());
}

#[test]
fn disk_bound_evicts_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        disk_bytes: 2 << 20,
        memory_bytes: 256 << 10,
        ..config(dir.path())
    };
    let s = open_counted(cfg);
    for i in 0..100 {
        s.put(&format!("k{i:03}"), meta(60_000, &["all"]), body(i, 60_000))
            .unwrap();
        let st = s.stats();
        assert!(st.disk_bytes <= 2 << 20, "over the bound after {i}: {st:?}");
    }
    let st = s.stats();
    assert!(st.evicted_disk >= 60, "{st:?}");
    forget_memory(&s);
    assert!(s.get("k000").unwrap().is_none(), "oldest survived");
    assert_eq!(s.get("k099").unwrap().unwrap().body, body(99, 60_000));
    // Evicted objects took their index entries with them.
    let e = s.disk().unwrap().engine();
    assert_eq!(count(e, TreeId::Meta), count(e, TreeId::Fifo));
    assert_eq!(
        count(e, TreeId::Meta),
        s.keys_for_surrogate("all").unwrap().len()
    );
}

#[test]
fn sweep_removes_expired_objects_from_both_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    let now = now_ms();
    let mut old = meta(1_000, &[]);
    old.stored_at_ms = now - 10_000;
    old.grace_ms = 1_000;
    old.keep_ms = 1_000;
    s.put("old", old, body(1, 100_000)).unwrap();
    s.put("fresh", meta(600_000, &[]), body(2, 100)).unwrap();
    // Already past keep: a miss even before the sweep.
    assert!(s.get("old").unwrap().is_none());
    assert_eq!(s.sweep_expired(now).unwrap(), 1);
    let e = s.disk().unwrap().engine();
    assert!(e.get(TreeId::Meta, b"old").unwrap().is_none());
    assert_eq!(count(e, TreeId::Expiry), 1);
    assert_eq!(count(e, TreeId::Chunks), chunks(100));
    assert_eq!(s.stats().memory_objects, 1);
    assert!(s.get("fresh").unwrap().is_some());
    // The fresh object goes when its time comes.
    assert_eq!(s.sweep_expired(now + 700_000).unwrap(), 1);
    assert_eq!(count(e, TreeId::Meta), 0);
}

#[test]
fn sweeper_thread_runs_on_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        sweep_interval: Duration::from_millis(20),
        ..config(dir.path())
    };
    let s = TieredStore::open(cfg).unwrap();
    let mut m = meta(50, &[]);
    m.stored_at_ms = now_ms();
    s.put("short-lived", m, body(1, 10)).unwrap();
    for _ in 0..200 {
        if s.stats().expired_removed > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(s.stats().expired_removed, 1);
    assert_eq!(s.stats().disk_objects, 0);
}

#[test]
fn update_and_soft_purge_persist() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = TieredStore::open(config(dir.path())).unwrap();
        let mut m = meta(600_000, &["t"]);
        m.grace_ms = 600_000;
        // "a" holds two codings side by side; a refresh keeps them.
        let mut coded = m.clone();
        coded.codings = vec![("identity".into(), 60_000), ("br".into(), 10_000)];
        s.put("a", coded, body(1, 70_000)).unwrap();
        s.put("b", m, body(2, 10)).unwrap();
        let mut refreshed = meta(900_000, &["t", "u"]);
        refreshed.grace_ms = 600_000;
        refreshed.status = 203;
        refreshed.etag = Some("\"v2\"".into());
        assert!(s.update_meta("a", refreshed).unwrap());
        assert!(!s.update_meta("absent", meta(1, &[])).unwrap());
        assert_eq!(s.purge_surrogate("u", true).unwrap(), 1);
        let a = s.get("a").unwrap().unwrap();
        assert!(!a.meta.is_fresh(now_ms()) && a.meta.in_grace(now_ms()));
    }
    let s = TieredStore::open(config(dir.path())).unwrap();
    let a = s.get("a").unwrap().unwrap();
    assert_eq!(a.meta.status, 203);
    assert_eq!(a.meta.etag.as_deref(), Some("\"v2\""));
    assert_eq!(a.coding("br").unwrap(), a.body.slice(60_000..));
    assert_eq!(a.body, body(1, 70_000));
    assert!(!a.meta.is_fresh(now_ms()), "soft purge lost on restart");
    assert!(a.meta.in_grace(now_ms()));
    assert!(s.get("b").unwrap().unwrap().meta.is_fresh(now_ms()));
    assert_eq!(s.keys_for_surrogate("u").unwrap(), vec!["a".to_string()]);
}

#[test]
fn prefix_and_surrogate_purges_stay_purged_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = TieredStore::open(config(dir.path())).unwrap();
        for v in ["gzip", "br", ""] {
            s.put(
                &format!("p1\u{1}{v}"),
                meta(60_000, &["page"]),
                body(1, 100),
            )
            .unwrap();
        }
        s.put("p10\u{1}", meta(60_000, &["other"]), body(2, 100))
            .unwrap();
        s.put("p2\u{1}", meta(60_000, &["page", "other"]), body(3, 100))
            .unwrap();
        assert_eq!(s.remove_prefix("p1\u{1}").unwrap(), 3);
        assert_eq!(s.purge_surrogate("page", false).unwrap(), 1);
        assert!(s.get("p1\u{1}gzip").unwrap().is_none());
        assert!(s.get("p10\u{1}").unwrap().is_some());
    }
    let s = TieredStore::open(config(dir.path())).unwrap();
    assert!(s.get("p1\u{1}gzip").unwrap().is_none());
    assert!(s.get("p1\u{1}").unwrap().is_none());
    assert!(s.get("p2\u{1}").unwrap().is_none());
    assert!(s.get("p10\u{1}").unwrap().is_some());
    assert!(s.keys_for_surrogate("page").unwrap().is_empty());
    assert_eq!(
        s.keys_for_surrogate("other").unwrap(),
        vec!["p10\u{1}".to_string()]
    );
    assert_eq!(s.remove_prefix("p1\u{1}").unwrap(), 0);
}

#[test]
fn stale_surrogate_entries_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    s.put("k", meta(60_000, &["t"]), body(1, 10)).unwrap();
    let e = s.disk().unwrap().engine();
    // An entry a crash left behind (its object never got the tag).
    let mut stale = 1u32.to_be_bytes().to_vec();
    stale.extend_from_slice(b"tother");
    e.insert(TreeId::Surrogate, &stale, &[]).unwrap();
    assert_eq!(s.keys_for_surrogate("t").unwrap(), vec!["k".to_string()]);
    assert_eq!(count(e, TreeId::Surrogate), 1);
}

#[test]
fn kv_on_disk_round_trip_budget_and_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        kv_bytes: 4096,
        ..config(dir.path())
    };
    {
        let s = TieredStore::open(cfg.clone()).unwrap();
        s.kv_set("p", "a", b"1").unwrap();
        s.kv_set("p", "b", b"2").unwrap();
        s.kv_set("q", "a", b"3").unwrap();
        assert!(s.kv_delete("p", "b").unwrap());
        assert!(matches!(
            s.kv_set("p", "big", &[0u8; 5000]),
            Err(StoreError::Full)
        ));
        assert!(matches!(
            s.kv_set("p", "huge", &vec![0u8; MAX_KV_VALUE_LEN + 1]),
            Err(StoreError::TooLarge { .. })
        ));
    }
    let s = TieredStore::open(cfg).unwrap();
    assert_eq!(
        s.kv_get("p", "a").unwrap().unwrap(),
        Bytes::from_static(b"1")
    );
    assert!(s.kv_get("p", "b").unwrap().is_none());
    assert_eq!(
        s.kv_get("q", "a").unwrap().unwrap(),
        Bytes::from_static(b"3")
    );
    // Namespaces are separate even when the strings could run together.
    s.kv_set("pa", "", b"x").unwrap();
    assert_eq!(
        s.kv_get("p", "a").unwrap().unwrap(),
        Bytes::from_static(b"1")
    );
    // A damaged value is dropped, not returned.
    let e = s.disk().unwrap().engine();
    let mut k = 1u32.to_be_bytes().to_vec();
    k.extend_from_slice(b"qa");
    let mut v = e.get(TreeId::Kv, &k).unwrap().unwrap().to_vec();
    v[4] ^= 0xff;
    e.insert(TreeId::Kv, &k, &v).unwrap();
    assert!(s.kv_get("q", "a").unwrap().is_none());
    assert!(e.get(TreeId::Kv, &k).unwrap().is_none());
}

#[test]
fn concurrent_writers_and_readers_never_see_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        memory_bytes: 1 << 20,
        ..config(dir.path())
    };
    let s = Arc::new(TieredStore::open(cfg).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..150u64 {
                    let k = format!("k{}", i % 7);
                    if t % 2 == 0 {
                        let seed = t * 1000 + i;
                        let mut m = meta(60_000, &[]);
                        m.status = 200 + (seed % 50) as u16;
                        m.etag = Some(seed.to_string());
                        s.put(&k, m, body(seed, 20_000 + (seed as usize % 5) * 30_000))
                            .unwrap();
                    } else if i % 10 == 0 {
                        s.remove(&k).unwrap();
                    } else if let Some(obj) = s.get(&k).unwrap() {
                        // The body must be the one its own metadata names.
                        let seed: u64 = obj.meta.etag.as_deref().unwrap().parse().unwrap();
                        assert_eq!(obj.body, body(seed, 20_000 + (seed as usize % 5) * 30_000));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.stats().corrupt_dropped, 0);
    let e = s.disk().unwrap().engine();
    assert_eq!(count(e, TreeId::Pending), 0);
    // No chunk leaked: every chunk belongs to a live record.
    let live: usize = (0..7)
        .filter_map(|i| s.get(&format!("k{i}")).unwrap())
        .map(|o| chunks(o.meta.body_len as usize))
        .sum();
    assert_eq!(count(e, TreeId::Chunks), live);
}

/// Wraps an engine and fails writes on demand, as a full disk would.
struct FaultyEngine {
    inner: Arc<dyn DiskEngine>,
    /// Inserts of values longer than this fail with `Full`.
    max_value: AtomicUsize,
    /// Every write fails with `Full`.
    all: AtomicBool,
    /// Reads so far (gets and scans).
    reads: AtomicUsize,
}

impl FaultyEngine {
    fn check(&self, len: usize) -> Result<(), StoreError> {
        if self.all.load(Ordering::SeqCst) || len > self.max_value.load(Ordering::SeqCst) {
            return Err(StoreError::Full);
        }
        Ok(())
    }
}

impl DiskEngine for FaultyEngine {
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get(tree, key)
    }
    fn insert(&self, tree: TreeId, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError> {
        self.check(value.len())?;
        self.inner.insert(tree, key, value)
    }
    fn remove(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
        self.check(0)?;
        self.inner.remove(tree, key)
    }
    fn compare_and_swap(
        &self,
        tree: TreeId,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        self.check(new.map_or(0, <[u8]>::len))?;
        self.inner.compare_and_swap(tree, key, old, new)
    }
    fn scan_prefix(&self, tree: TreeId, prefix: &[u8]) -> Entries<'_> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.scan_prefix(tree, prefix)
    }
    fn range_from(&self, tree: TreeId, start: &[u8]) -> Entries<'_> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.range_from(tree, start)
    }
    fn generate_id(&self) -> Result<u64, StoreError> {
        self.inner.generate_id()
    }
    fn sweep_orphans(&self, stop: &AtomicBool) -> Result<u64, StoreError> {
        self.inner.sweep_orphans(stop)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.check(0)?;
        self.inner.flush()
    }
    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }
}

fn faulty_store(dir: &std::path::Path) -> (TieredStore, Arc<FaultyEngine>) {
    let cfg = config(dir);
    let sled = open_sled(dir, &cfg).unwrap().engine;
    let faulty = Arc::new(FaultyEngine {
        inner: Arc::new(sled),
        max_value: AtomicUsize::new(usize::MAX),
        all: AtomicBool::new(false),
        reads: AtomicUsize::new(0),
    });
    let store = TieredStore::with_engine(cfg, faulty.clone()).unwrap();
    (store, faulty)
}

#[test]
fn failed_put_keeps_the_previous_object_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (s, faults) = faulty_store(dir.path());
    s.put("k", meta(60_000, &[]), body(1, 200_000)).unwrap();
    // Big writes fail (chunks), small ones (records, cleanup) still work.
    faults.max_value.store(1000, Ordering::SeqCst);
    let err = s.put("k", meta(60_000, &[]), body(2, 200_000)).unwrap_err();
    assert!(err.is_full(), "{err:?}");
    assert_eq!(s.stats().write_errors, 1);
    assert!(!s.stats().disk_degraded, "a small write still works");
    forget_memory(&s);
    assert_eq!(s.get("k").unwrap().unwrap().body, body(1, 200_000));
    let e = s.disk().unwrap().engine();
    assert_eq!(
        count(e, TreeId::Chunks),
        chunks(200_000),
        "partial chunks of the failed put remain"
    );
    assert_eq!(count(e, TreeId::Pending), 0);
    // Space is back: writes work again.
    faults.max_value.store(usize::MAX, Ordering::SeqCst);
    s.put("k", meta(60_000, &[]), body(3, 200_000)).unwrap();
    forget_memory(&s);
    assert_eq!(s.get("k").unwrap().unwrap().body, body(3, 200_000));
}

#[test]
fn engine_refusing_all_writes_degrades_to_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let (s, faults) = faulty_store(dir.path());
    s.put("k", meta(60_000, &[]), body(1, 100_000)).unwrap();
    s.kv_set("p", "a", b"1").unwrap();
    faults.all.store(true, Ordering::SeqCst);
    assert!(
        s.put("k2", meta(60_000, &[]), body(2, 10))
            .unwrap_err()
            .is_full()
    );
    assert!(s.stats().disk_degraded);
    // Fails fast from now on, without touching the engine.
    assert!(matches!(
        s.put("k3", meta(60_000, &[]), body(3, 10)),
        Err(StoreError::Degraded(_))
    ));
    assert!(matches!(
        s.kv_set("p", "b", b"2"),
        Err(StoreError::Degraded(_))
    ));
    // Reads keep working.
    forget_memory(&s);
    assert_eq!(s.get("k").unwrap().unwrap().body, body(1, 100_000));
    assert_eq!(
        s.kv_get("p", "a").unwrap().unwrap(),
        Bytes::from_static(b"1")
    );
    // A purge that cannot reach the disk says so, and still purges memory.
    s.get("k").unwrap().unwrap();
    assert!(s.remove("k").is_err());
    assert_eq!(s.stats().memory_objects, 0);
}

#[test]
fn memory_only_mode_is_complete() {
    let s = TieredStore::open(StoreConfig {
        memory_bytes: 1 << 20,
        kv_bytes: 1024,
        ..StoreConfig::default()
    })
    .unwrap();
    assert!(!s.stats().disk_enabled);
    let mut graced = meta(60_000, &["t"]);
    graced.grace_ms = 60_000;
    s.put("a\u{1}x", graced.clone(), body(1, 1000)).unwrap();
    s.put("a\u{1}y", graced, body(2, 1000)).unwrap();
    s.put("b\u{1}", meta(60_000, &["t", "u"]), body(3, 1000))
        .unwrap();
    assert_eq!(s.get("a\u{1}x").unwrap().unwrap().body, body(1, 1000));
    assert_eq!(s.soft_purge_prefix("a\u{1}").unwrap(), 2);
    assert!(!s.get("a\u{1}y").unwrap().unwrap().meta.is_fresh(now_ms()));
    assert_eq!(s.remove_prefix("a\u{1}").unwrap(), 2);
    assert_eq!(
        s.keys_for_surrogate("t").unwrap(),
        vec!["b\u{1}".to_string()]
    );
    assert_eq!(s.purge_surrogate("u", false).unwrap(), 1);
    assert!(s.get("b\u{1}").unwrap().is_none());
    s.kv_set("ns", "k", b"v").unwrap();
    assert_eq!(
        s.kv_get("ns", "k").unwrap().unwrap(),
        Bytes::from_static(b"v")
    );
    assert!(matches!(
        s.kv_set("ns", "k2", &[0; 2000]),
        Err(StoreError::Full)
    ));
    // Bounded.
    for i in 0..200 {
        s.put(&format!("fill{i}"), meta(60_000, &[]), body(i, 20_000))
            .unwrap();
    }
    assert!(s.stats().memory_bytes <= 1 << 20);
    assert!(s.stats().evicted_memory > 0);
    assert!(matches!(
        s.put("huge", meta(60_000, &[]), body(9, 2 << 20)),
        Err(StoreError::TooLarge { .. })
    ));
    s.flush().unwrap();
}

#[test]
fn invalid_input_is_refused() {
    let s = TieredStore::open(StoreConfig::memory_only(1 << 20)).unwrap();
    assert!(matches!(
        s.put("", meta(1, &[]), Bytes::new()),
        Err(StoreError::InvalidKey(_))
    ));
    let long = "x".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(s.get(&long), Err(StoreError::TooLarge { .. })));
    assert!(matches!(
        s.put("k", meta(1, &[""]), Bytes::new()),
        Err(StoreError::InvalidKey(_))
    ));
    let mut m = meta(1, &[]);
    m.headers = vec![("x".into(), vec![0; MAX_META_LEN])];
    assert!(matches!(
        s.put("k", m, Bytes::new()),
        Err(StoreError::TooLarge { .. })
    ));
    assert!(matches!(
        TieredStore::open(StoreConfig {
            chunk_size: 1,
            ..StoreConfig::default()
        }),
        Err(StoreError::Config(_))
    ));
}

// ---- peek: the memory tier alone ----

/// Hits from memory, hits from disk and misses so far.
fn lookups(s: &TieredStore) -> (u64, u64, u64) {
    let st = s.stats();
    (st.hits_memory, st.hits_disk, st.misses)
}

/// Metadata of an object stored `age_ms` ago, removable `keep_ms` after it
/// expired.
fn aged(age_ms: u64, ttl_ms: u64, keep_ms: u64) -> ObjectMeta {
    ObjectMeta {
        stored_at_ms: now_ms() - age_ms,
        keep_ms,
        ..meta(ttl_ms, &[])
    }
}

#[test]
fn peek_serves_a_memory_hit_and_counts_it_once() {
    let s = TieredStore::open(StoreConfig::memory_only(4 << 20)).unwrap();
    s.put("k", meta(60_000, &[]), body(1, 1000)).unwrap();
    match s.peek("k") {
        Peek::Hit(obj) => assert_eq!(obj.body, body(1, 1000)),
        other => panic!("expected a hit, got {other:?}"),
    }
    assert_eq!(lookups(&s), (1, 0, 0));
}

#[test]
fn peek_without_a_disk_tier_calls_a_memory_miss_absent() {
    let s = TieredStore::open(StoreConfig::memory_only(4 << 20)).unwrap();
    assert!(matches!(s.peek("never-stored"), Peek::Absent));
    assert_eq!(lookups(&s), (0, 0, 1));
    // An invalid key goes on to `get`, which says what is wrong with it.
    assert!(matches!(s.peek(""), Peek::NotResident));
    assert!(matches!(s.get(""), Err(StoreError::InvalidKey(_))));
}

#[test]
fn peek_with_a_disk_tier_reads_nothing_and_leaves_the_count_to_get() {
    let dir = tempfile::tempdir().unwrap();
    let (s, engine) = faulty_store(dir.path());
    wait_counted(&s);
    s.put("k", meta(60_000, &[]), body(1, 1000)).unwrap();
    forget_memory(&s);
    let reads = engine.reads.load(Ordering::SeqCst);
    assert!(matches!(s.peek("k"), Peek::NotResident));
    assert!(matches!(s.peek("never-stored"), Peek::NotResident));
    assert_eq!(
        engine.reads.load(Ordering::SeqCst),
        reads,
        "peek read the disk"
    );
    assert_eq!(lookups(&s), (0, 0, 0));
    // The caller's `get` finds it on disk; peek + get count one lookup each.
    assert_eq!(s.get("k").unwrap().unwrap().body, body(1, 1000));
    assert!(s.get("never-stored").unwrap().is_none());
    assert_eq!(lookups(&s), (0, 1, 1));
    // `get` promoted it: now memory answers.
    assert!(matches!(s.peek("k"), Peek::Hit(_)));
    assert_eq!(lookups(&s), (1, 1, 1));
}

#[test]
fn peek_on_a_degraded_disk_tier_still_sends_misses_to_get() {
    let dir = tempfile::tempdir().unwrap();
    let (s, faults) = faulty_store(dir.path());
    s.put("k", meta(60_000, &[]), body(1, 1000)).unwrap();
    faults.all.store(true, Ordering::SeqCst);
    assert!(s.put("k2", meta(60_000, &[]), body(2, 10)).is_err());
    assert!(s.stats().disk_degraded);
    forget_memory(&s);
    assert!(matches!(s.peek("k"), Peek::NotResident));
    assert_eq!(s.get("k").unwrap().unwrap().body, body(1, 1000));
}

#[test]
fn peek_applies_the_keep_window_as_get_does() {
    let s = TieredStore::open(StoreConfig::memory_only(4 << 20)).unwrap();
    // Expired 1 s ago, kept 60 s: still served (stale), as `get` does.
    s.put("stale", aged(2_000, 1_000, 60_000), body(1, 10))
        .unwrap();
    assert!(matches!(s.peek("stale"), Peek::Hit(o) if !o.meta.is_fresh(now_ms())));
    // Expired 1 s ago, no keep: removable, a miss, and dropped from memory.
    s.put("gone", aged(2_000, 1_000, 0), body(2, 10)).unwrap();
    assert!(matches!(s.peek("gone"), Peek::Absent));
    assert_eq!(s.stats().memory_objects, 1);
    assert_eq!(lookups(&s), (1, 0, 1));

    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    s.put("gone", aged(2_000, 1_000, 0), body(2, 10)).unwrap();
    assert!(matches!(s.peek("gone"), Peek::NotResident));
    assert!(s.get("gone").unwrap().is_none());
    assert_eq!(lookups(&s), (0, 0, 1));
}

/// Drops the page cache of every chunk file under `dir` (made durable
/// first: the kernel keeps dirty pages).
#[allow(unsafe_code)]
fn drop_page_cache(dir: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let mut todo = vec![dir.join("chunks")];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            let f = std::fs::File::open(&path).unwrap();
            f.sync_all().unwrap();
            // SAFETY: advice on a valid open descriptor; no memory is passed.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(rc, 0, "fadvise {}", path.display());
        }
    }
}

#[test]
fn get_nowait_reads_the_disk_tier_only_from_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let s = TieredStore::open(config(dir.path())).unwrap();
    wait_counted(&s);
    s.put("small", meta(60_000, &[]), body(1, 16 << 10))
        .unwrap();
    s.put("large", meta(60_000, &[]), body(2, 512 << 10))
        .unwrap();
    s.flush().unwrap();
    forget_memory(&s);
    // Just written: in the page cache, read at once and promoted.
    match s.get_nowait("small") {
        Peek::Hit(obj) => assert_eq!(obj.body, body(1, 16 << 10)),
        other => panic!("expected a hit from the page cache, got {other:?}"),
    }
    assert_eq!(lookups(&s), (0, 1, 0));
    assert!(matches!(s.get_nowait("small"), Peek::Hit(_)));
    assert_eq!(lookups(&s), (1, 1, 0));
    // Absent from disk too: a miss, counted.
    assert!(matches!(s.get_nowait("never-stored"), Peek::Absent));
    assert_eq!(lookups(&s), (1, 1, 1));
    // A large chunk is mapped and populated: that may wait, so never here.
    assert!(matches!(s.get_nowait("large"), Peek::NotResident));
    assert_eq!(lookups(&s), (1, 1, 1), "a no-wait miss counts nothing");
    // Out of the page cache: the device would be read, so not here either.
    forget_memory(&s);
    drop_page_cache(dir.path());
    assert!(matches!(s.get_nowait("small"), Peek::NotResident));
    assert_eq!(lookups(&s), (1, 1, 1));
    // The blocking read finds both.
    assert_eq!(s.get("small").unwrap().unwrap().body, body(1, 16 << 10));
    assert_eq!(s.get("large").unwrap().unwrap().body, body(2, 512 << 10));
    assert_eq!(lookups(&s), (1, 3, 1));
}

#[test]
fn an_old_vary_index_in_kv_is_dropped_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        kv_bytes: 64 << 10,
        ..config(dir.path())
    };
    {
        let s = open_counted(cfg.clone());
        for i in 0..200 {
            s.kv_set(
                "inlay.vary",
                &format!("example.com\u{2}/v?{i}"),
                b"accept-language",
            )
            .unwrap();
        }
        s.kv_set("policy", "k", b"v").unwrap();
    }
    let s = open_counted(cfg);
    assert!(
        s.kv_get("inlay.vary", "example.com\u{2}/v?0")
            .unwrap()
            .is_none()
    );
    assert_eq!(
        s.kv_get("policy", "k").unwrap().unwrap(),
        Bytes::from_static(b"v")
    );
    // Only the policy's record is charged to the kv budget.
    assert!(s.stats().kv_bytes < 200, "{}", s.stats().kv_bytes);
}

/// Plants a chunk file no pointer names, as a crash between a chunk's file
/// and its pointer leaves; returns its path.
fn plant_chunk_file(dir: &std::path::Path, engine: &dyn DiskEngine) -> std::path::PathBuf {
    let id = engine.generate_id().unwrap();
    let path = dir
        .join("chunks")
        .join(format!("{:02x}", id & 0xff))
        .join(format!("{id:016x}"));
    std::fs::write(&path, b"no pointer names this file").unwrap();
    path
}

#[test]
fn orphaned_chunk_files_are_deleted_after_the_open_not_during_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    // An earlier session: two objects, and the files of two writes a
    // crash interrupted before their pointers.
    let (orphan, junk) = {
        let s = open_counted(cfg.clone());
        s.put("a", meta(60_000, &[]), body(1, 100)).unwrap();
        s.put("b", meta(60_000, &[]), body(2, 50_000)).unwrap();
        s.flush().unwrap();
        let orphan = plant_chunk_file(dir.path(), s.disk().unwrap().engine());
        let junk = dir.path().join("chunks").join("00").join("not-a-chunk");
        std::fs::write(&junk, b"x").unwrap();
        (orphan, junk)
    };
    let engine = Arc::new(open_sled(dir.path(), &cfg).unwrap().engine);
    // Declared before the gate, so dropped after it: a failing assertion
    // releases the sweep before the store's drop waits for it.
    let s: TieredStore;
    let release = engine.hold_orphan_sweep();
    s = TieredStore::with_engine(cfg, engine.clone()).unwrap();
    // Open, and answering, while the sweep has not run: the orphans are
    // still there.
    assert!(orphan.exists() && junk.exists());
    forget_memory(&s);
    assert_eq!(s.get("a").unwrap().unwrap().body, body(1, 100));
    // Written while the sweep runs: a file whose pointer is not in the
    // tree yet (a put in flight), and a whole put.
    let in_flight = plant_chunk_file(dir.path(), &*engine);
    s.put("c", meta(60_000, &[]), body(3, 100)).unwrap();
    release.send(()).unwrap();
    for _ in 0..1000 {
        if engine.orphans_swept() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(engine.orphans_swept(), "the orphan sweep did not finish");
    assert!(!orphan.exists(), "an orphan of an earlier session was kept");
    assert!(!junk.exists(), "a stray file was kept");
    assert!(
        in_flight.exists(),
        "a file written during the sweep was deleted"
    );
    forget_memory(&s);
    assert_eq!(s.get("a").unwrap().unwrap().body, body(1, 100));
    assert_eq!(s.get("b").unwrap().unwrap().body, body(2, 50_000));
    assert_eq!(s.get("c").unwrap().unwrap().body, body(3, 100));
}

#[test]
fn scan_meta_walks_both_tiers_in_key_order_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_counted(config(dir.path()));
    for k in ["d", "a", "c", "b", "e"] {
        s.put(k, meta(60_000, &[]), Bytes::from_static(b"x"))
            .unwrap();
    }
    // "a" and "b" only on disk now; the rest in both tiers.
    forget_memory(&s);
    s.get("c").unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let batch = s.scan_meta(after.as_deref(), 2).unwrap();
        if batch.is_empty() {
            break;
        }
        assert!(batch.len() <= 2);
        after = batch.last().map(|(k, _)| k.clone());
        seen.extend(batch.into_iter().map(|(k, m)| (k, m.status)));
    }
    let keys: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c", "d", "e"]);
    assert!(seen.iter().all(|(_, status)| *status == 200));
    // "d" is stored again since the walk read it (a newer creation time).
    let mut newer = meta(60_000, &[]);
    newer.created_ms = 10;
    s.put("d", newer, Bytes::from_static(b"y")).unwrap();
    let by = |k: &str| (k.to_string(), 5);
    assert_eq!(
        s.remove_created_by(&[by("b"), by("d"), by("zz")]).unwrap(),
        1
    );
    let left: Vec<String> = s
        .scan_meta(None, 10)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(left, ["a", "c", "d", "e"]);
}

#[test]
fn ban_records_survive_a_reopen_and_a_corrupt_one_reads_without_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_counted(config(dir.path()));
        s.ban_put(1, b"one").unwrap();
        s.ban_put(2, b"two").unwrap();
        s.ban_put(3, b"three").unwrap();
        s.ban_remove(&[2]).unwrap();
        // Damage record 3 behind the store's back.
        let engine = s.disk().unwrap().engine();
        engine
            .insert(TreeId::Bans, &3u64.to_be_bytes(), b"\0\0\0\0three")
            .unwrap();
        engine.flush().unwrap();
    }
    let s = open_counted(config(dir.path()));
    let recs = s.ban_records().unwrap();
    assert_eq!(
        recs,
        [
            BanRecord {
                id: 1,
                data: Some(Bytes::from_static(b"one"))
            },
            BanRecord { id: 3, data: None },
        ]
    );
    // Not charged to the policies' kv budget.
    assert_eq!(s.stats().kv_bytes, 0);
}

#[test]
fn a_memory_only_store_persists_no_bans() {
    let s = TieredStore::open(StoreConfig::memory_only(1 << 20)).unwrap();
    s.ban_put(1, b"x").unwrap();
    assert!(s.ban_records().unwrap().is_empty());
}

#[test]
fn a_smaller_memory_budget_evicts_and_the_indexes_follow() {
    let s = TieredStore::open(StoreConfig::memory_only(4 << 20)).unwrap();
    for i in 0..200 {
        let tag = if i % 2 == 0 { "even" } else { "odd" };
        s.put(
            &format!("p{i:03}\u{1}"),
            meta(60_000, &[tag]),
            body(i, 10_000),
        )
        .unwrap();
    }
    let before = s.stats();
    assert_eq!(before.memory_objects, 200, "{before:?}");
    s.set_bounds(1 << 20, 1 << 30).unwrap();
    let st = s.stats();
    assert_eq!(st.memory_capacity, 1 << 20);
    assert!(st.memory_bytes <= 1 << 20, "{st:?}");
    assert!(st.memory_objects < 110, "{st:?}");
    assert_eq!(st.evicted_memory, 200 - st.memory_objects, "{st:?}");
    // The indexes name only what the cache still holds: purges count the
    // survivors, and every key they name is a hit.
    let tagged = s.keys_for_surrogate("even").unwrap().len() as u64
        + s.keys_for_surrogate("odd").unwrap().len() as u64;
    assert_eq!(tagged, st.memory_objects);
    let scanned = s.scan_meta(None, 1000).unwrap();
    assert_eq!(scanned.len() as u64, st.memory_objects);
    for (k, _) in &scanned {
        assert!(s.get(k).unwrap().is_some(), "{k:?} indexed but evicted");
    }
    let odd = s.purge_surrogate("odd", false).unwrap();
    assert_eq!(s.remove_prefix("p").unwrap(), st.memory_objects - odd);
    assert_eq!(s.stats().memory_objects, 0);
    // The largest object follows the budget; a larger budget takes more again.
    assert!(s.max_object_bytes() < 1 << 20);
    s.set_bounds(8 << 20, 1 << 30).unwrap();
    for i in 0..200 {
        s.put(&format!("q{i:03}"), meta(60_000, &[]), body(i, 10_000))
            .unwrap();
    }
    assert_eq!(s.stats().memory_objects, 200);
    assert_eq!(s.stats().memory_capacity, 8 << 20);
}

#[test]
fn a_smaller_disk_bound_evicts_oldest_first_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_counted(StoreConfig {
        disk_bytes: 8 << 20,
        memory_bytes: 256 << 10,
        ..config(dir.path())
    });
    for i in 0..100 {
        s.put(&format!("k{i:03}"), meta(60_000, &["all"]), body(i, 60_000))
            .unwrap();
    }
    assert_eq!(s.stats().disk_objects, 100);
    let evicted = s.set_bounds(256 << 10, 2 << 20).unwrap();
    let st = s.stats();
    assert_eq!(st.disk_capacity, 2 << 20);
    assert!(st.disk_bytes <= 2 << 20, "{st:?}");
    assert_eq!(evicted, 100 - st.disk_objects, "{st:?}");
    assert!(evicted >= 60, "{st:?}");
    forget_memory(&s);
    assert!(s.get("k000").unwrap().is_none(), "oldest survived");
    assert_eq!(s.get("k099").unwrap().unwrap().body, body(99, 60_000));
    assert_eq!(st.corrupt_dropped, 0);
    // A body above a quarter of the new bound is refused; one below fits.
    assert!(matches!(
        s.put("big", meta(60_000, &[]), body(1, 600 << 10)),
        Err(StoreError::TooLarge { .. })
    ));
    s.put("small", meta(60_000, &[]), body(1, 400 << 10))
        .unwrap();
    // Growing keeps everything, and takes larger bodies again.
    s.set_bounds(256 << 10, 8 << 20).unwrap();
    s.put("big", meta(60_000, &[]), body(1, 600 << 10)).unwrap();
    assert_eq!(s.stats().disk_capacity, 8 << 20);
    drop(s);
    // The new bound is not persisted: a reopen takes its config's.
    let s = open_counted(config(dir.path()));
    assert_eq!(s.get("big").unwrap().unwrap().body, body(1, 600 << 10));
}

#[test]
fn invalid_bounds_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_counted(config(dir.path()));
    s.put("k", meta(60_000, &[]), body(1, 1000)).unwrap();
    let Err(StoreError::Config(msg)) = s.set_bounds(1000, 1000) else {
        panic!("tiny bounds accepted");
    };
    assert!(
        msg.contains("memory_bytes") && msg.contains("disk_bytes"),
        "{msg}"
    );
    let st = s.stats();
    assert_eq!((st.memory_capacity, st.disk_capacity), (64 << 20, 64 << 20));
    assert_eq!((st.memory_objects, st.disk_objects), (1, 1));
    // Without a disk tier the disk bound is not looked at.
    let m = TieredStore::open(StoreConfig::memory_only(1 << 20)).unwrap();
    m.set_bounds(2 << 20, 0).unwrap();
    assert!(matches!(m.set_bounds(0, 0), Err(StoreError::Config(_))));
    assert_eq!(m.stats().memory_capacity, 2 << 20);
}

/// The record's bytes for `key`, as stored.
fn raw_record(e: &dyn DiskEngine, key: &str) -> Vec<u8> {
    e.get(TreeId::Meta, key.as_bytes())
        .unwrap()
        .unwrap()
        .to_vec()
}

#[test]
fn small_bodies_are_stored_inline_and_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let limit = StoreConfig::default().inline_body_bytes;
    let sizes = [0, 1, 200, limit, limit + 1, 100_000];
    let before;
    {
        let s = open_counted(config(dir.path()));
        for (i, len) in sizes.iter().enumerate() {
            s.put(
                &format!("k{i}\u{1}"),
                meta(60_000, &["t"]),
                body(i as u64, *len),
            )
            .unwrap();
        }
        let e = s.disk().unwrap().engine();
        // Only the two bodies over the limit have chunks.
        assert_eq!(
            count(e, TreeId::Chunks),
            chunks(limit + 1) + chunks(100_000)
        );
        assert_eq!(chunks(limit + 1), 1);
        // An inline record holds its body: it is longer than the body.
        assert!(raw_record(e, "k3\u{1}").len() > limit);
        // A refresh of an inline object keeps its body.
        let mut refreshed = meta(120_000, &["t", "u"]);
        refreshed.status = 203;
        assert!(s.update_meta("k2\u{1}", refreshed).unwrap());
        before = s.stats();
    }
    let s = open_counted(config(dir.path()));
    assert_eq!(s.stats().disk_bytes, before.disk_bytes, "recount differs");
    for (i, len) in sizes.iter().enumerate() {
        let got = s.get(&format!("k{i}\u{1}")).unwrap().unwrap();
        assert_eq!(got.body, body(i as u64, *len), "k{i}");
    }
    assert_eq!(s.stats().hits_disk, sizes.len() as u64);
    assert_eq!(s.get("k2\u{1}").unwrap().unwrap().meta.status, 203);
    assert_eq!(
        s.keys_for_surrogate("u").unwrap(),
        vec!["k2\u{1}".to_string()]
    );
    // The reactor's path serves an inline hit without a chunk read.
    forget_memory(&s);
    assert!(matches!(
        s.get_nowait("k2\u{1}"),
        Peek::Hit(o) if o.body == body(2, 200)
    ));
}

#[test]
fn a_damaged_inline_body_is_a_miss_and_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_counted(config(dir.path()));
    for k in ["flipped", "recrc", "bystander"] {
        s.put(k, meta(60_000, &["t"]), body(9, 300)).unwrap();
    }
    let e = s.disk().unwrap().engine();
    // A flipped byte in the body (the record's CRC catches it).
    let mut rec = raw_record(e, "flipped");
    let n = rec.len();
    rec[n - 5] ^= 0x20;
    e.insert(TreeId::Meta, b"flipped", &rec).unwrap();
    // The same with the record's CRC made to match: the body's own CRC
    // still catches it.
    let mut rec = raw_record(e, "recrc");
    rec[n - 5] ^= 0x20;
    let crc = crc32fast::hash(&rec[7..]);
    rec[3..7].copy_from_slice(&crc.to_be_bytes());
    e.insert(TreeId::Meta, b"recrc", &rec).unwrap();
    forget_memory(&s);
    for k in ["flipped", "recrc"] {
        assert!(s.get(k).unwrap().is_none(), "{k} served");
        assert!(
            e.get(TreeId::Meta, k.as_bytes()).unwrap().is_none(),
            "{k} kept"
        );
    }
    let st = s.stats();
    assert_eq!((st.corrupt_dropped, st.disk_objects), (2, 1), "{st:?}");
    assert_eq!(
        s.keys_for_surrogate("t").unwrap(),
        vec!["bystander".to_string()]
    );
    assert_eq!(s.get("bystander").unwrap().unwrap().body, body(9, 300));
    // Their surrogate entries are gone (an undecodable record's are
    // dropped as stale when a purge meets them).
    assert_eq!(count(e, TreeId::Surrogate), 1);
}

#[test]
fn a_store_with_small_bodies_in_chunks_still_reads_and_converts_on_write() {
    // `inline_body_bytes: 0` writes every record as the code before inline
    // bodies did (version 1, body in chunks).
    let dir = tempfile::tempdir().unwrap();
    let old = StoreConfig {
        inline_body_bytes: 0,
        ..config(dir.path())
    };
    {
        let s = open_counted(old.clone());
        for i in 0..10 {
            s.put(&format!("k{i}"), meta(60_000, &["t"]), body(i, 200))
                .unwrap();
        }
        let e = s.disk().unwrap().engine();
        assert_eq!(count(e, TreeId::Chunks), 10);
        assert_eq!(raw_record(e, "k0")[2], 1, "not a version 1 record");
    }
    let s = open_counted(config(dir.path()));
    let e = s.disk().unwrap().engine();
    for i in 0..10 {
        assert_eq!(s.get(&format!("k{i}")).unwrap().unwrap().body, body(i, 200));
    }
    let counted = s.stats();
    assert_eq!(counted.disk_objects, 10);
    // An overwrite goes inline and deletes the old chunk; a refresh keeps
    // the chunked body; a removal and a purge delete their chunks.
    s.put("k0", meta(60_000, &["t"]), body(100, 200)).unwrap();
    assert_eq!(raw_record(e, "k0")[2], 2);
    assert!(s.update_meta("k1", meta(90_000, &["t"])).unwrap());
    assert_eq!(raw_record(e, "k1")[2], 1);
    assert!(s.remove("k2").unwrap());
    assert_eq!(s.remove_prefix("k3").unwrap(), 1);
    assert_eq!(count(e, TreeId::Chunks), 7);
    forget_memory(&s);
    assert_eq!(s.get("k0").unwrap().unwrap().body, body(100, 200));
    assert_eq!(s.get("k1").unwrap().unwrap().body, body(1, 200));
    // The usage count followed every change exactly.
    let live = s.stats();
    assert_eq!(live.disk_objects, 8);
    drop(s);
    let s = open_counted(config(dir.path()));
    assert_eq!(s.stats().disk_bytes, live.disk_bytes);
    // The setting only decides how new bodies are written: with inlining
    // off, the inline record and the chunked ones both still read.
    drop(s);
    let s = open_counted(old);
    assert_eq!(s.get("k0").unwrap().unwrap().body, body(100, 200));
    assert_eq!(s.get("k4").unwrap().unwrap().body, body(4, 200));
}

#[test]
fn inline_bodies_count_against_the_bound_and_are_evicted_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        disk_bytes: 1 << 20,
        memory_bytes: 64 << 10,
        ..config(dir.path())
    };
    let s = open_counted(cfg.clone());
    // 1,000 objects of 3 KiB: about 3 MiB inline, three times the bound.
    for i in 0..1000 {
        s.put(&format!("k{i:04}"), meta(60_000, &["all"]), body(i, 3000))
            .unwrap();
        let st = s.stats();
        assert!(st.disk_bytes <= 1 << 20, "over the bound after {i}: {st:?}");
    }
    let st = s.stats();
    assert!(st.evicted_disk >= 600, "{st:?}");
    // Each object is charged at least its body.
    assert!(st.disk_bytes >= st.disk_objects * 3000, "{st:?}");
    let e = s.disk().unwrap().engine();
    assert_eq!(count(e, TreeId::Chunks), 0);
    // Evicted objects took their index entries with them.
    assert_eq!(count(e, TreeId::Meta), count(e, TreeId::Fifo));
    assert_eq!(count(e, TreeId::Meta), count(e, TreeId::Surrogate));
    assert_eq!(count(e, TreeId::Meta) as u64, st.disk_objects);
    forget_memory(&s);
    assert!(s.get("k0000").unwrap().is_none(), "oldest survived");
    assert_eq!(s.get("k0999").unwrap().unwrap().body, body(999, 3000));
    drop(s);
    let s = open_counted(cfg);
    assert_eq!(s.stats().disk_bytes, st.disk_bytes, "recount differs");
}

/// After a restart, the background count reads every record once: the disk
/// tier's index then holds them all, answers each lookup (and an absent
/// key) from memory, and follows purges and new writes.
#[test]
fn after_the_count_every_record_is_held_in_memory_and_follows_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_counted(config(dir.path()));
        for i in 0..300u64 {
            s.put(&format!("k{i}\u{1}"), meta(60_000, &["t"]), body(i, 200))
                .unwrap();
        }
    }
    let s = open_counted(config(dir.path()));
    let st = s.stats();
    assert_eq!(st.disk_index_records, 300, "{st:?}");
    assert!(st.disk_index_complete, "{st:?}");
    assert!(st.disk_index_bytes >= 300 * 200, "{st:?}");
    let engine_reads = |s: &TieredStore| {
        s.disk()
            .unwrap()
            .engine()
            .record_cache()
            .map(|c| c.misses)
            .unwrap()
    };
    let before = engine_reads(&s);
    forget_memory(&s);
    for i in 0..300u64 {
        let got = s.get(&format!("k{i}\u{1}")).unwrap().unwrap();
        assert_eq!(got.body, body(i, 200), "k{i}");
    }
    assert!(s.get("absent\u{1}").unwrap().is_none());
    assert_eq!(engine_reads(&s), before, "a lookup read sled");
    // A removal and a new object are seen at once.
    assert!(s.remove("k7\u{1}").unwrap());
    s.put("new\u{1}", meta(60_000, &[]), body(9, 10)).unwrap();
    forget_memory(&s);
    assert!(s.get("k7\u{1}").unwrap().is_none());
    assert_eq!(s.get("new\u{1}").unwrap().unwrap().body, body(9, 10));
    assert_eq!(s.stats().disk_index_records, 300);
}

//! Crash safety with real crashes: a child process (this test binary,
//! re-executed) writes to the store and is killed with SIGKILL; the parent
//! reopens the database and checks that every object it can read is intact,
//! that flushed writes survived, and that flushed purges stayed purged.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use inlay_storage::{ObjectMeta, ObjectStore, StoreConfig, TieredStore, now_ms};

/// Set in the child: the database directory.
const DIR_ENV: &str = "INLAY_STORAGE_CRASH_DIR";
/// Set in the child: `write:<first version>` or `purge`.
const MODE_ENV: &str = "INLAY_STORAGE_CRASH_MODE";
/// Distinct object keys the writer cycles through (so it also overwrites).
const KEYS: u64 = 300;
/// Writes before the writer flushes and tells the parent.
const BEFORE_FLUSH: u64 = 120;

fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        dir: Some(dir.to_path_buf()),
        memory_bytes: 8 << 20,
        disk_bytes: 1 << 30,
        flush_every_ms: 10,
        sweep_interval: Duration::from_secs(3600),
        ..StoreConfig::default()
    }
}

fn key(version: u64) -> String {
    format!("k{:03}\u{1}", version % KEYS)
}

/// A body that names its own version, so any body can be checked alone.
/// One version in three is small enough to be stored inline in its record,
/// so overwrites also switch a key between inline and chunked bodies.
fn body(version: u64) -> Bytes {
    let max = if version.is_multiple_of(3) {
        3_000
    } else {
        400_000
    };
    let len = 8 + (version.wrapping_mul(7919) % max) as usize;
    let mut v = version.to_be_bytes().to_vec();
    let mut x = version | 1;
    v.extend((8..len).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    Bytes::from(v)
}

/// Checks an object read under `k`; returns its version.
fn verify(k: &str, obj: &inlay_storage::StoredObject) -> u64 {
    assert!(obj.body.len() >= 8, "{k}: body of {} bytes", obj.body.len());
    let mut b = [0u8; 8];
    b.copy_from_slice(&obj.body[..8]);
    let version = u64::from_be_bytes(b);
    assert_eq!(key(version), k, "{k} holds the body of version {version}");
    assert!(
        obj.body == body(version),
        "{k}: body of version {version} damaged"
    );
    assert_eq!(obj.meta.body_len, obj.body.len() as u64);
    assert_eq!(obj.meta.etag.as_deref(), Some(version.to_string().as_str()));
    version
}

fn meta(version: u64, tags: &[&str]) -> ObjectMeta {
    ObjectMeta {
        status: 200,
        stored_at_ms: now_ms(),
        ttl_ms: 3_600_000,
        grace_ms: 3_600_000,
        etag: Some(version.to_string()),
        surrogate_keys: tags.iter().map(|s| s.to_string()).collect(),
        ..ObjectMeta::default()
    }
}

/// The child half. Ignored in normal runs; the tests below run it with the
/// environment set. Never returns normally in child mode: it is killed.
#[test]
#[ignore = "child process of the crash tests"]
fn crash_child() {
    let (Ok(dir), Ok(mode)) = (std::env::var(DIR_ENV), std::env::var(MODE_ENV)) else {
        return;
    };
    let store = TieredStore::open(config(Path::new(&dir))).unwrap();
    if let Some(first) = mode.strip_prefix("write:") {
        let first: u64 = first.parse().unwrap();
        for v in first.. {
            store.put(&key(v), meta(v, &["w"]), body(v)).unwrap();
            if v - first == BEFORE_FLUSH {
                store.flush().unwrap();
                say(&format!("FLUSHED {v}"));
            }
        }
    } else {
        for i in 0..30 {
            store
                .put(&format!("doomed{i}\u{1}"), meta(i, &["doomed"]), body(i))
                .unwrap();
            store
                .put(&format!("stale{i}\u{1}"), meta(i, &["soft"]), body(i))
                .unwrap();
            store
                .put(&format!("url{}\u{1}v{i}", i % 3), meta(i, &[]), body(i))
                .unwrap();
        }
        store.flush().unwrap();
        assert_eq!(store.purge_surrogate("doomed", false).unwrap(), 30);
        assert_eq!(store.purge_surrogate("soft", true).unwrap(), 30);
        assert_eq!(store.remove_prefix("url1\u{1}").unwrap(), 10);
        say("PURGED");
        // Keep the engine busy until the kill.
        for v in 1_000_000.. {
            store.put(&key(v), meta(v, &["w"]), body(v)).unwrap();
        }
    }
}

/// Tells the parent something; flushed, since stdout may be block-buffered
/// when it is a pipe.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn spawn_child(dir: &Path, mode: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir)
        .env(MODE_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Reads the child's stdout until a line containing `marker`.
fn wait_for(child: &mut Child, marker: &str) -> String {
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next() {
            // The harness prints "test crash_child ... " without a newline
            // first, so the marker can be mid-line.
            Some(Ok(line)) if line.contains(marker) => {
                // Keep draining so the child never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines {});
                return line;
            }
            Some(Ok(_)) => {}
            other => {
                let status = child.wait();
                panic!("child ended before {marker:?}: {other:?}, {status:?}");
            }
        }
    }
}

fn kill(child: &mut Child) {
    // std's kill sends SIGKILL on Unix: no destructor, no flush.
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn sigkill_during_writes_leaves_only_intact_objects() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    for round in 0..4u64 {
        let first = round * 1_000_000_000;
        let mut child = spawn_child(&db, &format!("write:{first}"));
        let line = wait_for(&mut child, "FLUSHED");
        // Let it write (and overwrite) for a while past the flush.
        std::thread::sleep(Duration::from_millis(60 + 90 * round));
        kill(&mut child);

        let store = TieredStore::open(config(&db)).unwrap();
        let mut intact = 0;
        let mut this_round = 0;
        for k in 0..KEYS {
            let k = key(k);
            if let Some(obj) = store.get(&k).unwrap() {
                let v = verify(&k, &obj);
                intact += 1;
                this_round += u64::from(v >= first);
            }
        }
        let stats = store.stats();
        eprintln!(
            "round {round}: {line}; {intact} intact, {this_round} from this round; {stats:?}"
        );
        // Everything written before the flush is durable: the keys of the
        // first BEFORE_FLUSH + 1 versions of this round exist (possibly in a
        // newer version).
        assert!(
            this_round > BEFORE_FLUSH,
            "flushed writes lost: {this_round}"
        );
        assert!(
            !stats.disk_recreated,
            "a crash must not need a fresh database"
        );
        drop(store);
    }
}

#[test]
fn sigkill_right_after_purge_keeps_purged_objects_gone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let mut child = spawn_child(&db, "purge");
    wait_for(&mut child, "PURGED");
    kill(&mut child);

    let store = TieredStore::open(config(&db)).unwrap();
    let now = now_ms();
    for i in 0..30 {
        assert!(
            store.get(&format!("doomed{i}\u{1}")).unwrap().is_none(),
            "doomed{i} came back"
        );
        let stale = store
            .get(&format!("stale{i}\u{1}"))
            .unwrap()
            .expect("soft-purged object lost");
        assert!(!stale.meta.is_fresh(now), "stale{i} is fresh again");
        assert!(stale.meta.in_grace(now));
        assert_eq!(stale.body, body(i));
        let url = store.get(&format!("url{}\u{1}v{i}", i % 3)).unwrap();
        assert_eq!(url.is_some(), i % 3 != 1, "url{}\u{1}v{i}", i % 3);
    }
    assert!(store.keys_for_surrogate("doomed").unwrap().is_empty());
    assert_eq!(store.keys_for_surrogate("soft").unwrap().len(), 30);
}

//! Opening never fails because of a damaged database: it is moved aside to
//! `<dir>.corrupt-<unix_ts>` and a fresh one is used. A locked database, or
//! one the system will not let us open, is never moved aside.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use inlay_storage::{ObjectMeta, ObjectStore, StoreConfig, StoreError, TieredStore, now_ms};

fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        dir: Some(dir.to_path_buf()),
        memory_bytes: 1 << 20,
        disk_bytes: 64 << 20,
        sweep_interval: Duration::from_secs(3600),
        ..StoreConfig::default()
    }
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        status: 200,
        stored_at_ms: now_ms(),
        ttl_ms: 3_600_000,
        ..ObjectMeta::default()
    }
}

fn body(i: usize) -> Bytes {
    Bytes::from(vec![(i % 251) as u8; 20_000 + i * 1000])
}

fn garbage(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Siblings of `db` named `<db>.corrupt-*`.
fn moved_aside(db: &Path) -> Vec<PathBuf> {
    let name = format!("{}.corrupt-", db.file_name().unwrap().to_string_lossy());
    let mut v: Vec<PathBuf> = std::fs::read_dir(db.parent().unwrap())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn fill_with_garbage(db: &Path, seed: u64) {
    std::fs::create_dir_all(db.join("blobs")).unwrap();
    std::fs::write(db.join("conf"), garbage(200, seed)).unwrap();
    std::fs::write(db.join("db"), garbage(1 << 20, seed + 1)).unwrap();
    std::fs::write(db.join("snap.00000000000000A0"), garbage(5000, seed + 2)).unwrap();
    std::fs::write(db.join("blobs").join("42"), garbage(100, seed + 3)).unwrap();
}

#[test]
fn garbage_directory_is_moved_aside_and_the_store_opens_empty() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cache");
    fill_with_garbage(&db, 7);
    let s = TieredStore::open(config(&db)).unwrap();
    assert!(s.stats().disk_recreated);
    assert_eq!(s.stats().disk_objects, 0);
    let aside = moved_aside(&db);
    assert_eq!(aside.len(), 1, "{aside:?}");
    // The garbage is kept for inspection, untouched.
    assert_eq!(
        std::fs::read(aside[0].join("db")).unwrap(),
        garbage(1 << 20, 8)
    );
    // The fresh database works and persists.
    s.put("k", meta(), body(1)).unwrap();
    drop(s);
    let s = TieredStore::open(config(&db)).unwrap();
    assert!(!s.stats().disk_recreated);
    assert_eq!(s.get("k").unwrap().unwrap().body, body(1));
    assert_eq!(moved_aside(&db).len(), 1);
}

#[test]
fn a_file_where_the_directory_should_be_is_refused_and_left_alone() {
    // A mistyped `cache.dir` naming some file of the user's must not be
    // renamed: that file is not a damaged database.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cache");
    std::fs::write(&db, b"not a directory").unwrap();
    match TieredStore::open(config(&db)) {
        Err(StoreError::Open { dir: d, error }) => {
            assert_eq!(d, db);
            let text = StoreError::Open { dir: d, error }.to_string();
            assert!(text.contains("cannot open the storage directory"), "{text}");
        }
        Err(e) => panic!("expected Open, got {e:?}"),
        Ok(_) => panic!("opened a store over a file"),
    }
    assert!(moved_aside(&db).is_empty());
    assert_eq!(std::fs::read(&db).unwrap(), b"not a directory");
}

#[test]
fn a_database_inside_a_file_is_refused_and_nothing_is_moved() {
    // ENOTDIR on the way to the directory: the system's error, not the
    // database's.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let db = file.join("cache");
    assert!(matches!(
        TieredStore::open(config(&db)),
        Err(StoreError::Open { .. })
    ));
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn repeated_corruption_keeps_at_most_two_old_copies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cache");
    for round in 0..4 {
        if db.exists() {
            std::fs::remove_dir_all(&db).unwrap();
        }
        fill_with_garbage(&db, round * 10);
        let s = TieredStore::open(config(&db)).unwrap();
        assert!(s.stats().disk_recreated);
    }
    let aside = moved_aside(&db);
    assert_eq!(aside.len(), 2, "{aside:?}");
    // The newest copies are the ones kept.
    let newest: Vec<Vec<u8>> = aside
        .iter()
        .map(|p| std::fs::read(p.join("conf")).unwrap())
        .collect();
    assert!(newest.contains(&garbage(200, 30)));
    assert!(newest.contains(&garbage(200, 20)));
}

#[test]
fn damaged_log_file_never_yields_damaged_objects() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cache");
    {
        let s = TieredStore::open(config(&db)).unwrap();
        for i in 0..40 {
            s.put(&format!("k{i}"), meta(), body(i)).unwrap();
        }
    }
    // Scribble over the middle of sled's log, as a torn or bad sector would.
    let log = db.join("db");
    let mut data = std::fs::read(&log).unwrap();
    let mid = data.len() / 2;
    let end = (mid + 200_000).min(data.len());
    data[mid..end].copy_from_slice(&garbage(end - mid, 99));
    std::fs::write(&log, data).unwrap();

    // sled may recover a prefix of the log, or refuse it (then it is moved
    // aside): either way the store opens, and whatever it serves is intact.
    let s = TieredStore::open(config(&db)).unwrap();
    let mut intact = 0;
    for i in 0..40 {
        match s.get(&format!("k{i}")) {
            Ok(Some(obj)) => {
                assert_eq!(obj.body, body(i), "k{i} damaged");
                intact += 1;
            }
            Ok(None) => {}
            Err(e) => eprintln!("k{i}: {e}"),
        }
    }
    eprintln!(
        "after damaging the log: {intact}/40 intact, recreated: {}, {:?}",
        s.stats().disk_recreated,
        s.stats()
    );
    s.put("new", meta(), body(3)).unwrap();
    assert_eq!(s.get("new").unwrap().unwrap().body, body(3));
}

#[test]
fn a_locked_database_is_refused_not_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cache");
    let first = TieredStore::open(config(&db)).unwrap();
    first.put("k", meta(), body(4)).unwrap();
    match TieredStore::open(config(&db)) {
        Err(StoreError::Locked(p)) => assert_eq!(p, db),
        Err(e) => panic!("expected Locked, got {e:?}"),
        Ok(_) => panic!("a second store opened a locked database"),
    }
    assert!(moved_aside(&db).is_empty());
    assert_eq!(first.get("k").unwrap().unwrap().body, body(4));
}

//! Per-operation timings of the object store: memory hit, disk hit and put
//! for 16 KiB and 1 MiB bodies.
//!
//! Run: `cargo bench -p inlay-storage --bench store`
//!
//! "Disk hit" uses a memory tier too small to admit the objects, so every
//! get reads and verifies the chunks from sled (whose page cache and the OS
//! page cache are warm, as they are for a hot object in production).

// `criterion_group!` generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use inlay_storage::{ObjectMeta, ObjectStore, StoreConfig, TieredStore, now_ms};

fn meta() -> ObjectMeta {
    ObjectMeta {
        status: 200,
        headers: vec![
            ("content-type".into(), b"text/html; charset=utf-8".to_vec()),
            ("cache-control".into(), b"max-age=3600".to_vec()),
        ],
        stored_at_ms: now_ms(),
        ttl_ms: 3_600_000,
        surrogate_keys: vec!["page".into()],
        ..ObjectMeta::default()
    }
}

fn body(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>())
}

fn gets(c: &mut Criterion) {
    let sizes = [("16k", 16 * 1024), ("1m", 1024 * 1024)];
    let memory = TieredStore::open(StoreConfig::memory_only(256 << 20)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = TieredStore::open(StoreConfig {
        dir: Some(dir.path().to_path_buf()),
        memory_bytes: 64 * 1024,
        sweep_interval: Duration::from_secs(3600),
        ..StoreConfig::default()
    })
    .unwrap();
    let mut g = c.benchmark_group("get");
    for (name, len) in sizes {
        let key = format!("obj-{name}\u{1}");
        memory.put(&key, meta(), body(len)).unwrap();
        disk.put(&key, meta(), body(len)).unwrap();
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("memory_hit_{name}"), |b| {
            b.iter(|| black_box(memory.get(&key).unwrap().unwrap()))
        });
        g.bench_function(format!("disk_hit_{name}"), |b| {
            b.iter(|| black_box(disk.get(&key).unwrap().unwrap()))
        });
    }
    g.finish();
    assert_eq!(
        disk.stats().hits_memory,
        0,
        "disk benchmark was served from memory"
    );

    let mut g = c.benchmark_group("put");
    for (name, len) in sizes {
        let data = body(len);
        g.throughput(Throughput::Bytes(len as u64));
        let mut i = 0u64;
        g.bench_function(format!("memory_{name}"), |b| {
            b.iter(|| {
                i += 1;
                memory
                    .put(&format!("p{}", i % 64), meta(), data.clone())
                    .unwrap()
            })
        });
        g.bench_function(format!("disk_{name}"), |b| {
            b.iter(|| {
                i += 1;
                disk.put(&format!("p{}", i % 64), meta(), data.clone())
                    .unwrap()
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    targets = gets
}
criterion_main!(benches);

//! Writes far more than the disk bound through a store and prints how the
//! logical size (what `disk_bytes` bounds) compares with sled's files.
//!
//! Run: `cargo run --release -p inlay-storage --example disk_soak -- [dir] [disk_mib] [write_mib] [object_kib]`
//! (defaults: a temporary directory, 128 MiB bound, 1024 MiB written, 256 KiB objects).

use std::time::{Duration, Instant};

use bytes::Bytes;
use inlay_storage::{ObjectMeta, ObjectStore, StoreConfig, TieredStore, now_ms};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tmp;
    let dir = match args.first() {
        Some(d) if d != "-" => std::path::PathBuf::from(d),
        _ => {
            tmp = std::env::temp_dir().join(format!("inlay-soak-{}", std::process::id()));
            tmp.clone()
        }
    };
    let arg = |i: usize, default: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (disk_mib, write_mib, object_kib) = (arg(1, 128), arg(2, 1024), arg(3, 256));
    let store = TieredStore::open(StoreConfig {
        dir: Some(dir.clone()),
        memory_bytes: 16 << 20,
        disk_bytes: disk_mib << 20,
        sweep_interval: Duration::from_secs(3600),
        ..StoreConfig::default()
    })
    .expect("open store");
    let body = Bytes::from(vec![0x5a_u8; (object_kib << 10) as usize]);
    let n = (write_mib << 10) / object_kib;
    let start = Instant::now();
    for i in 0..n {
        let meta = ObjectMeta {
            status: 200,
            stored_at_ms: now_ms(),
            ttl_ms: 3_600_000,
            ..ObjectMeta::default()
        };
        store
            .put(&format!("obj{i}\u{1}"), meta, body.clone())
            .expect("put");
        if (i + 1) % (n / 8).max(1) == 0 {
            let s = store.stats();
            println!(
                "{:>6} MiB written: logical {:>5} MiB, files {:>5} MiB ({:.1}x), {} objects, {} evicted",
                ((i + 1) * object_kib) >> 10,
                s.disk_bytes >> 20,
                s.disk_file_bytes >> 20,
                s.disk_file_bytes as f64 / s.disk_bytes.max(1) as f64,
                s.disk_objects,
                s.evicted_disk
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{n} puts in {secs:.1} s: {:.0} MiB/s",
        write_mib as f64 / secs
    );
    drop(store);
    if args.first().is_none_or(|d| d == "-") {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

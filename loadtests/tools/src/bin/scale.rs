//! `inlay-scale`: the disk tier at scale, through the storage crate's API.
//!
//! * `inlay-scale fill --dir D --count N`: opens a disk tier in `D` and puts
//!   `N` small objects (200 B bodies by default, two headers each), then
//!   flushes; prints the fill rate and this process's RSS per object.
//! * `inlay-scale probe --dir D --count N`: what a restart sees: the time
//!   from `main()` to the store being open and to the first hit, RSS after
//!   open and after the lookups, then `--lookups` gets of random stored
//!   keys (and a quarter as many absent keys), each timed: p50, p99, p99.9;
//!   with `--settle`, only after the store's background count is done.
//! * `inlay-scale memory --count N`: the same lookups against a
//!   memory-only store holding `N` such objects: what a hash table in RAM
//!   costs at that size, the floor for a disk tier whose index is in
//!   memory.
//!
//! The memory tier is set to its minimum (64 KiB) so lookups measure the
//! disk tier (sled's index and the chunk files); the share of memory hits
//! is printed. Keys look like the host's (`<32 hex digits>\u{1}`).
//! Figures and commands: `loadtests/reports/scale.md`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use inlay_loadtools::{Percentiles, ProcMemory, SplitMix};
use inlay_storage::{ObjectMeta, ObjectStore, StoreConfig, TieredStore, now_ms};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "Disk-tier scale bench: fill N small objects, then probe a restart")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Fill a disk tier with `count` small objects.
    Fill {
        /// Directory of the disk tier (created; must not hold another store).
        #[arg(long)]
        dir: PathBuf,
        /// Number of objects.
        #[arg(long)]
        count: u64,
        /// Body size in bytes.
        #[arg(long, default_value_t = 200)]
        body: usize,
        /// Writer threads.
        #[arg(long, default_value_t = 2)]
        threads: u64,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Fill a memory-only store with `count` small objects and time the
    /// same lookups as `probe`.
    Memory {
        /// Number of objects.
        #[arg(long)]
        count: u64,
        /// Timed lookups of stored keys.
        #[arg(long, default_value_t = 20_000)]
        lookups: u64,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Reopen a filled disk tier and time the first hit and lookups.
    Probe {
        /// Directory of the disk tier.
        #[arg(long)]
        dir: PathBuf,
        /// Number of objects `fill` stored.
        #[arg(long)]
        count: u64,
        /// Timed lookups of stored keys.
        #[arg(long, default_value_t = 20_000)]
        lookups: u64,
        /// The disk tier's index memory in MiB (`cache.disk_index_cache`:
        /// three quarters hold records in memory, one is sled's cache;
        /// absent: the store's default, derived from `disk_bytes`, here
        /// 64 GiB: 1 GiB).
        #[arg(long, alias = "sled-cache-mib")]
        index_cache_mib: Option<u64>,
        /// Time the lookups only after the store's background count (which
        /// reads every record once) has finished; prints how long it took.
        #[arg(long)]
        settle: bool,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// The key of object `i`: 32 hex digits like the host's primary key hash,
/// then the variant separator and an empty variant.
fn key(i: u64) -> String {
    let mut a = SplitMix::new(i);
    format!("{:016x}{:016x}\u{1}", a.next_u64(), a.next_u64())
}

fn config(dir: PathBuf) -> StoreConfig {
    StoreConfig {
        dir: Some(dir),
        // The smallest memory tier: lookups go to the disk tier.
        memory_bytes: 64 * 1024,
        disk_bytes: 64 << 30,
        sweep_interval: Duration::from_secs(24 * 3600),
        ..StoreConfig::default()
    }
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        status: 200,
        headers: vec![
            ("content-type".into(), b"application/octet-stream".to_vec()),
            ("cache-control".into(), b"public, max-age=3600".to_vec()),
        ],
        stored_at_ms: now_ms(),
        ttl_ms: 30 * 24 * 3_600_000,
        ..ObjectMeta::default()
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let started = Instant::now();
    if let Err(e) = run(Args::parse(), started) {
        eprintln!("inlay-scale: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args, started: Instant) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Fill {
            dir,
            count,
            body,
            threads,
            json,
        } => fill(dir, count, body, threads.max(1), json),
        Cmd::Memory {
            count,
            lookups,
            json,
        } => memory(count, lookups, json),
        Cmd::Probe {
            dir,
            count,
            lookups,
            index_cache_mib,
            settle,
            json,
        } => {
            let mut cfg = config(dir);
            if let Some(mib) = index_cache_mib {
                cfg.disk_cache_bytes = mib << 20;
            }
            probe(cfg, count, lookups, settle, json, started)
        }
    }
}

fn fill(
    dir: PathBuf,
    count: u64,
    body: usize,
    threads: u64,
    json_out: Option<PathBuf>,
) -> anyhow::Result<()> {
    if count == 0 {
        bail!("--count must be at least 1");
    }
    let store = Arc::new(TieredStore::open(config(dir.clone())).context("opening the store")?);
    let empty = ProcMemory::read("self")?;
    let data = Bytes::from(
        (0..body)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<u8>>(),
    );
    let t = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|w| {
            let (store, data) = (store.clone(), data.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut i = w;
                while i < count {
                    store.put(&key(i), meta(), data.clone())?;
                    if w == 0 && i % 100_000 < threads {
                        eprintln!("  {i} objects, {:.0} s", t.elapsed().as_secs_f64());
                    }
                    i += threads;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    store.flush()?;
    let secs = t.elapsed().as_secs_f64();
    let mem = ProcMemory::read("self")?;
    let stats = store.stats();
    let per_object = (mem.rss_kib.saturating_sub(empty.rss_kib)) as f64 * 1024.0 / count as f64;
    println!(
        "filled {count} objects of {body} B in {secs:.1} s ({:.0}/s); RSS {:.1} MiB (empty store {:.1} MiB, VmHWM {:.1} MiB): {per_object:.0} B per object; disk tier {} objects, {:.1} MiB logical, sled files {:.1} MiB",
        count as f64 / secs,
        mib(mem.rss_kib),
        mib(empty.rss_kib),
        mib(mem.hwm_kib),
        stats.disk_objects,
        stats.disk_bytes as f64 / (1 << 20) as f64,
        stats.disk_file_bytes as f64 / (1 << 20) as f64,
    );
    let doc = json!({
        "dir": dir, "count": count, "body": body, "threads": threads,
        "fill_secs": secs, "objects_per_sec": count as f64 / secs,
        "rss_empty_kib": empty.rss_kib, "rss_kib": mem.rss_kib, "hwm_kib": mem.hwm_kib,
        "rss_bytes_per_object": per_object,
        "stats": stats,
    });
    write_json(json_out, &doc);
    Ok(())
}

fn probe(
    cfg: StoreConfig,
    count: u64,
    lookups: u64,
    settle: bool,
    json_out: Option<PathBuf>,
    started: Instant,
) -> anyhow::Result<()> {
    if count == 0 {
        bail!("--count must be at least 1");
    }
    let dir = cfg.dir.clone().context("no directory")?;
    if !dir.join("db").exists() && std::fs::read_dir(&dir).map_or(true, |mut d| d.next().is_none())
    {
        bail!(
            "{} holds no store: run `inlay-scale fill` first",
            dir.display()
        );
    }
    let sled_cache_bytes = cfg.sled_cache_bytes();
    let record_cache_bytes = cfg.record_cache_bytes();
    let store = TieredStore::open(cfg).context("opening the store")?;
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut rng = SplitMix::new(0x5ca1e);
    let first = key(rng.below(count));
    let hit = store.get(&first)?.is_some();
    let first_hit_ms = started.elapsed().as_secs_f64() * 1e3;
    if !hit {
        bail!("the first lookup missed: is --count the number `fill` stored?");
    }
    let after_open = ProcMemory::read("self")?;
    let counted_ms = if settle {
        let deadline = Instant::now() + Duration::from_secs(3600);
        while !store.stats().disk_counted {
            if Instant::now() > deadline {
                bail!("the background count did not finish within an hour");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        println!("background count finished {ms:.0} ms after main()");
        Some(ms)
    } else {
        None
    };

    let (p, a, misses) = time_lookups(&store, count, lookups, &mut rng)?;
    let after = ProcMemory::read("self")?;
    let stats = store.stats();
    println!(
        "{count} objects: open {open_ms:.0} ms, first hit {first_hit_ms:.0} ms after main(); RSS after open {:.1} MiB, after lookups {:.1} MiB (VmHWM {:.1} MiB)",
        mib(after_open.rss_kib),
        mib(after.rss_kib),
        mib(after.hwm_kib)
    );
    println!(
        "  hit lookups ({}): p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us; absent keys ({}): p50 {:.1} us, p99 {:.1} us; memory hits {}, disk hits {}, wrong answers {misses}",
        p.count,
        p.p50_us,
        p.p99_us,
        p.p999_us,
        p.max_us,
        a.count,
        a.p50_us,
        a.p99_us,
        stats.hits_memory,
        stats.hits_disk
    );
    println!(
        "  record index: {} records, {:.1} MiB of its {:.1} MiB, {} ({:.0} B per record); sled cache {:.1} MiB",
        stats.disk_index_records,
        stats.disk_index_bytes as f64 / (1 << 20) as f64,
        record_cache_bytes as f64 / (1 << 20) as f64,
        if stats.disk_index_complete {
            "every record"
        } else {
            "not every record"
        },
        stats.disk_index_bytes as f64 / stats.disk_index_records.max(1) as f64,
        sled_cache_bytes as f64 / (1 << 20) as f64,
    );
    let doc = json!({
        "dir": dir, "count": count, "lookups": lookups, "sled_cache_bytes": sled_cache_bytes,
        "record_cache_bytes": record_cache_bytes,
        "open_ms": open_ms, "first_hit_ms": first_hit_ms,
        "settle": settle, "counted_ms": counted_ms,
        "rss_after_open_kib": after_open.rss_kib, "rss_after_lookups_kib": after.rss_kib,
        "hwm_kib": after.hwm_kib,
        "hit": p.to_json(), "absent": a.to_json(), "wrong_answers": misses,
        "stats": stats,
    });
    write_json(json_out, &doc);
    if misses > 0 {
        bail!("{misses} lookups answered wrongly (a stored key missed or an absent one hit)");
    }
    Ok(())
}

/// `lookups` gets of random stored keys and a quarter as many of keys never
/// stored, each timed; the percentiles of both and the wrong answers.
fn time_lookups(
    store: &TieredStore,
    count: u64,
    lookups: u64,
    rng: &mut SplitMix,
) -> anyhow::Result<(Percentiles, Percentiles, u64)> {
    let mut present = Vec::with_capacity(lookups as usize);
    let mut wrong = 0u64;
    for _ in 0..lookups {
        let k = key(rng.below(count));
        let t = Instant::now();
        let got = store.get(&k)?;
        present.push(t.elapsed());
        wrong += u64::from(got.is_none());
    }
    let mut absent = Vec::with_capacity((lookups / 4) as usize);
    for _ in 0..lookups / 4 {
        // Beyond the stored range: never stored.
        let k = key(count + 1 + rng.below(1 << 40));
        let t = Instant::now();
        let got = store.get(&k)?;
        absent.push(t.elapsed());
        wrong += u64::from(got.is_some());
    }
    Ok((Percentiles::of(&present), Percentiles::of(&absent), wrong))
}

fn memory(count: u64, lookups: u64, json_out: Option<PathBuf>) -> anyhow::Result<()> {
    if count == 0 {
        bail!("--count must be at least 1");
    }
    let store = TieredStore::open(StoreConfig {
        sweep_interval: Duration::from_secs(24 * 3600),
        ..StoreConfig::memory_only(8 << 30)
    })
    .context("opening the store")?;
    let data = Bytes::from(vec![b'a'; 200]);
    for i in 0..count {
        store.put(&key(i), meta(), data.clone())?;
    }
    let mem = ProcMemory::read("self")?;
    let mut rng = SplitMix::new(0x5ca1e);
    let (p, a, wrong) = time_lookups(&store, count, lookups, &mut rng)?;
    let stats = store.stats();
    println!(
        "memory-only, {count} objects ({} held; RSS {:.1} MiB): hit lookups ({}): p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us; absent keys ({}): p50 {:.1} us, p99 {:.1} us; wrong answers {wrong}",
        stats.memory_objects,
        mib(mem.rss_kib),
        p.count,
        p.p50_us,
        p.p99_us,
        p.p999_us,
        a.count,
        a.p50_us,
        a.p99_us,
    );
    write_json(
        json_out,
        &json!({
            "count": count, "lookups": lookups, "rss_kib": mem.rss_kib,
            "hit": p.to_json(), "absent": a.to_json(), "wrong_answers": wrong,
            "stats": stats,
        }),
    );
    if wrong > 0 {
        bail!("{wrong} lookups answered wrongly");
    }
    Ok(())
}

fn write_json(path: Option<PathBuf>, doc: &serde_json::Value) {
    if let Some(path) = path
        && let Err(e) = std::fs::write(&path, serde_json::to_string_pretty(doc).unwrap_or_default())
    {
        eprintln!("inlay-scale: writing {}: {e}", path.display());
    }
}

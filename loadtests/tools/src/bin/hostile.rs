//! `inlay-hostile`: hostile traffic against a running Inlay on loopback,
//! while a normal client measures its latency on a cached URL.
//!
//! One run has three phases: a short warm-up, a quiet phase (the normal
//! client alone) and an attack phase (the normal client beside slowloris
//! heads, slow readers, HTTP/2 zero-window streams, HTTP/2 rapid resets,
//! idle connections and random bytes). Inlay's `VmRSS`, `VmHWM` and open
//! descriptors are sampled from `/proc/PID` throughout. The verdict is the
//! issue's: the normal client's p99 during the attack within `--p99-factor`
//! (2x) of its quiet p99, for keep-alive requests and for requests on a
//! fresh connection, the peak RSS under `--rss-bound-mib`, and Inlay still
//! answering after the attack. Exit status 0 when every check passes, 1
//! when one fails, 2 when the run itself could not be made.
//!
//! Every count and duration is bounded by flags; the run ends by itself.
//! See `loadtests/README.md` ("Hostile traffic") for the command and the
//! meaning of each figure.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use inlay_loadtools::{Percentiles, ProcMemory, SplitMix, open_fds};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Parser)]
#[command(about = "Hostile traffic against Inlay on loopback, with a normal client measuring p99")]
struct Args {
    /// Inlay's address (loopback only).
    #[arg(long)]
    target: SocketAddr,
    /// The cached URL path the normal client requests.
    #[arg(long, default_value = "/static/177")]
    path: String,
    /// A large cached object for slow readers and zero-window streams.
    #[arg(long, default_value = "/static/1048576")]
    big_path: String,
    /// Inlay's process id, for /proc sampling (RSS and descriptors).
    #[arg(long)]
    pid: Option<u32>,
    /// Seconds of warm-up (normal client, not measured).
    #[arg(long, default_value_t = 3)]
    warm_secs: u64,
    /// Seconds of the quiet phase.
    #[arg(long, default_value_t = 20)]
    quiet_secs: u64,
    /// Seconds of the attack phase.
    #[arg(long, default_value_t = 60)]
    attack_secs: u64,
    /// Normal client: keep-alive requests per second (all connections).
    #[arg(long, default_value_t = 400)]
    client_rate: u64,
    /// Normal client: keep-alive connections.
    #[arg(long, default_value_t = 2)]
    client_conns: u64,
    /// Normal client: one request on a fresh connection every this many ms.
    #[arg(long, default_value_t = 100)]
    fresh_every_ms: u64,
    /// Normal client: a request slower than this counts as failed (and
    /// as this latency in the percentiles).
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// Idle connections (connect, send nothing).
    #[arg(long, default_value_t = 10_000)]
    idle: u64,
    /// Slowloris connections (a request head that never ends, a header
    /// line a second).
    #[arg(long, default_value_t = 500)]
    slowloris: u64,
    /// Slow readers (8 pipelined requests for the big object, a 4 KiB
    /// receive buffer, 64 bytes read a second).
    #[arg(long, default_value_t = 200)]
    slow_readers: u64,
    /// HTTP/2 connections announcing a zero stream window.
    #[arg(long, default_value_t = 20)]
    h2_zero_window: u64,
    /// Streams (requests for the big object) per zero-window connection.
    #[arg(long, default_value_t = 100)]
    h2_streams: u64,
    /// HTTP/2 rapid reset: connections.
    #[arg(long, default_value_t = 4)]
    reset_conns: u64,
    /// HTTP/2 rapid reset: streams opened and reset per second (all
    /// connections; 0 = as fast as the attacker's thread goes).
    #[arg(long, default_value_t = 5000)]
    resets_per_sec: u64,
    /// Connections per second that send random bytes.
    #[arg(long, default_value_t = 100)]
    garbage_per_sec: u64,
    /// Pass bound on Inlay's peak RSS (VmRSS samples and the final VmHWM), MiB.
    #[arg(long, default_value_t = 512)]
    rss_bound_mib: u64,
    /// Pass bound: attack p99 at most this many times the quiet p99.
    #[arg(long, default_value_t = 2.0)]
    p99_factor: f64,
    /// Write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run the attackers' thread on this CPU only (with `taskset` on
    /// Inlay and `--client-cpu`: the attack does not take Inlay's CPU).
    #[arg(long)]
    attack_cpu: Option<usize>,
    /// Run the normal client's thread on this CPU only.
    #[arg(long)]
    client_cpu: Option<usize>,
}

/// Pins the calling thread to `cpu` with `taskset` (no unsafe code here).
fn pin_this_thread(cpu: Option<usize>) -> anyhow::Result<()> {
    let Some(cpu) = cpu else {
        return Ok(());
    };
    let me = std::fs::read_link("/proc/thread-self").context("reading /proc/thread-self")?;
    let tid = me
        .file_name()
        .and_then(|t| t.to_str())
        .context("no thread id in /proc/thread-self")?
        .to_owned();
    let out = std::process::Command::new("taskset")
        .args(["-p", "-c", &cpu.to_string(), &tid])
        .output()
        .context("running taskset")?;
    if !out.status.success() {
        bail!(
            "taskset -p -c {cpu} {tid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

const WARM: u8 = 0;
const QUIET: u8 = 1;
const ATTACK: u8 = 2;
const DONE: u8 = 3;

/// One request of the normal client.
#[derive(Debug, Clone, Copy)]
struct Sample {
    phase: u8,
    fresh: bool,
    latency: Duration,
    ok: bool,
    /// Fresh connections: how long the TCP connect took (SYN to SYN-ACK,
    /// the kernel's part); the rest of `latency` is Inlay's accept, read,
    /// answer and the client's own scheduling.
    connect: Option<Duration>,
    /// When the request started, since the client started.
    at: Duration,
}

/// Counters of one attack.
#[derive(Debug, Default)]
struct Counters {
    /// Connections opened.
    opened: AtomicU64,
    /// Connections that failed to open (or to finish a handshake).
    connect_failed: AtomicU64,
    /// Connections the server closed (reset, EOF or GOAWAY) while attacking.
    closed_by_server: AtomicU64,
    /// Attack-specific unit: header lines, bytes read, streams, resets...
    units: AtomicU64,
    /// Second attack-specific figure (400 answers, responses received).
    answers: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    fn json(&self, units: &str, answers: &str) -> serde_json::Value {
        json!({
            "opened": self.opened.load(Ordering::Relaxed),
            "connect_failed": self.connect_failed.load(Ordering::Relaxed),
            "closed_by_server": self.closed_by_server.load(Ordering::Relaxed),
            units: self.units.load(Ordering::Relaxed),
            answers: self.answers.load(Ordering::Relaxed),
        })
    }
}

#[derive(Debug, Default)]
struct AttackStats {
    idle: Counters,
    slowloris: Counters,
    slow_readers: Counters,
    h2_zero_window: Counters,
    rapid_reset: Counters,
    garbage: Counters,
}

/// One /proc reading of Inlay.
#[derive(Debug, Clone, Copy)]
struct ProcSample {
    phase: u8,
    mem: ProcMemory,
    fds: Option<usize>,
    /// The kernel's TCP buffer memory, KiB (`/proc/net/sockstat`, the
    /// whole network namespace: both ends of every loopback connection).
    tcp_kib: Option<u64>,
    /// Inlay's CPU time so far (user and system), in clock ticks.
    cpu_ticks: Option<u64>,
    /// When it was taken.
    at: Instant,
}

fn main() {
    let args = Args::parse();
    match run(args) {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("inlay-hostile: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run(args: Args) -> anyhow::Result<bool> {
    if !args.target.ip().is_loopback() {
        bail!("--target {} is not a loopback address", args.target);
    }
    if args.client_rate == 0 || args.client_conns == 0 {
        bail!("--client-rate and --client-conns must be at least 1");
    }
    let pid = args.pid.map(|p| p.to_string());
    if let Some(p) = &pid {
        ProcMemory::read(p).with_context(|| format!("reading /proc/{p}/status"))?;
    }
    // The object must be cached before the quiet figure is taken.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for path in [&args.path, &args.big_path, &args.path] {
        let status = rt
            .block_on(one_request(args.target, path, Duration::from_secs(10)))
            .with_context(|| format!("warming {path}"))?;
        if status != 200 {
            bail!("warming {path}: status {status}, expected 200");
        }
    }
    drop(rt);

    let phase = Arc::new(AtomicU8::new(WARM));
    let stop = CancellationToken::new();
    let stats = Arc::new(AttackStats::default());

    // Each part on a thread of its own, so the attackers' work does not
    // delay the normal client's clock (they still share the machine's CPUs
    // with Inlay: that is part of what is measured).
    let client = {
        let (args, phase, stop) = (args.clone(), phase.clone(), stop.clone());
        std::thread::spawn(move || normal_client(args, phase, stop))
    };
    let sampler = {
        let (pid, phase, stop) = (pid.clone(), phase.clone(), stop.clone());
        std::thread::spawn(move || sample_proc(pid, phase, stop))
    };
    let attack_stop = CancellationToken::new();
    let started = Arc::new(AtomicU8::new(0));
    let attackers = {
        let (args, stats, attack_stop, started) = (
            args.clone(),
            stats.clone(),
            attack_stop.clone(),
            started.clone(),
        );
        std::thread::spawn(move || -> anyhow::Result<()> {
            pin_this_thread(args.attack_cpu)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            // Parked until the attack phase.
            while started.load(Ordering::Acquire) == 0 {
                if attack_stop.is_cancelled() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            rt.block_on(attack(args, stats, attack_stop));
            Ok(())
        })
    };

    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(args.warm_secs));
    phase.store(QUIET, Ordering::Release);
    eprintln!("quiet phase: {} s", args.quiet_secs);
    std::thread::sleep(Duration::from_secs(args.quiet_secs));
    phase.store(ATTACK, Ordering::Release);
    started.store(1, Ordering::Release);
    eprintln!("attack phase: {} s", args.attack_secs);
    std::thread::sleep(Duration::from_secs(args.attack_secs));
    phase.store(DONE, Ordering::Release);
    attack_stop.cancel();
    stop.cancel();
    let samples = client
        .join()
        .map_err(|_| anyhow::anyhow!("normal client panicked"))?;
    attackers
        .join()
        .map_err(|_| anyhow::anyhow!("attackers panicked"))??;
    let run_secs = t0.elapsed().as_secs_f64();

    // After the attack: does Inlay answer, and does it let go of what the
    // attackers held?
    std::thread::sleep(Duration::from_secs(2));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let after = rt.block_on(one_request(
        args.target,
        &args.path,
        Duration::from_millis(args.timeout_ms),
    ));
    let after_ok = matches!(after, Ok(200));
    let proc = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let end = pid
        .as_deref()
        .map(|p| (ProcMemory::read(p).unwrap_or_default(), open_fds(p).ok()));

    Ok(report(
        &args, &samples, &proc, &stats, end, after, after_ok, run_secs,
    ))
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    samples: &[Sample],
    proc: &[ProcSample],
    stats: &AttackStats,
    end: Option<(ProcMemory, Option<usize>)>,
    after: anyhow::Result<u16>,
    after_ok: bool,
    run_secs: f64,
) -> bool {
    let pick = |phase: u8, fresh: bool| -> (Percentiles, u64, u64) {
        let v: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.phase == phase && s.fresh == fresh)
            .collect();
        let lat: Vec<Duration> = v.iter().map(|s| s.latency).collect();
        let failed = v.iter().filter(|s| !s.ok).count() as u64;
        (Percentiles::of(&lat), v.len() as u64, failed)
    };
    let (ka_q, _, ka_q_fail) = pick(QUIET, false);
    let (ka_a, _, ka_a_fail) = pick(ATTACK, false);
    let (fr_q, _, fr_q_fail) = pick(QUIET, true);
    let (fr_a, _, fr_a_fail) = pick(ATTACK, true);
    let max_in = |phase: u8| {
        let rss = proc
            .iter()
            .filter(|p| p.phase == phase)
            .map(|p| p.mem.rss_kib)
            .max()
            .unwrap_or(0);
        let fds = proc
            .iter()
            .filter(|p| p.phase == phase)
            .filter_map(|p| p.fds)
            .max()
            .unwrap_or(0);
        let tcp = proc
            .iter()
            .filter(|p| p.phase == phase)
            .filter_map(|p| p.tcp_kib)
            .max()
            .unwrap_or(0);
        (rss, fds, tcp)
    };
    let (rss_q, fds_q, tcp_q) = max_in(QUIET);
    let (rss_a, fds_a, tcp_a) = max_in(ATTACK);
    let hwm = end.map(|(m, _)| m.hwm_kib).unwrap_or(0);
    let peak_kib = rss_a.max(rss_q).max(hwm);
    let bound_kib = args.rss_bound_mib * 1024;

    let ka_pass = ka_q.p99_within(&ka_a, args.p99_factor);
    let fr_pass = fr_q.p99_within(&fr_a, args.p99_factor);
    let rss_pass = args.pid.is_none() || peak_kib <= bound_kib;
    let pass = ka_pass && fr_pass && rss_pass && after_ok;
    let verdict = |ok: bool| if ok { "pass" } else { "FAIL" };

    let ms = |us: f64| us / 1000.0;
    println!(
        "normal client on {} ({} s run)",
        args.path,
        run_secs.round()
    );
    println!(
        "  keep-alive p50/p99/max ms: quiet {:.2}/{:.2}/{:.2} ({} req, {} failed); attack {:.2}/{:.2}/{:.2} ({} req, {} failed); p99 ratio {:.2}x (<= {}x): {}",
        ms(ka_q.p50_us),
        ms(ka_q.p99_us),
        ms(ka_q.max_us),
        ka_q.count,
        ka_q_fail,
        ms(ka_a.p50_us),
        ms(ka_a.p99_us),
        ms(ka_a.max_us),
        ka_a.count,
        ka_a_fail,
        ka_a.p99_us / ka_q.p99_us.max(1.0),
        args.p99_factor,
        verdict(ka_pass)
    );
    println!(
        "  fresh connection p50/p99/max ms: quiet {:.2}/{:.2}/{:.2} ({} req, {} failed); attack {:.2}/{:.2}/{:.2} ({} req, {} failed); p99 ratio {:.2}x (<= {}x): {}",
        ms(fr_q.p50_us),
        ms(fr_q.p99_us),
        ms(fr_q.max_us),
        fr_q.count,
        fr_q_fail,
        ms(fr_a.p50_us),
        ms(fr_a.p99_us),
        ms(fr_a.max_us),
        fr_a.count,
        fr_a_fail,
        fr_a.p99_us / fr_q.p99_us.max(1.0),
        args.p99_factor,
        verdict(fr_pass)
    );
    // Where a fresh connection's time goes: the TCP connect (the kernel
    // answers the SYN; a dropped SYN costs a 1 s retransmit) and the rest
    // (Inlay accepts, reads, answers).
    let fresh_parts = |phase: u8| {
        let v: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.phase == phase && s.fresh && s.ok)
            .collect();
        let connect: Vec<Duration> = v.iter().filter_map(|s| s.connect).collect();
        let rest: Vec<Duration> = v
            .iter()
            .filter_map(|s| s.connect.map(|c| s.latency.saturating_sub(c)))
            .collect();
        (Percentiles::of(&connect), Percentiles::of(&rest))
    };
    let (fc_q, fx_q) = fresh_parts(QUIET);
    let (fc_a, fx_a) = fresh_parts(ATTACK);
    println!(
        "  fresh connection, TCP connect p50/p99/max ms: quiet {:.2}/{:.2}/{:.2}; attack {:.2}/{:.2}/{:.2}",
        ms(fc_q.p50_us),
        ms(fc_q.p99_us),
        ms(fc_q.max_us),
        ms(fc_a.p50_us),
        ms(fc_a.p99_us),
        ms(fc_a.max_us),
    );
    println!(
        "  fresh connection, after the connect p50/p99/max ms: quiet {:.2}/{:.2}/{:.2}; attack {:.2}/{:.2}/{:.2}",
        ms(fx_q.p50_us),
        ms(fx_q.p99_us),
        ms(fx_q.max_us),
        ms(fx_a.p50_us),
        ms(fx_a.p99_us),
        ms(fx_a.max_us),
    );
    let mut slowest: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.phase == ATTACK && s.fresh)
        .collect();
    slowest.sort_by_key(|s| std::cmp::Reverse(s.latency));
    let attack_start = samples
        .iter()
        .filter(|s| s.phase == ATTACK)
        .map(|s| s.at)
        .min()
        .unwrap_or_default();
    let slowest: Vec<serde_json::Value> = slowest
        .iter()
        .take(10)
        .map(|s| {
            json!({
                "at_s": round3(s.at.saturating_sub(attack_start).as_secs_f64()),
                "ms": round3(s.latency.as_secs_f64() * 1000.0),
                "connect_ms": s.connect.map(|c| round3(c.as_secs_f64() * 1000.0)),
                "ok": s.ok,
            })
        })
        .collect();
    println!(
        "  fresh connection, slowest under attack (seconds into the attack, ms, connect ms): {}",
        slowest
            .iter()
            .map(|v| format!("{}s {}ms ({})", v["at_s"], v["ms"], v["connect_ms"]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if args.pid.is_some() {
        println!(
            "inlay RSS MiB: quiet max {:.1}, attack max {:.1}, VmHWM at end {:.1} (bound {} MiB): {}",
            rss_q as f64 / 1024.0,
            rss_a as f64 / 1024.0,
            hwm as f64 / 1024.0,
            args.rss_bound_mib,
            verdict(rss_pass)
        );
        // Inlay's CPU (ticks of 10 ms on Linux) over a span of samples.
        let cpu_share = |v: Vec<&ProcSample>| -> Option<f64> {
            let (a, b) = (v.first()?, v.last()?);
            let secs = b.at.duration_since(a.at).as_secs_f64();
            let ticks = b.cpu_ticks?.checked_sub(a.cpu_ticks?)?;
            (secs > 0.0).then(|| ticks as f64 / 100.0 / secs * 100.0)
        };
        let in_phase = |phase: u8| proc.iter().filter(move |p| p.phase == phase);
        let attack_start = in_phase(ATTACK).next().map(|p| p.at);
        let first = attack_start.map_or(Vec::new(), |t0| {
            in_phase(ATTACK)
                .filter(|p| p.at.duration_since(t0) <= Duration::from_secs(2))
                .collect()
        });
        let pct = |x: Option<f64>| x.map_or("?".to_string(), |x| format!("{x:.0}%"));
        println!(
            "inlay CPU (one CPU = 100%): quiet {}, attack {} (its first 2 s {})",
            pct(cpu_share(in_phase(QUIET).collect())),
            pct(cpu_share(in_phase(ATTACK).collect())),
            pct(cpu_share(first)),
        );
        println!(
            "kernel TCP buffers MiB (whole namespace, not in RSS): quiet max {:.1}, attack max {:.1}",
            tcp_q as f64 / 1024.0,
            tcp_a as f64 / 1024.0
        );
        println!(
            "inlay open fds: quiet max {fds_q}, attack max {fds_a}, 2 s after the attack {}",
            end.and_then(|(_, f)| f)
                .map_or("?".to_string(), |f| f.to_string())
        );
    }
    println!(
        "after the attack: {} ({})",
        match &after {
            Ok(s) => format!("status {s}"),
            Err(e) => format!("error: {e:#}"),
        },
        verdict(after_ok)
    );
    let attacks = json!({
        "idle": stats.idle.json("units", "answers"),
        "slowloris": stats.slowloris.json("header_lines_sent", "answers"),
        "slow_readers": stats.slow_readers.json("bytes_read", "requests_sent"),
        "h2_zero_window": stats.h2_zero_window.json("streams_opened", "response_heads"),
        "rapid_reset": stats.rapid_reset.json("streams_reset", "goaways_or_errors"),
        "garbage": stats.garbage.json("bytes_sent", "answered_400"),
    });
    println!("attacks: {attacks}");
    println!("verdict: {}", if pass { "PASS" } else { "FAIL" });

    let doc = json!({
        "target": args.target.to_string(),
        "path": args.path,
        "big_path": args.big_path,
        "run_secs": run_secs,
        "settings": {
            "quiet_secs": args.quiet_secs, "attack_secs": args.attack_secs,
            "client_rate": args.client_rate, "client_conns": args.client_conns,
            "fresh_every_ms": args.fresh_every_ms, "timeout_ms": args.timeout_ms,
            "idle": args.idle, "slowloris": args.slowloris, "slow_readers": args.slow_readers,
            "h2_zero_window": args.h2_zero_window, "h2_streams": args.h2_streams,
            "reset_conns": args.reset_conns, "resets_per_sec": args.resets_per_sec,
            "garbage_per_sec": args.garbage_per_sec,
        },
        "keepalive": {"quiet": ka_q.to_json(), "quiet_failed": ka_q_fail,
                      "attack": ka_a.to_json(), "attack_failed": ka_a_fail, "pass": ka_pass},
        "fresh": {"quiet": fr_q.to_json(), "quiet_failed": fr_q_fail,
                  "attack": fr_a.to_json(), "attack_failed": fr_a_fail, "pass": fr_pass,
                  "connect": {"quiet": fc_q.to_json(), "attack": fc_a.to_json()},
                  "after_connect": {"quiet": fx_q.to_json(), "attack": fx_a.to_json()},
                  "slowest_attack": slowest},
        "rss": {"quiet_max_kib": rss_q, "attack_max_kib": rss_a, "hwm_end_kib": hwm,
                "bound_mib": args.rss_bound_mib, "pass": rss_pass},
        "fds": {"quiet_max": fds_q, "attack_max": fds_a, "after": end.and_then(|(_, f)| f)},
        "kernel_tcp_kib": {"quiet_max": tcp_q, "attack_max": tcp_a},
        "rss_timeline": proc.iter().map(|p| json!([p.phase, p.mem.rss_kib, p.fds, p.tcp_kib, p.cpu_ticks])).collect::<Vec<_>>(),
        "after_attack_ok": after_ok,
        "attacks": attacks,
        "pass": pass,
    });
    if let Some(path) = &args.json
        && let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
    {
        eprintln!("inlay-hostile: writing {}: {e}", path.display());
    }
    pass
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A process's CPU time so far, user and system, in clock ticks
/// (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The kernel's TCP buffer memory in KiB: `mem` (pages) of the `TCP:`
/// line of /proc/net/sockstat (4 KiB pages). Socket buffers are not in
/// Inlay's RSS.
fn tcp_memory_kib() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("TCP:"))?;
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "mem" {
            return words.next()?.parse::<u64>().ok().map(|pages| pages * 4);
        }
    }
    None
}

/// Samples Inlay's memory every 200 ms and its descriptors every second.
fn sample_proc(
    pid: Option<String>,
    phase: Arc<AtomicU8>,
    stop: CancellationToken,
) -> Vec<ProcSample> {
    let mut out = Vec::new();
    let Some(pid) = pid else { return out };
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let Ok(mem) = ProcMemory::read(&pid) else {
            break;
        };
        let fds = if n.is_multiple_of(5) {
            open_fds(&pid).ok()
        } else {
            None
        };
        out.push(ProcSample {
            phase: phase.load(Ordering::Acquire),
            mem,
            fds,
            tcp_kib: tcp_memory_kib(),
            cpu_ticks: cpu_ticks(&pid),
            at: Instant::now(),
        });
        n += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    out
}

/// A GET on a new connection; the status.
async fn one_request(target: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<u16> {
    timed_request(target, path, timeout, &mut None).await
}

/// A GET on a new connection; the status. `connected` gets how long the
/// TCP connect took, once it is done.
async fn timed_request(
    target: SocketAddr,
    path: &str,
    timeout: Duration,
    connected: &mut Option<Duration>,
) -> anyhow::Result<u16> {
    let t = Instant::now();
    tokio::time::timeout(timeout, async {
        let mut sender = connect_h1(target).await?;
        *connected = Some(t.elapsed());
        get(&mut sender, target, path).await
    })
    .await
    .context("timed out")?
}

type H1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// The normal client's source address: real clients and an attacker do
/// not share one, and on loopback the attacks come from 127.0.0.1
/// (Inlay's `server.max_connections_per_client` counts by address).
const CLIENT_SOURCE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

async fn connect_h1(target: SocketAddr) -> anyhow::Result<H1> {
    let stream = match target {
        SocketAddr::V4(_) => {
            let sock = TcpSocket::new_v4()?;
            sock.bind(SocketAddr::from((CLIENT_SOURCE, 0)))?;
            sock.connect(target).await?
        }
        SocketAddr::V6(_) => TcpStream::connect(target).await?,
    };
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// A GET with the whole body read; the status.
async fn get(sender: &mut H1, target: SocketAddr, path: &str) -> anyhow::Result<u16> {
    sender.ready().await?;
    let req = http::Request::get(path)
        .header(http::header::HOST, target.to_string())
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await?;
    Ok(status)
}

/// The normal client: paced keep-alive requests and a request on a fresh
/// connection every `fresh_every_ms`, each timed; runs until `stop`.
fn normal_client(args: Args, phase: Arc<AtomicU8>, stop: CancellationToken) -> Vec<Sample> {
    if let Err(e) = pin_this_thread(args.client_cpu) {
        eprintln!("normal client: {e:#}");
        return Vec::new();
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    let t0 = Instant::now();
    rt.block_on(async move {
        let timeout = Duration::from_millis(args.timeout_ms);
        let mut tasks = JoinSet::new();
        let every = Duration::from_secs_f64(args.client_conns as f64 / args.client_rate as f64);
        for _ in 0..args.client_conns {
            let (args, phase, stop) = (args.clone(), phase.clone(), stop.clone());
            tasks.spawn(async move {
                let mut out = Vec::new();
                let mut sender: Option<H1> = None;
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let p = phase.load(Ordering::Acquire);
                    let t = Instant::now();
                    let res = tokio::time::timeout(timeout, async {
                        if sender.is_none() {
                            sender = Some(connect_h1(args.target).await?);
                        }
                        match sender.as_mut() {
                            Some(s) => get(s, args.target, &args.path).await,
                            None => unreachable!("connected above"),
                        }
                    })
                    .await;
                    let ok = matches!(res, Ok(Ok(200)));
                    if !ok {
                        sender = None;
                    }
                    out.push(Sample {
                        phase: p,
                        fresh: false,
                        latency: if ok {
                            t.elapsed()
                        } else {
                            timeout.max(t.elapsed())
                        },
                        ok,
                        connect: None,
                        at: t - t0,
                    });
                }
                out
            });
        }
        {
            let (args, phase, stop) = (args.clone(), phase.clone(), stop.clone());
            tasks.spawn(async move {
                let mut out = Vec::new();
                let mut tick =
                    tokio::time::interval(Duration::from_millis(args.fresh_every_ms.max(1)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let p = phase.load(Ordering::Acquire);
                    let t = Instant::now();
                    let mut connect = None;
                    let res = timed_request(args.target, &args.path, timeout, &mut connect).await;
                    let ok = matches!(res, Ok(200));
                    out.push(Sample {
                        phase: p,
                        fresh: true,
                        latency: if ok {
                            t.elapsed()
                        } else {
                            timeout.max(t.elapsed())
                        },
                        ok,
                        connect,
                        at: t - t0,
                    });
                }
                out
            });
        }
        let mut all = Vec::new();
        while let Some(r) = tasks.join_next().await {
            if let Ok(v) = r {
                all.extend(v);
            }
        }
        all
    })
}

/// Every attack, until `stop`; then every attacker connection is dropped.
async fn attack(args: Args, stats: Arc<AttackStats>, stop: CancellationToken) {
    let mut tasks = JoinSet::new();
    let args = Arc::new(args);
    // Idle connections first, one a millisecond: faster, the kernel's
    // accept queue overflows and the surplus stays half-open on the
    // server's side (the client thinks it is connected, Inlay never sees
    // it), which would measure the backlog rather than Inlay.
    for i in 0..args.idle {
        let (args, stats, stop) = (args.clone(), stats.clone(), stop.clone());
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_micros(i * 1000)).await;
            idle(&args, &stats.idle, &stop).await
        });
    }
    for i in 0..args.slowloris {
        let (args, stats, stop) = (args.clone(), stats.clone(), stop.clone());
        tasks.spawn(async move { slowloris(&args, &stats.slowloris, &stop, i).await });
    }
    for _ in 0..args.slow_readers {
        let (args, stats, stop) = (args.clone(), stats.clone(), stop.clone());
        tasks.spawn(async move { slow_reader(&args, &stats.slow_readers, &stop).await });
    }
    for _ in 0..args.h2_zero_window {
        let (args, stats, stop) = (args.clone(), stats.clone(), stop.clone());
        tasks.spawn(async move { h2_zero_window(&args, &stats.h2_zero_window, &stop).await });
    }
    for _ in 0..args.reset_conns {
        let (args, stats, stop) = (args.clone(), stats.clone(), stop.clone());
        tasks.spawn(async move { rapid_reset(&args, &stats.rapid_reset, &stop).await });
    }
    {
        let (args, stats, stop) = (args.clone(), stats.clone(), stop.clone());
        tasks.spawn(async move { garbage(&args, &stats.garbage, &stop).await });
    }
    stop.cancelled().await;
    // Attackers return on `stop`; whatever does not within 5 s is dropped.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
}

async fn connect(args: &Args, c: &Counters, stop: &CancellationToken) -> Option<TcpStream> {
    tokio::select! {
        _ = stop.cancelled() => None,
        r = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(args.target)) => match r {
            Ok(Ok(s)) => {
                Counters::add(&c.opened, 1);
                Some(s)
            }
            _ => {
                Counters::add(&c.connect_failed, 1);
                // Do not spin when the listener is saturated.
                tokio::time::sleep(Duration::from_millis(200)).await;
                None
            }
        }
    }
}

/// Connects and sends nothing; when the server closes, connects again.
async fn idle(args: &Args, c: &Counters, stop: &CancellationToken) {
    while !stop.is_cancelled() {
        let Some(mut s) = connect(args, c, stop).await else {
            continue;
        };
        let mut buf = [0u8; 512];
        tokio::select! {
            _ = stop.cancelled() => return,
            r = s.read(&mut buf) => {
                if let Ok(n) = r {
                    Counters::add(&c.answers, u64::from(n > 0));
                }
                Counters::add(&c.closed_by_server, 1);
            }
        }
    }
}

/// A request head that never ends: one header line a second.
async fn slowloris(args: &Args, c: &Counters, stop: &CancellationToken, i: u64) {
    // Spread the lines over the second.
    tokio::time::sleep(Duration::from_millis(i % 1000)).await;
    while !stop.is_cancelled() {
        let Some(mut s) = connect(args, c, stop).await else {
            continue;
        };
        let head = format!("GET {} HTTP/1.1\r\nHost: inlay\r\n", args.path);
        if s.write_all(head.as_bytes()).await.is_err() {
            Counters::add(&c.closed_by_server, 1);
            continue;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut buf = [0u8; 512];
        let mut k = 0u64;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                r = s.read(&mut buf) => {
                    if let Ok(n) = r {
                        Counters::add(&c.answers, u64::from(n > 0));
                    }
                    Counters::add(&c.closed_by_server, 1);
                    break;
                }
                _ = tick.tick() => {
                    k += 1;
                    if s.write_all(format!("X-Slow-{k}: {k}\r\n").as_bytes()).await.is_err() {
                        Counters::add(&c.closed_by_server, 1);
                        break;
                    }
                    Counters::add(&c.units, 1);
                }
            }
        }
    }
}

/// Pipelined requests for the big object, read 64 bytes a second through
/// a 4 KiB receive buffer.
async fn slow_reader(args: &Args, c: &Counters, stop: &CancellationToken) {
    while !stop.is_cancelled() {
        let conn = async {
            let sock = TcpSocket::new_v4()?;
            sock.set_recv_buffer_size(4096)?;
            sock.connect(args.target).await
        };
        let mut s = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(Duration::from_secs(5), conn) => match r {
                Ok(Ok(s)) => { Counters::add(&c.opened, 1); s }
                _ => {
                    Counters::add(&c.connect_failed, 1);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        };
        let one = format!("GET {} HTTP/1.1\r\nHost: inlay\r\n\r\n", args.big_path);
        if s.write_all(one.repeat(8).as_bytes()).await.is_err() {
            Counters::add(&c.closed_by_server, 1);
            continue;
        }
        Counters::add(&c.answers, 8);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut buf = [0u8; 64];
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match tokio::time::timeout(Duration::from_millis(10), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    Counters::add(&c.closed_by_server, 1);
                    break;
                }
                Ok(Ok(n)) => Counters::add(&c.units, n as u64),
                Err(_) => {}
            }
        }
    }
}

async fn h2_connect(
    args: &Args,
    c: &Counters,
    stop: &CancellationToken,
    window: Option<u32>,
) -> Option<(h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>)> {
    let s = connect(args, c, stop).await?;
    let mut b = h2::client::Builder::new();
    if let Some(w) = window {
        b.initial_window_size(w);
    }
    match tokio::time::timeout(Duration::from_secs(5), b.handshake::<_, Bytes>(s)).await {
        Ok(Ok((send, conn))) => {
            let driver = tokio::spawn(async move {
                let _ = conn.await;
            });
            Some((send, driver))
        }
        _ => {
            Counters::add(&c.connect_failed, 1);
            tokio::time::sleep(Duration::from_millis(200)).await;
            None
        }
    }
}

fn h2_get(args: &Args, path: &str) -> http::Request<()> {
    let uri = format!("http://{}{}", args.target, path);
    let mut req = http::Request::new(());
    *req.uri_mut() = uri.parse().unwrap_or_default();
    req
}

/// HTTP/2 with a zero initial stream window: the server may send headers
/// but no body bytes; streams for the big object stay open.
async fn h2_zero_window(args: &Args, c: &Counters, stop: &CancellationToken) {
    while !stop.is_cancelled() {
        let Some((mut send, mut driver)) = h2_connect(args, c, stop, Some(0)).await else {
            continue;
        };
        // Response heads received (they need no window); bodies kept unread.
        let heads = Arc::new(AtomicU64::new(0));
        let mut held = JoinSet::new();
        for _ in 0..args.h2_streams {
            let ready = tokio::time::timeout(Duration::from_secs(5), send.clone().ready()).await;
            let Ok(Ok(mut s)) = ready else { break };
            match s.send_request(h2_get(args, &args.big_path), true) {
                Ok((resp, _)) => {
                    Counters::add(&c.units, 1);
                    let heads = heads.clone();
                    held.spawn(async move {
                        if let Ok(r) = resp.await {
                            heads.fetch_add(1, Ordering::Relaxed);
                            // Keep the body unread: no WINDOW_UPDATE is sent.
                            let _body = r.into_body();
                            std::future::pending::<()>().await;
                        }
                    });
                }
                Err(_) => break,
            }
            send = s;
        }
        let closed = tokio::select! {
            _ = stop.cancelled() => false,
            _ = &mut driver => true,
        };
        Counters::add(&c.answers, heads.load(Ordering::Relaxed));
        held.abort_all();
        driver.abort();
        if !closed {
            return;
        }
        Counters::add(&c.closed_by_server, 1);
    }
}

/// HTTP/2 rapid reset: open a stream and cancel it at once, over and over.
async fn rapid_reset(args: &Args, c: &Counters, stop: &CancellationToken) {
    // Bursts every 10 ms to hold the rate without a timer per stream.
    let per_burst = if args.resets_per_sec == 0 {
        64
    } else {
        (args.resets_per_sec / 100 / args.reset_conns.max(1)).max(1)
    };
    while !stop.is_cancelled() {
        let Some((mut send, driver)) = h2_connect(args, c, stop, None).await else {
            continue;
        };
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        'conn: loop {
            if args.resets_per_sec > 0 {
                tokio::select! {
                    _ = stop.cancelled() => break 'conn,
                    _ = tick.tick() => {}
                }
            } else if stop.is_cancelled() {
                break 'conn;
            } else {
                tokio::task::yield_now().await;
            }
            for _ in 0..per_burst {
                let ready =
                    tokio::time::timeout(Duration::from_secs(5), send.clone().ready()).await;
                let Ok(Ok(mut s)) = ready else {
                    Counters::add(&c.answers, 1);
                    Counters::add(&c.closed_by_server, 1);
                    break 'conn;
                };
                match s.send_request(h2_get(args, &args.path), true) {
                    // Dropping both halves resets the stream (RST_STREAM CANCEL).
                    Ok((resp, stream)) => {
                        drop((resp, stream));
                        Counters::add(&c.units, 1);
                    }
                    Err(_) => {
                        Counters::add(&c.answers, 1);
                        Counters::add(&c.closed_by_server, 1);
                        break 'conn;
                    }
                }
                send = s;
            }
        }
        driver.abort();
    }
}

/// Connections that send random bytes (some after a plausible request
/// line or the HTTP/2 preface), then read what comes back for up to 2 s.
async fn garbage(args: &Args, c: &Counters, stop: &CancellationToken) {
    let per_sec = args.garbage_per_sec.max(1);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut rng = SplitMix::new(0x1417);
    let busy = Arc::new(tokio::sync::Semaphore::new(256));
    let mut set = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Ok(permit) = busy.clone().try_acquire_owned() else {
            continue;
        };
        let len = 1 + rng.below(16 * 1024) as usize;
        let mut bytes = match rng.below(4) {
            0 => Vec::new(),
            1 => format!("GET {} HTTP/1.1\r\n", args.path).into_bytes(),
            2 => b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            _ => b"GET / HTTP/1.1\r\nHost: inlay\r\nX-Long: ".to_vec(),
        };
        let start = bytes.len();
        bytes.resize(start + len, 0);
        rng.fill(&mut bytes[start..]);
        let target = args.target;
        let stop = stop.clone();
        set.spawn(async move {
            let _permit = permit;
            let mut out = GarbageOutcome::default();
            let Ok(Ok(mut s)) =
                tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(target)).await
            else {
                out.connect_failed = true;
                return out;
            };
            out.opened = true;
            if s.write_all(&bytes).await.is_ok() {
                out.bytes = bytes.len() as u64;
            }
            let mut buf = [0u8; 64];
            tokio::select! {
                _ = stop.cancelled() => {}
                r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)) => {
                    if let Ok(Ok(n)) = r {
                        out.answered_400 = buf[..n].starts_with(b"HTTP/1.1 400");
                        out.closed = true;
                    } else if let Ok(Err(_)) = r {
                        out.closed = true;
                    }
                }
            }
            out
        });
        while let Some(r) = set.try_join_next() {
            if let Ok(o) = r {
                o.count(c);
            }
        }
    }
    set.abort_all();
}

#[derive(Debug, Default)]
struct GarbageOutcome {
    opened: bool,
    connect_failed: bool,
    closed: bool,
    answered_400: bool,
    bytes: u64,
}

impl GarbageOutcome {
    fn count(&self, c: &Counters) {
        Counters::add(&c.opened, u64::from(self.opened));
        Counters::add(&c.connect_failed, u64::from(self.connect_failed));
        Counters::add(&c.closed_by_server, u64::from(self.closed));
        Counters::add(&c.answers, u64::from(self.answered_400));
        Counters::add(&c.units, self.bytes);
    }
}

//! `inlay-wsbench`: WebSockets through a proxy, with tokio-tungstenite.
//!
//! * `inlay-wsbench rtt --url ws://HOST:PORT/ws`: `--connections` WebSockets,
//!   each sending `--messages` text messages of `--size` bytes one after
//!   another to an echo and timing each round trip; prints p50, p99,
//!   p99.9 and the messages per second as one JSON line.
//! * `inlay-wsbench idle --url ws://HOST:PORT/ws --tunnels N`: opens `N`
//!   WebSockets (`--concurrency` handshakes at a time), holds them open and
//!   idle, and reports the resident memory of each `--pid` (the proxy's
//!   processes) before the first and once all are open, and so the memory
//!   per tunnel; then checks that every tunnel still echoes.
//!
//! Both stop by themselves; the figures and commands are in
//! `loadtests/reports/websocket.md` (`loadtests/scripts/websocket-bench.sh`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use inlay_loadtools::{Percentiles, ProcMemory};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, Parser)]
#[command(about = "WebSocket round trips and idle tunnels through a proxy")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Echo round trips, timed one by one.
    Rtt {
        /// The echo's URL (`ws://127.0.0.1:6081/ws`).
        #[arg(long)]
        url: String,
        /// WebSockets at once.
        #[arg(long, default_value_t = 50)]
        connections: usize,
        /// Messages per WebSocket, one after another.
        #[arg(long, default_value_t = 200)]
        messages: usize,
        /// Bytes per message.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Round trips per WebSocket not counted (the first ones).
        #[arg(long, default_value_t = 10)]
        warmup: usize,
        /// A label for the JSON line.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Idle tunnels held open, and the memory they cost.
    Idle {
        /// The echo's URL.
        #[arg(long)]
        url: String,
        /// WebSockets to open and hold.
        #[arg(long, default_value_t = 10_000)]
        tunnels: usize,
        /// Handshakes at a time.
        #[arg(long, default_value_t = 200)]
        concurrency: usize,
        /// How long to hold them idle once all are open, in seconds.
        #[arg(long, default_value_t = 10)]
        hold: u64,
        /// Processes whose resident memory is read (the proxy's; repeat
        /// for several, e.g. nginx's workers).
        #[arg(long)]
        pid: Vec<String>,
        /// A label for the JSON line.
        #[arg(long, default_value = "")]
        label: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    match Args::parse().cmd {
        Cmd::Rtt {
            url,
            connections,
            messages,
            size,
            warmup,
            label,
        } => rtt(&url, connections, messages, size, warmup, &label).await,
        Cmd::Idle {
            url,
            tunnels,
            concurrency,
            hold,
            pid,
            label,
        } => idle(&url, tunnels, concurrency, hold, &pid, &label).await,
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn open(url: &str) -> anyhow::Result<Ws> {
    let (ws, resp) = tokio::time::timeout(
        Duration::from_secs(30),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .context("no handshake within 30 s")??;
    if resp.status() != 101 {
        bail!("handshake answered {}", resp.status());
    }
    Ok(ws)
}

/// One echo round trip of `payload`.
async fn round_trip(ws: &mut Ws, payload: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    ws.send(Message::text(payload)).await?;
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .context("no echo within 10 s")?
            .context("the WebSocket closed")??;
        match msg {
            Message::Text(t) if t.as_str() == payload => return Ok(started.elapsed()),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => bail!("unexpected answer {other:?}"),
        }
    }
}

async fn rtt(
    url: &str,
    connections: usize,
    messages: usize,
    size: usize,
    warmup: usize,
    label: &str,
) -> anyhow::Result<()> {
    let payload: String = "x".repeat(size);
    let mut tasks = Vec::new();
    let started = Instant::now();
    for _ in 0..connections {
        let (url, payload) = (url.to_owned(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut ws = open(&url).await?;
            let mut samples = Vec::with_capacity(messages);
            for i in 0..warmup + messages {
                let took = round_trip(&mut ws, &payload).await?;
                if i >= warmup {
                    samples.push(took);
                }
            }
            let _ = ws.close(None).await;
            anyhow::Ok(samples)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed();
    let p = Percentiles::of(&all);
    println!(
        "{}",
        json!({
            "mode": "rtt",
            "label": label,
            "url": url,
            "connections": connections,
            "messages": messages,
            "size": size,
            "latency": p.to_json(),
            "messages_per_s": (all.len() as f64 / elapsed.as_secs_f64()).round(),
        })
    );
    Ok(())
}

/// Resident memory of `pids` together, in KiB.
fn rss_kib(pids: &[String]) -> u64 {
    pids.iter()
        .filter_map(|p| ProcMemory::read(p).ok())
        .map(|m| m.rss_kib)
        .sum()
}

async fn idle(
    url: &str,
    tunnels: usize,
    concurrency: usize,
    hold: u64,
    pids: &[String],
    label: &str,
) -> anyhow::Result<()> {
    let before = rss_kib(pids);
    let started = Instant::now();
    let mut open_ones: Vec<Ws> = Vec::with_capacity(tunnels);
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(tunnels);
    for _ in 0..tunnels {
        let (url, gate) = (url.to_owned(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            open(&url).await
        }));
    }
    for t in tasks {
        open_ones.push(t.await??);
    }
    let opened_in = started.elapsed();
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let held = rss_kib(pids);
    // Every one still carries an echo after its idle time.
    let mut checks = Vec::with_capacity(open_ones.len());
    for mut ws in open_ones {
        checks.push(tokio::spawn(async move {
            let took = round_trip(&mut ws, "still open").await;
            let _ = ws.close(None).await;
            took
        }));
    }
    let mut failed = 0usize;
    for c in checks {
        if !matches!(c.await, Ok(Ok(_))) {
            failed += 1;
        }
    }
    let per_tunnel = (held.saturating_sub(before) as f64 * 1024.0 / tunnels as f64).round();
    println!(
        "{}",
        json!({
            "mode": "idle",
            "label": label,
            "url": url,
            "tunnels": tunnels,
            "opened_in_s": (opened_in.as_secs_f64() * 10.0).round() / 10.0,
            "rss_before_kib": before,
            "rss_held_kib": held,
            "bytes_per_tunnel": per_tunnel,
            "echo_failed_after_hold": failed,
        })
    );
    if failed > 0 {
        bail!("{failed} of {tunnels} tunnels did not echo after {hold} s idle");
    }
    Ok(())
}

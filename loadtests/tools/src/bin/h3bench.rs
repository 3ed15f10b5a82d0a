//! `inlay-h3bench`: an HTTP/3 load client (quinn with hyperium's h3, the
//! stack Inlay's `quic://` listener uses, as a client).
//!
//! * `inlay-h3bench load --url https://localhost:PORT/PATH`: `--connections`
//!   QUIC connections with `--streams` requests in flight on each (a stream
//!   per request, the next sent once one is answered), for `--duration`
//!   seconds after `--warmup` ones; prints the requests per second, the
//!   bytes per second and the latency's p50 and p99 as one JSON line.
//! * `inlay-h3bench handshakes --url ...`: `--concurrency` workers, each
//!   opening a new QUIC connection per request (one GET, then close), for
//!   `--duration` seconds; prints handshakes per second and their latency
//!   (connect to last body byte). Full handshakes by default: the client
//!   keeps no TLS session, so none is resumed (`--resume` keeps them).
//!
//! * `inlay-h3bench relay --to ADDR --loss 1`: a UDP relay that drops
//!   `--loss` percent of the datagrams each way (at random, seeded), for
//!   QUIC under packet loss where the kernel has no `netem`; prints
//!   `relaying ADDR -> TO` and runs until killed. It is no help for TCP,
//!   which would see no loss through it, only a relay's delay.
//!
//! The load modes trust `--ca` (a PEM certificate, e.g. the self-signed one both
//! servers are given) and connect to `--connect` (default: the URL's host
//! and port) with the URL's host as the server name. With `--pid` (repeat
//! for several processes) they also read the processes' CPU time from
//! `/proc/PID/stat` over the measured window and print it per request.
//! A response that is not 2xx, a reset stream or a failed handshake counts
//! as an error, and any error makes the exit status 1.
//!
//! The figures and commands are in `docs/performance.md` (HTTP/3), run by
//! `loadtests/scripts/http3-bench.sh`.

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, Bytes};
use clap::{Args as ClapArgs, Parser, Subcommand};
use inlay_loadtools::{Percentiles, SplitMix};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "HTTP/3 requests per second, latency and handshakes per second")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What both modes share.
#[derive(Debug, ClapArgs)]
struct Target {
    /// The URL (`https://localhost:6443/path`): its host is the TLS server
    /// name and the `:authority`.
    #[arg(long)]
    url: String,
    /// The address to send to (default: the URL's host and port, resolved).
    #[arg(long)]
    connect: Option<String>,
    /// A PEM file of certificates to trust.
    #[arg(long)]
    ca: String,
    /// Seconds measured.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Seconds run before the measured ones (not counted).
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Processes whose CPU time (`/proc/PID/stat`) is read over the
    /// measured window.
    #[arg(long)]
    pid: Vec<u32>,
    /// A label for the JSON line.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Requests over long-lived connections.
    Load {
        #[command(flatten)]
        target: Target,
        /// QUIC connections (each from its own UDP socket).
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// Requests in flight per connection.
        #[arg(long, default_value_t = 16)]
        streams: usize,
    },
    /// A new connection (and handshake) per request.
    Handshakes {
        #[command(flatten)]
        target: Target,
        /// Connections being opened at a time.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Keep TLS sessions and resume them (default: full handshakes).
        #[arg(long)]
        resume: bool,
    },
    /// A UDP relay dropping a share of the datagrams.
    Relay {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where to send (the QUIC server).
        #[arg(long)]
        to: String,
        /// Percent of datagrams dropped, each way.
        #[arg(long, default_value_t = 1.0)]
        loss: f64,
        /// The random source's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Counters shared by the workers; only the measured window is recorded.
#[derive(Default)]
struct Tally {
    recording: AtomicBool,
    stop: AtomicBool,
    done: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

impl Tally {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Counts a request started at `t0` if it ended in the measured
    /// window; after an error, waits 10 ms (a server refusing at once
    /// would otherwise be asked again in a busy loop).
    async fn record(&self, r: anyhow::Result<u64>, t0: Instant, lat: &mut Vec<Duration>) {
        let recording = self.recording.load(Ordering::Relaxed);
        match r {
            Ok(n) if recording => {
                lat.push(t0.elapsed());
                self.done.fetch_add(1, Ordering::Relaxed);
                self.bytes.fetch_add(n, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(_) => {
                if recording {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                }
                if self.running() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let line = match args.cmd {
        Cmd::Load {
            target,
            connections,
            streams,
        } => load(&target, connections.max(1), streams.max(1)).await?,
        Cmd::Handshakes {
            target,
            concurrency,
            resume,
        } => handshakes(&target, concurrency.max(1), resume).await?,
        Cmd::Relay {
            listen,
            to,
            loss,
            seed,
        } => return relay(&listen, &to, loss, seed).await,
    };
    println!("{line}");
    if line["errors"].as_u64().unwrap_or(0) > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// The URL's server name, the address to send to, and the request URI.
fn resolve(t: &Target) -> anyhow::Result<(String, SocketAddr, http::Uri)> {
    let uri: http::Uri = t.url.parse().context("--url")?;
    if uri.scheme_str() != Some("https") {
        bail!("--url must be https:// (HTTP/3 has no cleartext form)");
    }
    let host = uri.host().context("--url has no host")?.to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let to = t
        .connect
        .clone()
        .unwrap_or_else(|| format!("{host}:{port}"));
    let addr = to
        .to_socket_addrs()
        .with_context(|| format!("resolving {to}"))?
        .next()
        .with_context(|| format!("{to} resolves to no address"))?;
    Ok((host, addr, uri))
}

/// A client configuration trusting `--ca`, offering `h3`.
fn client_config(ca: &str, resume: bool) -> anyhow::Result<quinn::ClientConfig> {
    let pem = std::fs::read(ca).with_context(|| format!("reading {ca}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.context("a certificate in --ca")?)?;
    }
    if roots.is_empty() {
        bail!("{ca} holds no certificate");
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    if !resume {
        tls.resumption = rustls::client::Resumption::disabled();
    }
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

fn endpoint(config: &quinn::ClientConfig, to: SocketAddr) -> anyhow::Result<quinn::Endpoint> {
    let bind: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let mut e = quinn::Endpoint::client(bind)?;
    e.set_default_client_config(config.clone());
    Ok(e)
}

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// A QUIC handshake and HTTP/3's SETTINGS; the connection's driver runs
/// in a task of its own.
async fn connect(
    e: &quinn::Endpoint,
    to: SocketAddr,
    name: &str,
) -> anyhow::Result<(Sender, quinn::Connection)> {
    let conn = e.connect(to, name)?.await?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    tokio::spawn(async move {
        let _ = poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok((send, conn))
}

/// One GET, its body read to the end; the body's length.
async fn get(send: &mut Sender, uri: &http::Uri) -> anyhow::Result<u64> {
    let req = http::Request::get(uri.clone()).body(())?;
    let mut stream = send.send_request(req).await?;
    stream.finish().await?;
    let resp = stream.recv_response().await?;
    let mut n = 0u64;
    while let Some(chunk) = stream.recv_data().await? {
        n += chunk.remaining() as u64;
    }
    if !resp.status().is_success() {
        bail!("status {}", resp.status());
    }
    Ok(n)
}

/// Runs the warm-up and the measured window; returns the window's length,
/// the CPU ticks of each `--pid` over it and the latencies recorded.
async fn run(
    t: &Target,
    tally: &Arc<Tally>,
    workers: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
) -> anyhow::Result<(Duration, u64, Vec<Duration>)> {
    tokio::time::sleep(Duration::from_secs(t.warmup)).await;
    let cpu0 = cpu_ticks(&t.pid)?;
    let started = Instant::now();
    tally.recording.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(t.duration.max(1))).await;
    tally.recording.store(false, Ordering::SeqCst);
    let window = started.elapsed();
    let cpu1 = cpu_ticks(&t.pid)?;
    tally.stop.store(true, Ordering::SeqCst);
    let mut latencies = Vec::new();
    for w in workers {
        if let Ok(Ok(l)) = tokio::time::timeout(Duration::from_secs(10), w).await {
            latencies.extend(l);
        }
    }
    Ok((window, cpu1.saturating_sub(cpu0), latencies))
}

async fn load(t: &Target, connections: usize, streams: usize) -> anyhow::Result<serde_json::Value> {
    let (name, to, uri) = resolve(t)?;
    let config = client_config(&t.ca, true)?;
    let tally = Arc::new(Tally::default());
    let mut workers = Vec::new();
    let mut held = Vec::new();
    for _ in 0..connections {
        let e = endpoint(&config, to)?;
        let (send, conn) = connect(&e, to, &name)
            .await
            .with_context(|| format!("HTTP/3 connection to {to}"))?;
        for _ in 0..streams {
            let (mut send, uri, tally) = (send.clone(), uri.clone(), tally.clone());
            workers.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while tally.running() {
                    let t0 = Instant::now();
                    let r = get(&mut send, &uri).await;
                    tally.record(r, t0, &mut lat).await;
                }
                lat
            }));
        }
        held.push((e, conn));
    }
    let (window, ticks, latencies) = run(t, &tally, workers).await?;
    for (e, conn) in &held {
        conn.close(0u32.into(), b"done");
        e.close(0u32.into(), b"done");
    }
    Ok(summary(
        t,
        "load",
        json!({"connections": connections, "streams": streams}),
        &tally,
        window,
        ticks,
        &latencies,
    ))
}

async fn handshakes(
    t: &Target,
    concurrency: usize,
    resume: bool,
) -> anyhow::Result<serde_json::Value> {
    let (name, to, uri) = resolve(t)?;
    let config = client_config(&t.ca, resume)?;
    let tally = Arc::new(Tally::default());
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        // One UDP socket per worker, reused by its connections one after
        // another (as a browser's), so the client's ports are not used up.
        let e = endpoint(&config, to)?;
        let (name, uri, tally) = (name.clone(), uri.clone(), tally.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while tally.running() {
                let t0 = Instant::now();
                let r = async {
                    let (mut send, conn) = connect(&e, to, &name).await?;
                    let n = get(&mut send, &uri).await;
                    conn.close(0u32.into(), b"done");
                    n
                }
                .await;
                tally.record(r, t0, &mut lat).await;
            }
            e.close(0u32.into(), b"done");
            lat
        }));
    }
    let (window, ticks, latencies) = run(t, &tally, workers).await?;
    Ok(summary(
        t,
        "handshakes",
        json!({"concurrency": concurrency, "resume": resume}),
        &tally,
        window,
        ticks,
        &latencies,
    ))
}

/// Forwards datagrams between clients and `to`, one upstream socket per
/// client address (never forgotten: a bench's clients are few), dropping
/// `loss` percent of them each way.
async fn relay(listen: &str, to: &str, loss: f64, seed: u64) -> anyhow::Result<()> {
    if !(0.0..100.0).contains(&loss) {
        bail!("--loss must be at least 0 and below 100 (percent)");
    }
    let to: SocketAddr = to.parse().context("--to")?;
    let front = Arc::new(tokio::net::UdpSocket::bind(listen).await?);
    println!("relaying {} -> {to}", front.local_addr()?);
    // Drop when a draw below one million falls under the share.
    let threshold = (loss * 10_000.0) as u64;
    let rng = Arc::new(std::sync::Mutex::new(SplitMix::new(seed)));
    let dropped = move |rng: &std::sync::Mutex<SplitMix>| {
        rng.lock().is_ok_and(|mut r| r.below(1_000_000) < threshold)
    };
    let mut peers: HashMap<SocketAddr, Arc<tokio::net::UdpSocket>> = HashMap::new();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = front.recv_from(&mut buf).await?;
        let back = match peers.get(&from) {
            Some(b) => b.clone(),
            None => {
                let b = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await?);
                b.connect(to).await?;
                let (b2, front, rng) = (b.clone(), front.clone(), rng.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65_536];
                    while let Ok(n) = b2.recv(&mut buf).await {
                        if !dropped(&rng) {
                            let _ = front.send_to(&buf[..n], from).await;
                        }
                    }
                });
                peers.insert(from, b.clone());
                b
            }
        };
        if !dropped(&rng) {
            let _ = back.send(&buf[..n]).await;
        }
    }
}

fn summary(
    t: &Target,
    mode: &str,
    shape: serde_json::Value,
    tally: &Tally,
    window: Duration,
    ticks: u64,
    latencies: &[Duration],
) -> serde_json::Value {
    let secs = window.as_secs_f64();
    let done = tally.done.load(Ordering::Relaxed);
    let cpu_us = ticks as f64 * 1e6 / USER_HZ;
    let per_req = if done > 0 && !t.pid.is_empty() {
        json!((cpu_us / done as f64 * 10.0).round() / 10.0)
    } else {
        serde_json::Value::Null
    };
    json!({
        "label": t.label,
        "mode": mode,
        "url": t.url,
        "shape": shape,
        "seconds": (secs * 100.0).round() / 100.0,
        "requests": done,
        "errors": tally.errors.load(Ordering::Relaxed),
        "per_second": (done as f64 / secs).round(),
        "bytes_per_second": (tally.bytes.load(Ordering::Relaxed) as f64 / secs).round(),
        "latency": Percentiles::of(latencies).to_json(),
        "server_cpu_us_per_request": per_req,
        "server_cpu_share": if t.pid.is_empty() { serde_json::Value::Null }
            else { json!((cpu_us / 1e6 / secs * 100.0).round() / 100.0) },
    })
}

/// The user and system CPU time of `pids` so far, in clock ticks.
fn cpu_ticks(pids: &[u32]) -> anyhow::Result<u64> {
    let mut sum = 0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        sum += stat_ticks(&stat).with_context(|| format!("parsing /proc/{pid}/stat"))?;
    }
    Ok(sum)
}

/// `utime` + `stime` (fields 14 and 15) of a `/proc/PID/stat` line; the
/// command name (field 2) may hold spaces, so fields are counted after its
/// closing parenthesis.
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The unit of `/proc/PID/stat`'s times: Linux's `USER_HZ`, 100 on every
/// architecture it runs on today (`getconf CLK_TCK`), whatever the
/// kernel's own `HZ`.
const USER_HZ: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::stat_ticks;

    #[test]
    fn stat_ticks_counts_fields_after_the_command_name() {
        let line = "4242 (tokio worker) S 1 2 3 4 5 6 7 8 9 10 123 45 0 0 20 0";
        assert_eq!(stat_ticks(line), Some(168));
        assert_eq!(stat_ticks("garbage"), None);
    }
}

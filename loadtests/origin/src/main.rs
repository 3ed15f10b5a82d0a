//! `inlay-origin`: the test origin behind Inlay's tests, benchmarks and k6
//! scenarios. Endpoints and knobs are documented in `loadtests/README.md`.
//!
//! ```text
//! inlay-origin --listen 127.0.0.1:0   # prints "listening on http://127.0.0.1:PORT"
//! ```

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpSocket;

/// Backlog deep enough for load tests that open thousands of connections.
const LISTEN_BACKLOG: u32 = 4096;

/// A fast, scriptable HTTP origin for testing and benchmarking Inlay.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads.max(1));
    }
    let runtime = runtime.build().context("starting the tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    // Before the listening line: a test may signal as soon as it reads it.
    let shutdown = shutdown_signal()?;
    let socket = if args.listen.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .context("creating the listening socket")?;
    socket.set_reuseaddr(true).context("setting SO_REUSEADDR")?;
    socket
        .bind(args.listen)
        .with_context(|| format!("binding {}", args.listen))?;
    let listener = socket.listen(LISTEN_BACKLOG).context("listening")?;
    let addr = listener.local_addr().context("reading the bound address")?;

    // The one line tests wait for; flushed so a pipe sees it at once.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}").context("writing to stdout")?;
    stdout.flush().context("flushing stdout")?;
    drop(stdout);

    inlay_origin::serve(listener, shutdown).await;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

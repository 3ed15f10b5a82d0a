//! The admin listener: the admin API served on a listener of its own
//! through `inlay-listener`, with limits of its own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::Request;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::Admin;

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections one client address may hold; more from it are closed at
/// once, so that a client holding slow requests cannot keep a load
/// balancer's probe from another address waiting.
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 16;
/// A client must send its request head within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection may last (a reload that compiles a policy included).
const CONNECTION_DEADLINE: Duration = Duration::from_secs(300);
/// Largest request head read, in bytes (hyper's smallest buffer).
const MAX_HEAD: usize = 8192;

/// The admin listener, serving until [`shutdown`](Self::shutdown).
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl AdminServer {
    /// Listen on `addr` and serve `admin`; logs "admin API listening on
    /// http://ADDR" (tests and scripts read the port of `127.0.0.1:0` there).
    pub async fn bind(addr: SocketAddr, admin: Admin) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("admin API: cannot listen on {addr}"))?;
        Ok(Self::start(listener, admin)?)
    }

    /// Serve `admin` on `listener`.
    pub fn start(listener: TcpListener, admin: Admin) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        info!("admin API listening on http://{addr}");
        let stop = CancellationToken::new();
        // Its limits never change: the sender goes at once.
        let (_, limits) = tokio::sync::watch::channel(Arc::new(listener_limits()));
        let server = inlay_listener::Server::new(limits, move |_: &inlay_listener::Connection| {
            let admin = admin.clone();
            service_fn(move |req: Request<hyper::body::Incoming>| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(admin.respond(req).await) }
            })
        });
        let task = tokio::spawn(server.serve([listener], stop.clone().cancelled_owned()));
        Ok(Self { addr, stop, task })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, let the requests in flight finish (5 s at most).
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The admin listener's limits: [`MAX_CONNECTIONS`], its share per
/// client (more closed at once), one request per connection (no idle
/// keep-alive connection holds a slot), HTTP/1 only, and
/// [`CONNECTION_DEADLINE`] for everything.
fn listener_limits() -> inlay_listener::Limits {
    inlay_listener::Limits {
        max_connections: MAX_CONNECTIONS,
        max_connections_per_client: MAX_CONNECTIONS_PER_CLIENT,
        tarpit_max: 0,
        listen_backlog: 1024,
        defer_accept: Duration::ZERO,
        tcp_notsent_lowat: 0,
        proxy_protocol: None,
        header_read_timeout: HEADER_READ_TIMEOUT,
        tls_handshake_timeout: HEADER_READ_TIMEOUT,
        idle_timeout: CONNECTION_DEADLINE,
        busy_idle_timeout: CONNECTION_DEADLINE,
        send_timeout: CONNECTION_DEADLINE,
        idle_send_timeout: CONNECTION_DEADLINE,
        connection_deadline: Some(CONNECTION_DEADLINE),
        max_header_size: MAX_HEAD,
        keep_alive: false,
        http2: false,
        upgrades: false,
        h2_max_concurrent_streams: 1,
        h2_max_header_list_size: MAX_HEAD as u32,
        h2_max_pending_accept_reset_streams: 1,
        h2_max_local_error_reset_streams: 1,
        h2_keep_alive_interval: Duration::ZERO,
        h2_keep_alive_timeout: HEADER_READ_TIMEOUT,
        shutdown_timeout: Duration::from_secs(5),
        setting_prefix: "",
    }
}

//! A server on `127.0.0.1:0` with a small service of the test's own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::{Connection, ConnectionStats, Limits, Server};

/// Limits as Inlay's defaults have them.
pub(crate) fn limits() -> Limits {
    Limits {
        max_connections: 10_000,
        max_connections_per_client: 1_000,
        tarpit_max: 10_000,
        listen_backlog: 1024,
        defer_accept: Duration::from_secs(3),
        tcp_notsent_lowat: 128 << 10,
        proxy_protocol: false,
        proxy_protocol_from: None,
        header_read_timeout: Duration::from_secs(10),
        tls_handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        busy_idle_timeout: Duration::from_secs(1),
        send_timeout: Duration::from_secs(600),
        idle_send_timeout: Duration::from_secs(60),
        connection_deadline: None,
        max_header_size: 64 << 10,
        keep_alive: true,
        http2: true,
        upgrades: true,
        h2_max_concurrent_streams: 100,
        h2_max_header_list_size: 64 << 10,
        h2_max_pending_accept_reset_streams: 20,
        h2_max_local_error_reset_streams: 1024,
        h2_keep_alive_interval: Duration::from_secs(30),
        h2_keep_alive_timeout: Duration::from_secs(10),
        shutdown_timeout: Duration::from_secs(10),
        setting_prefix: "server.",
    }
}

/// A running server: its address, its limits' sender, its stats, and how
/// to stop it (`stop`, then await `served`).
struct Running {
    addr: SocketAddr,
    limits: watch::Sender<Arc<Limits>>,
    stats: Arc<ConnectionStats>,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

/// A server whose service answers `200` with the connection's peer after
/// waiting for the `delay` (ms) of the request's query.
async fn start(limits: Limits) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = watch::channel(Arc::new(limits));
    let stats = Arc::new(ConnectionStats::new(true));
    let server = Server::new(rx, |conn: &Connection| {
        let conn = *conn;
        service_fn(move |req: hyper::Request<Incoming>| async move {
            let delay: u64 = req.uri().query().and_then(|q| q.parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let body = format!("peer={} tls={} done", conn.peer.ip(), conn.tls);
            Ok::<_, Infallible>(hyper::Response::new(inlay_core::body::full(body)))
        })
    })
    .with_stats(stats.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve([listener], async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        limits: tx,
        stats,
        stop,
        served,
    }
}

/// Send one HTTP/1.1 GET and read until the server closes the connection.
async fn get_until_closed(addr: SocketAddr, path: &str) -> String {
    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = client.read_to_end(&mut got).await;
    String::from_utf8_lossy(&got).into_owned()
}

/// Serve one request that takes `delay`, stop the server 100 ms into it,
/// and time how long `serve` takes to return.
async fn stop_during_a_request(
    delay: Duration,
    shutdown_timeout: Duration,
) -> (Duration, tokio::task::JoinHandle<String>, SocketAddr) {
    let running = start(Limits {
        shutdown_timeout,
        ..limits()
    })
    .await;
    let addr = running.addr;
    let path = format!("/slow?{}", delay.as_millis());
    let client = tokio::spawn(async move { get_until_closed(addr, &path).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = Instant::now();
    running.stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), running.served)
        .await
        .expect("serve returns within 5 s")
        .unwrap();
    (stopping.elapsed(), client, addr)
}

#[tokio::test]
async fn shutdown_lets_the_request_in_flight_finish_then_returns() {
    let (waited, client, addr) =
        stop_during_a_request(Duration::from_millis(400), Duration::from_secs(10)).await;
    assert!(
        waited >= Duration::from_millis(200),
        "returned after {waited:?}"
    );
    let got = client.await.unwrap();
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(got.ends_with("done"), "{got:?}");
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

#[tokio::test]
async fn shutdown_deadline_ends_a_request_that_does_not_finish() {
    let (waited, _, _) =
        stop_during_a_request(Duration::from_secs(60), Duration::from_millis(300)).await;
    assert!(
        waited >= Duration::from_millis(300),
        "returned after {waited:?}"
    );
}

/// Whether the server answers a new connection within `within`.
async fn answers(addr: SocketAddr, within: Duration) -> bool {
    tokio::time::timeout(within, get_until_closed(addr, "/"))
        .await
        .is_ok_and(|got| got.starts_with("HTTP/1.1 200"))
}

#[tokio::test]
async fn new_limits_apply_to_the_open_listener() {
    let running = start(Limits {
        max_connections: 1,
        ..limits()
    })
    .await;
    let addr = running.addr;
    // One slow request holds the only slot: the next client waits.
    let slow = tokio::spawn(async move { get_until_closed(addr, "/slow?3000").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!answers(addr, Duration::from_millis(300)).await, "one slot");
    running.limits.send_replace(Arc::new(Limits {
        max_connections: 2,
        ..limits()
    }));
    assert!(answers(addr, Duration::from_secs(2)).await, "raised to two");
    slow.abort();
    // Counted: the slow one, the one that waited, and the last.
    assert_eq!(running.stats.accepted(), 3);
}

#[tokio::test]
async fn the_service_is_told_the_client_and_a_closed_connection_is_counted_out() {
    let running = start(limits()).await;
    let got = get_until_closed(running.addr, "/").await;
    assert!(got.ends_with("peer=127.0.0.1 tls=false done"), "{got:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while running.stats.open() != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((running.stats.accepted(), running.stats.open()), (1, 0));
}

/// What the admin listener asks: HTTP/1 only, one request per connection,
/// and a client over its share closed at once (no tarpit).
#[tokio::test]
async fn one_request_per_connection_and_a_client_over_its_share_is_closed_at_once() {
    let running = start(Limits {
        max_connections_per_client: 1,
        tarpit_max: 0,
        keep_alive: false,
        http2: false,
        ..limits()
    })
    .await;
    let addr = running.addr;
    let mut first = TcpStream::connect(addr).await.unwrap();
    first
        .write_all(b"GET /?500 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The second from the same address is refused: closed unread.
    let mut second = TcpStream::connect(addr).await.unwrap();
    let _ = second.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let mut b = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), second.read(&mut b)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    // The first is answered, then closed without keep-alive.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), first.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "closed after its response");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(got.ends_with("done"), "{got:?}");
}

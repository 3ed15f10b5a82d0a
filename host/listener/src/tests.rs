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

use crate::{Connection, ConnectionStats, Limits, Listener, Server};

/// Limits as Inlay's defaults have them.
pub(crate) fn limits() -> Limits {
    Limits {
        max_connections: 10_000,
        max_connections_per_client: 1_000,
        tarpit_max: 10_000,
        listen_backlog: 1024,
        defer_accept: Duration::from_secs(3),
        tcp_notsent_lowat: 128 << 10,
        proxy_protocol: None,
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
    start_on(limits, Listener::plain).await
}

/// [`start`] on the listener `kind` makes.
async fn start_on(limits: Limits, kind: fn(TcpListener) -> Listener) -> Running {
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
    let served = tokio::spawn(server.serve([kind(listener)], async {
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

/// A connection from `from` (a loopback address) to `addr`.
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Behind the PROXY protocol a connection is its peer's until the header
/// names the client: a peer that sends `P` and waits holds its own share
/// of the slots, not all of them; a load balancer's share is given back
/// as each header names the client behind it.
#[tokio::test]
async fn a_peer_waiting_to_send_its_proxy_header_holds_its_share_not_every_slot() {
    let running = start(Limits {
        max_connections: 5,
        max_connections_per_client: 2,
        proxy_protocol: Some(crate::PeerFilter::new(|ip| ip.is_loopback())),
        // Answered connections stay open: only their shares free slots.
        busy_idle_timeout: Duration::from_secs(60),
        ..limits()
    })
    .await;
    let addr = running.addr;
    let mut waiting = Vec::new();
    for _ in 0..4 {
        let mut c = connect_from("127.0.0.1", addr).await;
        c.write_all(b"P").await.unwrap();
        waiting.push(c);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The load balancer, another peer: three clients, each connection kept
    // open once answered (more than its share of two).
    let mut open = Vec::new();
    for client in 7..10 {
        let mut lb = connect_from("127.0.0.2", addr).await;
        let request = format!(
            "PROXY TCP4 203.0.113.{client} 192.0.2.1 40000 80\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n"
        );
        lb.write_all(request.as_bytes()).await.unwrap();
        let mut got = vec![0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(2), lb.read(&mut got)).await;
        let n = read.expect("answered within 2 s").unwrap();
        let got = String::from_utf8_lossy(&got[..n]);
        assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
        assert!(
            got.contains(&format!("peer=203.0.113.{client} ")),
            "{got:?}"
        );
        open.push(lb);
    }
    drop(waiting);
}

/// A header that names the peer itself (a load balancer's own request)
/// keeps the peer's count: it is not counted twice.
#[tokio::test]
async fn a_proxy_header_naming_its_own_peer_counts_once() {
    let running = start(Limits {
        max_connections_per_client: 1,
        proxy_protocol: Some(crate::PeerFilter::new(|ip| ip.is_loopback())),
        ..limits()
    })
    .await;
    for header in [
        "PROXY TCP4 127.0.0.1 192.0.2.1 40000 80\r\n",
        "PROXY UNKNOWN\r\n",
    ] {
        let mut c = TcpStream::connect(running.addr).await.unwrap();
        let request = format!("{header}GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        c.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "{header:?}: closed after its answer");
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.ends_with("peer=127.0.0.1 tls=false done"),
            "{header:?}: {got:?}"
        );
    }
}

/// What the server sends after `bytes` until it closes (within 5 s). A
/// close that leaves some of `bytes` unread is a reset: that is a close too.
async fn answer_to(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match client.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("reading the answer: {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("closed within 5 s");
    got
}

/// An `h2c://` listener speaks HTTP/2 with prior knowledge only: what
/// does not open with the preface is closed with HTTP/2 frames at most
/// (RFC 9113 3.4, h2spec 3.5/2), where a plain listener, which speaks
/// HTTP/1.1 too, answers it as a malformed HTTP/1 request (RFC 9112 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_listener_closes_what_does_not_open_with_the_preface() {
    const INVALID: &[u8] = b"INVALID CONNECTION PREFACE\r\n\r\n";
    let plain = start(limits()).await;
    let got = answer_to(plain.addr, INVALID).await;
    assert!(
        got.starts_with(b"HTTP/1.1 4"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );

    let h2c = start_on(limits(), Listener::h2c).await;
    for bytes in [INVALID, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"] {
        let got = answer_to(h2c.addr, bytes).await;
        let mut frames = &got[..];
        while let [a, b, c, kind, ..] = *frames {
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            assert!(kind <= 9 && frames.len() >= 9 + len, "not HTTP/2: {got:?}");
            frames = &frames[9 + len..];
        }
        assert!(frames.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    }
    // A client with prior knowledge is served.
    let tcp = TcpStream::connect(h2c.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("http://x/")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
}

//! WebSockets through Inlay: the real server in front of the test origin's
//! WebSocket echo (`/ws`, tokio-tungstenite), with a tokio-tungstenite
//! client over HTTP/1.1 and over HTTP/2 extended CONNECT (RFC 8441);
//! refusals (the policy, protocols not configured, the tunnel limit,
//! hostile requests), the idle timeout, and what is logged and counted.
//! The drain at SIGTERM and a reload's are in `process/signals.rs`.
//!
//! Run: `cargo test -p inlay --test server -- websocket::`

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, echoed, policy, raw, request};
use futures_util::{SinkExt, StreamExt};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A WebSocket to `path` through the HTTP/1.1 upgrade.
async fn connect(addr: SocketAddr, path: &str) -> Ws {
    let url = format!("ws://{addr}{path}");
    let (ws, resp) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(url.as_str()),
    )
    .await
    .unwrap_or_else(|_| panic!("{url}: no handshake within 10 s"))
    .unwrap_or_else(|e| panic!("{url}: {e}"));
    assert_eq!(resp.status(), 101);
    assert_eq!(resp.headers()["via"], "1.1 inlay");
    ws
}

/// A WebSocket to `path` through HTTP/2 extended CONNECT (prior knowledge).
async fn connect_h2(
    addr: SocketAddr,
    path: &str,
) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    common::h2_websocket(TokioIo::new(tcp), &format!("http://{addr}{path}")).await
}

/// Send `msg` and read what comes back, within 5 s.
async fn round_trip<S>(ws: &mut WebSocketStream<S>, msg: Message) -> Message
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(msg).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("an answer within 5 s")
        .expect("the tunnel is open")
        .expect("a message")
}

/// Text, binary, ping and close go both ways through `ws`.
async fn speak<S>(mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let text = Message::text("hello through inlay");
    assert_eq!(round_trip(&mut ws, text.clone()).await, text);
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let binary = Message::binary(big);
    assert_eq!(round_trip(&mut ws, binary.clone()).await, binary);
    let pong = round_trip(&mut ws, Message::Ping(Bytes::from_static(b"p1"))).await;
    assert_eq!(pong, Message::Pong(Bytes::from_static(b"p1")));
    ws.close(None).await.unwrap();
    // The echo's close comes back, then the stream ends.
    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(5), ws.collect::<Vec<_>>())
        .await
        .expect("closed within 5 s");
    assert!(
        rest.iter().all(|m| matches!(m, Ok(Message::Close(_)))),
        "{rest:?}"
    );
}

async fn metric(inlay: &Harness, name: &str) -> u64 {
    let text = inlay.metrics.render().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

async fn json_inlay(origin: &Origin, extra: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .toml(&format!("[log]\naccess_log_format = \"json\"\n{extra}"))
        .start_in_process()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_messages_go_both_ways_through_an_http1_upgrade() {
    let origin = Origin::start();
    let inlay = json_inlay(&origin, "").await;
    let ws = connect(inlay.addr, "/ws?n=1").await;
    assert_eq!(metric(&inlay, "inlay_websocket_tunnels_open").await, 1);
    speak(ws).await;
    let line = inlay
        .access
        .json_for("/ws?n=1", Duration::from_secs(5))
        .await;
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(line["cache"], "pass", "{line}");
    assert_eq!(line["backend"], "default", "{line}");
    assert_eq!(line["error"], serde_json::Value::Null, "{line}");
    // The echo's bytes came back: every message plus frame headers.
    let (sent, received) = (
        line["bytes"].as_u64().unwrap(),
        line["received"].as_u64().unwrap(),
    );
    assert!(sent > 200_000 && received > 200_000, "{line}");
    assert_eq!(origin.count("/ws").await, 1);
    // The tunnel is closed, and its bytes counted each way.
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&inlay, "inlay_websocket_tunnels_open").await != 0 {
        assert!(Instant::now() < deadline, "tunnel still counted open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&inlay, "inlay_websocket_tunnels_total").await, 1);
    let to_client = metric(
        &inlay,
        "inlay_websocket_bytes_total{direction=\"to_client\"}",
    )
    .await;
    assert_eq!(to_client, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_messages_go_both_ways_through_http2_extended_connect() {
    let origin = Origin::start();
    let inlay = json_inlay(&origin, "").await;
    speak(connect_h2(inlay.addr, "/ws?h2=1").await).await;
    let line = inlay
        .access
        .json_for("/ws?h2=1", Duration::from_secs(5))
        .await;
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["method"], "CONNECT", "{line}");
    assert_eq!(line["protocol"], "HTTP/2.0", "{line}");
    assert!(line["bytes"].as_u64().unwrap() > 200_000, "{line}");
    // Two tunnels on one connection, each its own stream.
    let tcp_count = origin.count("/ws").await;
    assert_eq!(tcp_count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_refuses_an_upgrade_or_lets_it_through() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = \"{}\"\n[policy.config]\nkey = \"s3cret\"",
            policy("auth").display()
        ))
        .start_in_process()
        .await;
    // No token: the policy's 403, and the origin never asked.
    let url = format!("ws://{}/ws", inlay.addr);
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 403),
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(origin.count("/ws").await, 0);
    // A valid token: the policy lets it through, and it is a tunnel.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let good = common::auth_token("s3cret", "/ws", now + 600);
    let ws = connect(inlay.addr, &format!("/ws?token={good}")).await;
    speak(ws).await;
    assert_eq!(origin.count("/ws").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_routes_an_upgrade_and_an_origin_that_does_not_switch_is_a_normal_response() {
    let origin = Origin::start();
    let other = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[backends.other]\naddress = \"{}\"\n[policy]\npath = \"{}\"",
            other.url(),
            policy("capabilities").display()
        ))
        .start_in_process()
        .await;
    // The policy sends it to `other` as `/echo`, which answers 200: passed
    // on with its body, no tunnel; the upgrade reached the origin.
    let r = request(
        "GET",
        &inlay.url("/cap/backend/other"),
        &[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
        ],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(echoed(&r, "upgrade").as_deref(), Some("websocket"));
    assert_eq!(echoed(&r, "connection").as_deref(), Some("upgrade"));
    assert_eq!(other.count("/echo").await, 1);
    assert_eq!(origin.count("/echo").await, 0);
    assert_eq!(r.header("upgrade"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_not_configured_are_served_as_plain_http() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[websocket]\nother_protocols = [\"echo-proto\"]")
        .start_in_process()
        .await;
    let upgrade = |p: &'static str| [("upgrade", p), ("connection", "upgrade")];
    // A protocol not configured (h2c is what curl --http2 sends): ignored.
    for p in ["foo", "h2c"] {
        let r = request("GET", &inlay.url("/echo"), &upgrade(p), Bytes::new()).await;
        assert_eq!(r.status, 200, "{p}");
        assert_eq!(echoed(&r, "upgrade"), None, "{p}");
        assert_eq!(echoed(&r, "connection"), None, "{p}");
    }
    // One configured: the origin is asked to switch.
    let r = request(
        "GET",
        &inlay.url("/echo"),
        &upgrade("echo-proto"),
        Bytes::new(),
    )
    .await;
    assert_eq!(echoed(&r, "upgrade").as_deref(), Some("echo-proto"));
    // HTTP/1.0 cannot upgrade (RFC 9110 section 7.8): plain HTTP.
    let (answer, _) = raw(
        inlay.addr,
        b"GET /echo HTTP/1.0\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("\"upgrade\""),
        "{answer}"
    );
    // Without Connection: upgrade, Upgrade asks for nothing.
    let r = request(
        "GET",
        &inlay.url("/echo"),
        &[("upgrade", "websocket")],
        Bytes::new(),
    )
    .await;
    assert_eq!(echoed(&r, "upgrade"), None);
    // Tunnels off: a WebSocket handshake is plain HTTP too.
    let off = Harness::builder()
        .backend(&origin)
        .toml("[websocket]\nenabled = false")
        .start_in_process()
        .await;
    let r = request(
        "GET",
        &off.url("/echo"),
        &upgrade("websocket"),
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(echoed(&r, "upgrade"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_past_max_tunnels_get_503_until_one_closes() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml("[websocket]\nmax_tunnels = 2")
        .start_in_process()
        .await;
    let mut first = connect(inlay.addr, "/ws?n=1").await;
    let second = connect(inlay.addr, "/ws?n=2").await;
    let url = format!("ws://{}/ws?n=3", inlay.addr);
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 503),
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(
        origin.count("/ws").await,
        2,
        "the refused one never reached the origin"
    );
    assert_eq!(
        metric(&inlay, "inlay_websocket_tunnels_refused_total").await,
        1
    );
    // The open ones still work; once one closes there is room again.
    let hi = Message::text("still here");
    assert_eq!(round_trip(&mut first, hi.clone()).await, hi);
    speak(second).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio_tungstenite::connect_async(url.as_str()).await {
            Ok((ws, _)) => break speak(ws).await,
            Err(e) => assert!(Instant::now() < deadline, "no room after a close: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_is_closed_and_one_that_pings_is_not() {
    let origin = Origin::start();
    let inlay = json_inlay(&origin, "[websocket]\nidle_timeout = \"600ms\"").await;
    let mut quiet = connect(inlay.addr, "/ws?quiet").await;
    let mut chatty = connect(inlay.addr, "/ws?chatty").await;
    let started = Instant::now();
    // The chatty one pings every 200 ms for 1.5 s and gets every pong.
    for i in 0..8u8 {
        let pong = round_trip(&mut chatty, Message::Ping(Bytes::from(vec![i]))).await;
        assert_eq!(pong, Message::Pong(Bytes::from(vec![i])));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The quiet one was closed (no close frame: the tunnel carries bytes,
    // it does not speak WebSocket) after its 600 ms of silence.
    let end = tokio::time::timeout(Duration::from_secs(5), quiet.next()).await;
    assert!(
        matches!(end, Ok(None | Some(Err(_)))),
        "the idle tunnel is still open: {end:?}"
    );
    let line = inlay
        .access
        .json_for("/ws?quiet", Duration::from_secs(5))
        .await;
    let took = line["duration_ms"].as_f64().unwrap();
    assert!((550.0..3000.0).contains(&took), "{line}");
    assert!(
        line["error"]
            .as_str()
            .unwrap()
            .contains("websocket.idle_timeout"),
        "{line}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1500));
    speak(chatty).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_goes_to_the_healthy_backend_its_director_picks() {
    let (sick, live) = (Origin::start(), Origin::start());
    // `sick` is up but its probe fails from the start (a path it does not
    // serve): the fallback director skips it.
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.sick]\naddress = \"{}\"\n\
             [backends.sick.probe]\nurl = \"/probe-fails\"\ninterval = \"1h\"\nwindow = 1\nthreshold = 1\ninitial = 0\n\
             [backends.live]\naddress = \"{}\"\n\
             [directors.default]\ntype = \"fallback\"\nbackends = [\"sick\", \"live\"]\n",
            sick.url(),
            live.url()
        ))
        .start_in_process()
        .await;
    speak(connect(inlay.addr, "/ws").await).await;
    assert_eq!(live.count("/ws").await, 1);
    assert_eq!(sick.count("/ws").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_101_is_passed_as_it_is_and_hostile_upgrades_are_refused() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let handshake = |path: &str, extra: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
    };
    // A Sec-WebSocket-Accept that does not match the key reaches the
    // client as the backend sent it (nginx does the same): the client
    // checks it.
    let (answer, _) = raw(
        inlay.addr,
        handshake("/ws?accept=wrong", "").as_bytes(),
        Duration::from_millis(500),
    )
    .await;
    let lower = answer.to_ascii_lowercase();
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    assert!(
        lower.contains("sec-websocket-accept: d3jvbmcgd3jvbmcgd3jvbmc="),
        "{answer}"
    );
    assert!(lower.contains("upgrade: websocket") && lower.contains("connection: upgrade"));
    // An upgrade with a body: its bytes would be read as the new protocol's.
    for extra in ["Content-Length: 5\r\n", "Transfer-Encoding: chunked\r\n"] {
        let (answer, _) = raw(
            inlay.addr,
            format!("{}hello", handshake("/ws", extra)).as_bytes(),
            Duration::from_secs(2),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{extra}: {answer}");
    }
    // A WebSocket handshake is a GET.
    let post = handshake("/ws", "").replacen("GET", "POST", 1);
    let (answer, _) = raw(inlay.addr, post.as_bytes(), Duration::from_secs(2)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // Inlay is not a forward proxy.
    let (answer, _) = raw(
        inlay.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert_eq!(
        origin.count("/ws").await,
        1,
        "only the first reached the origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_websocket_to_an_origin_that_answers_200_is_a_502_not_a_tunnel() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let tcp = TcpStream::connect(inlay.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let connect = |path: &str, protocol: &'static str| {
        let mut req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(format!("http://{}{path}", inlay.addr))
            .header("sec-websocket-version", "13")
            .body(Empty::<Bytes>::new())
            .unwrap();
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static(protocol));
        req
    };
    // `/echo` answers 200 without switching: a 2xx would open the tunnel
    // at the client, so it is a 502.
    let resp = send
        .send_request(connect("/echo", "websocket"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    // A 404 goes on as it is.
    let resp = send
        .send_request(connect("/nope", "websocket"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // Another protocol over extended CONNECT is refused.
    let resp = send
        .send_request(connect("/ws", "connect-udp"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    // The connection goes on: a WebSocket on it works.
    assert_eq!(origin.count("/ws").await, 0);
}

//! The PROXY protocol (`server.proxy_protocol = true`), in process against
//! the test origin: the address in a v1 or v2 header is the client's for
//! X-Forwarded-For, the access log, `purge_allow` and
//! `max_connections_per_client`; a connection without a valid header is
//! closed.
//!
//! `cargo test -p inlay --test server -- proxy_protocol::`

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{Harness, Origin};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use ppp::v2;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn v1(source: &str) -> Vec<u8> {
    format!("PROXY TCP4 {source} 192.0.2.1 40000 80\r\n").into_bytes()
}

fn v2_header(source: SocketAddr) -> Vec<u8> {
    let destination: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
    let destination = match source {
        SocketAddr::V4(_) => "192.0.2.1:443".parse().unwrap(),
        SocketAddr::V6(_) => destination,
    };
    v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        (source, destination),
    )
    .build()
    .unwrap()
}

/// An HTTP/1.1 connection to `addr` that first sent `header`.
async fn connect(
    addr: SocketAddr,
    header: &[u8],
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(header).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// `method path` on `send`: the status and body.
async fn send(
    send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    method: &str,
    path: &str,
) -> (u16, Bytes) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "www.example.com")
        .body(Empty::new())
        .unwrap();
    let exchange = async {
        send.ready().await.unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("answered within 10 s")
}

/// Send `bytes` on a fresh connection: whether the server closed it
/// unanswered within 5 s (the end of the stream, or a reset when it
/// closed with bytes unread).
async fn closed_unanswered(addr: SocketAddr, bytes: &[u8]) -> bool {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    if tcp.write_all(bytes).await.is_err() {
        return true;
    }
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// The X-Forwarded-For the origin's `/echo` received.
fn forwarded_for(body: Bytes) -> Option<String> {
    let reply = common::Reply {
        status: 200,
        headers: http::HeaderMap::new(),
        body,
        version: http::Version::HTTP_11,
    };
    common::echoed(&reply, "x-forwarded-for")
}

/// `server`, with the test's peer (127.0.0.1) as the load balancer unless
/// it names its own.
fn from(server: &str) -> String {
    if server.contains("proxy_protocol_from") {
        return server.to_owned();
    }
    format!("proxy_protocol_from = [\"127.0.0.1\"]\n{server}")
}

async fn start(origin: &Origin, server: &str, toml: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .server("proxy_protocol = true")
        .server(&from(server))
        .toml(toml)
        .start_in_process()
        .await
}

/// The access log's `client` fields, once `n` lines are written.
async fn logged_clients(inlay: &Harness, n: usize) -> Vec<String> {
    for _ in 0..200 {
        let lines = inlay.access.lines();
        if lines.len() >= n {
            return lines
                .iter()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .map(|v| v["client"].as_str().unwrap().to_owned())
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "fewer than {n} access-log lines: {:?}",
        inlay.access.lines()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_address_in_a_v1_or_v2_header_is_the_client_for_the_origin_and_the_log() {
    let origin = Origin::start();
    let inlay = start(&origin, "", "[log]\naccess_log_format = \"json\"").await;
    let mut a = connect(inlay.addr, &v1("203.0.113.7")).await;
    let (status, body) = send(&mut a, "GET", "/echo?a").await;
    assert_eq!(status, 200);
    assert_eq!(forwarded_for(body).as_deref(), Some("203.0.113.7"));
    // Keep-alive: the next request on the connection is the same client.
    let (_, body) = send(&mut a, "POST", "/echo").await;
    assert_eq!(forwarded_for(body).as_deref(), Some("203.0.113.7"));

    let source: SocketAddr = "[2001:db8::7]:40000".parse().unwrap();
    let mut b = connect(inlay.addr, &v2_header(source)).await;
    let (status, body) = send(&mut b, "GET", "/echo?b").await;
    assert_eq!(status, 200);
    assert_eq!(forwarded_for(body).as_deref(), Some("2001:db8::7"));

    // A v2 LOCAL header (a load balancer's health check): the connection's own address.
    let local = v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Local,
        v2::Protocol::Unspecified,
        v2::Addresses::Unspecified,
    )
    .build()
    .unwrap();
    let mut c = connect(inlay.addr, &local).await;
    let (_, body) = send(&mut c, "GET", "/echo?c").await;
    assert_eq!(forwarded_for(body).as_deref(), Some("127.0.0.1"));

    assert_eq!(
        logged_clients(&inlay, 4).await,
        ["203.0.113.7", "203.0.113.7", "2001:db8::7", "127.0.0.1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_allow_is_checked_against_the_proxied_address() {
    let origin = Origin::start();
    let inlay = start(&origin, "", "[cache]\npurge_allow = [\"203.0.113.0/24\"]").await;
    let mut outside = connect(inlay.addr, &v1("198.51.100.1")).await;
    assert_eq!(send(&mut outside, "GET", "/static/7").await.0, 200);
    assert_eq!(send(&mut outside, "PURGE", "/static/7").await.0, 405);
    // The TCP peer (127.0.0.1) is not in the list either: only the header counts.
    let mut inside = connect(inlay.addr, &v1("203.0.113.9")).await;
    assert_eq!(send(&mut inside, "PURGE", "/static/7").await.0, 200);
    assert_eq!(send(&mut inside, "GET", "/static/7").await.0, 200);
    assert_eq!(origin.count("/static/7").await, 2, "purged, fetched again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_valid_header_is_closed_unanswered() {
    let origin = Origin::start();
    let inlay = start(&origin, "header_read_timeout = \"500ms\"", "").await;
    let cases: [(&str, &[u8]); 5] = [
        ("no header", b"GET /static/1 HTTP/1.1\r\nhost: x\r\n\r\n"),
        ("garbage", b"PROXY GARBAGE\r\nGET / HTTP/1.1\r\n\r\n"),
        ("bad address", b"PROXY TCP4 999.0.0.1 192.0.2.1 1 2\r\n"),
        ("random bytes", &[0xa5; 300]),
        ("a header that never ends", b"PROXY TCP4 203.0.113.7 "),
    ];
    for (what, bytes) in cases {
        let started = std::time::Instant::now();
        assert!(closed_unanswered(inlay.addr, bytes).await, "{what}");
        assert!(started.elapsed() < Duration::from_secs(3), "{what}");
    }
    // A v2 header that says it is 60000 bytes long.
    let mut long = v2_header("192.0.2.9:1".parse().unwrap());
    long[14..16].copy_from_slice(&60000u16.to_be_bytes());
    long.resize(8000, 0);
    // The server stops reading at 4 KiB and closes.
    assert!(closed_unanswered(inlay.addr, &long).await);
    // A proxied client is served all along.
    let mut ok = connect(inlay.addr, &v1("203.0.113.7")).await;
    assert_eq!(send(&mut ok, "GET", "/static/1").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_per_client_counts_the_proxied_address() {
    let origin = Origin::start();
    let inlay = start(&origin, "max_connections_per_client = 1", "").await;
    // Every connection comes from 127.0.0.1: the limit is per proxied client.
    let mut first = connect(inlay.addr, &v1("203.0.113.7")).await;
    assert_eq!(send(&mut first, "GET", "/static/2").await.0, 200);
    let mut header = v1("203.0.113.7");
    header.extend_from_slice(b"GET /static/2 HTTP/1.1\r\nhost: x\r\n\r\n");
    assert!(
        closed_unanswered(inlay.addr, &header).await,
        "a second connection"
    );
    let mut other = connect(inlay.addr, &v1("203.0.113.8")).await;
    assert_eq!(send(&mut other, "GET", "/static/2").await.0, 200);
    // The first is still open and served.
    assert_eq!(send(&mut first, "GET", "/static/2").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_peers_in_proxy_protocol_from_may_send_a_header() {
    let origin = Origin::start();
    // The test connects from 127.0.0.1: not a listed load balancer.
    let inlay = start(&origin, "proxy_protocol_from = [\"10.0.0.0/8\"]", "").await;
    let mut header = v1("127.0.0.1");
    header.extend_from_slice(b"PURGE /static/3 HTTP/1.1\r\nhost: x\r\n\r\n");
    assert!(closed_unanswered(inlay.addr, &header).await);
    let inlay = start(&origin, "proxy_protocol_from = [\"127.0.0.0/8\"]", "").await;
    let mut lb = connect(inlay.addr, &v1("203.0.113.7")).await;
    assert_eq!(send(&mut lb, "GET", "/static/3").await.0, 200);
}

/// The `ab-test` policy's bucket for a client without a cookie (its
/// `assign_bucket`): FNV-1a of the client address and User-Agent.
fn ab_bucket(client_ip: &str, user_agent: &str) -> &'static str {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in client_ip.bytes().chain([0]).chain(user_agent.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    if hash.is_multiple_of(2) { "a" } else { "b" }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_sees_the_proxied_client_address() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("proxy_protocol = true")
        .server(&from(""))
        .arg("--policy")
        .arg(common::policy("ab-test").display().to_string())
        .start_in_process()
        .await;
    // Two proxied clients the policy puts in different buckets.
    let ips: Vec<String> = (1..=40).map(|n| format!("203.0.113.{n}")).collect();
    let a = ips.iter().find(|ip| ab_bucket(ip, "t") == "a").unwrap();
    let b = ips.iter().find(|ip| ab_bucket(ip, "t") == "b").unwrap();
    for ip in [a, b] {
        let header = format!("PROXY TCP4 {ip} 192.0.2.1 40000 80\r\n");
        let mut send = connect(inlay.addr, header.as_bytes()).await;
        let req = http::Request::get(format!("/echo?from={ip}"))
            .header("host", "www.example.com")
            .header("user-agent", "t")
            .body(Empty::new())
            .unwrap();
        send.ready().await.unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .expect("answered within 10 s")
            .unwrap();
        let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert!(
            cookie.starts_with(&format!("inlay_ab={};", ab_bucket(ip, "t"))),
            "{ip}: {cookie}"
        );
    }
}

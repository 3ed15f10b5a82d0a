//! The HTTP/2 server limits (`server.h2_*`), against h2c in process with
//! a raw HTTP/2 client (the `h2` crate): concurrent streams, header list
//! size, the rapid-reset protection, keep-alive pings and idle close.
//! (h2 over TLS is served by the same builder: `tls.rs`.)
//!
//! `cargo test -p inlay --test server -- h2_limits::`

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, get};
use h2::Reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Conn = tokio::task::JoinHandle<Result<(), h2::Error>>;

/// An h2c connection; its driver runs in a task whose result says how the
/// connection ended.
async fn h2c(addr: SocketAddr) -> (h2::client::SendRequest<Bytes>, Conn) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    (send, tokio::spawn(conn))
}

/// GET `path` on `send`: the status, or the stream's error.
async fn get_h2(send: &mut h2::client::SendRequest<Bytes>, path: &str) -> Result<u16, h2::Error> {
    get_with(send, path, &[]).await
}

async fn get_with(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    headers: &[(&str, String)],
) -> Result<u16, h2::Error> {
    let mut req = http::Request::get(format!("http://www.example.com{path}"));
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let ready = send.clone().ready().await?;
    *send = ready;
    let (resp, _) = send.send_request(req.body(()).unwrap(), true)?;
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("an answer within 10 s")?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(status)
}

/// Open `n` streams on a fresh connection and reset each at once, as the
/// rapid-reset attack (CVE-2023-44487) does; the connection, for more.
async fn rapid_resets(addr: SocketAddr, n: usize) -> (h2::client::SendRequest<Bytes>, Conn) {
    let (mut attacker, conn) = h2c(addr).await;
    // Let the settings exchange finish, as an attacker's first request would.
    assert_eq!(get_h2(&mut attacker, "/static/1").await.unwrap(), 200);
    for _ in 0..n {
        let Ok(ready) = attacker.clone().ready().await else {
            break;
        };
        attacker = ready;
        let req = http::Request::get("http://www.example.com/static/100")
            .body(())
            .unwrap();
        let Ok((_, mut stream)) = attacker.send_request(req, false) else {
            break;
        };
        stream.send_reset(Reason::CANCEL);
    }
    (attacker, conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_gets_a_goaway_while_other_clients_are_served() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("h2_max_pending_accept_reset_streams = 20")
        .start_in_process()
        .await;
    let (_attacker, conn) = rapid_resets(inlay.addr, 100).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the connection ended within 10 s")
        .unwrap();
    let e = ended.expect_err("the connection ended without an error");
    assert!(e.is_go_away() && e.is_remote(), "{e:?}");
    assert_eq!(e.reason(), Some(Reason::ENHANCE_YOUR_CALM), "{e:?}");
    // Everyone else is served, on HTTP/1.1 and on HTTP/2.
    assert_eq!(get(&inlay.url("/static/1")).await.status, 200);
    let (mut other, _conn) = h2c(inlay.addr).await;
    assert_eq!(get_h2(&mut other, "/static/1").await.unwrap(), 200);

    // The limit is the setting's: 100 resets pass under a limit of 1000.
    let lenient = Harness::builder()
        .backend(&origin)
        .server("h2_max_pending_accept_reset_streams = 1000")
        .start_in_process()
        .await;
    let (mut attacker, conn) = rapid_resets(lenient.addr, 100).await;
    assert_eq!(get_h2(&mut attacker, "/static/1").await.unwrap(), 200);
    assert!(!conn.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_and_header_limits_are_advertised_and_enforced() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("h2_max_concurrent_streams = 3")
        .server("h2_max_header_list_size = \"16KiB\"")
        .start_in_process()
        .await;
    let (mut send, _conn) = h2c(inlay.addr).await;
    assert_eq!(get_h2(&mut send, "/static/1").await.unwrap(), 200);
    assert_eq!(send.current_max_send_streams(), 3);
    let small = [("x-pad", "a".repeat(4 << 10))];
    assert_eq!(get_with(&mut send, "/static/1", &small).await.unwrap(), 200);
    let big = [("x-pad", "a".repeat(20 << 10))];
    match get_with(&mut send, "/static/1", &big).await {
        Ok(status) => assert_eq!(status, 431),
        Err(e) => assert!(e.reason().is_some(), "{e:?}"),
    }
    // The connection goes on.
    assert_eq!(get_h2(&mut send, "/static/1").await.unwrap(), 200);
}

/// The client's preface and an empty SETTINGS frame, then silence: no
/// SETTINGS ACK, no PING ACK. Whether the server closed within `wait`.
async fn silent_h2c_client(addr: SocketAddr, wait: Duration) -> bool {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_left_unanswered_closes_the_connection() {
    let origin = Origin::start();
    let pinging = Harness::builder()
        .backend(&origin)
        .server("idle_timeout = \"60s\"")
        .server("h2_keep_alive_interval = \"200ms\"")
        .server("h2_keep_alive_timeout = \"300ms\"")
        .start_in_process()
        .await;
    let started = Instant::now();
    assert!(silent_h2c_client(pinging.addr, Duration::from_secs(5)).await);
    assert!(started.elapsed() < Duration::from_secs(3));
    // Without pings (the default) the same client stays connected.
    let quiet = Harness::builder()
        .backend(&origin)
        .server("idle_timeout = \"60s\"")
        .start_in_process()
        .await;
    assert!(!silent_h2c_client(quiet.addr, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_connection_whose_client_only_answers_pings_is_closed_when_idle() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .server("idle_timeout = \"500ms\"")
        .server("h2_keep_alive_interval = \"100ms\"")
        .start_in_process()
        .await;
    let (mut send, conn) = h2c(inlay.addr).await;
    assert_eq!(get_h2(&mut send, "/static/1").await.unwrap(), 200);
    // The client's driver answers every PING; nothing else happens.
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the idle connection was kept open by its pings")
        .unwrap();
    assert!(ended.is_ok(), "a graceful GOAWAY, not an error: {ended:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
}

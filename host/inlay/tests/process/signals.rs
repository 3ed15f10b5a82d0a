//! Signals: SIGTERM drains and exits 0; SIGHUP reloads the policy under load.

use std::time::Duration;

use crate::common::{Inlay, Origin, get, policy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_0() {
    let origin = Origin::start();
    let mut inlay = Inlay::builder().backend(&origin).spawn_process();
    let url = inlay.url("/bytes/100?delay_ms=1500");
    let slow = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    inlay.signal("TERM");
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100);
    let st =
        tokio::task::block_in_place(|| inlay.wait(Duration::from_secs(10))).expect("inlay exited");
    assert!(st.success(), "exit status {st:?}\n{}", inlay.log.text());
    assert!(
        std::net::TcpStream::connect(inlay.addr).is_err(),
        "no longer accepting"
    );
    // The drained request's access-log line was written out before the
    // exit, on stdout (the default).
    assert!(
        inlay.access.wait_for(
            "\"GET /bytes/100?delay_ms=1500 HTTP/1.1\" 200",
            Duration::from_secs(5)
        ),
        "{}",
        inlay.access.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_policy_under_load_without_failing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.wasm");
    std::fs::copy(policy("default"), &live).unwrap();
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("--policy")
        .arg(live.display().to_string())
        .spawn_process();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..8 {
        let url = inlay.url(&format!("/bytes/{}?cc=no-store", w + 1));
        let stop = stop.clone();
        load.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if get(&url).await.status == 200 {
                    ok += 1
                } else {
                    failed += 1
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Swap in `headers` and reload; then a broken file, which must be refused.
    std::fs::copy(policy("headers"), &live).unwrap();
    inlay.signal("HUP");
    inlay.expect_log("policy reloaded", Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&live, b"not a wasm component").unwrap();
    inlay.signal("HUP");
    inlay.expect_log("reload refused", Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed) = (0, 0);
    for l in load {
        let (o, f) = l.await.unwrap();
        ok += o;
        failed += f;
    }
    assert_eq!(
        failed, 0,
        "{failed} requests failed during reloads ({ok} ok)"
    );
    assert!(ok > 50);
    // The new policy serves; the broken file did not replace it.
    assert_eq!(
        get(&inlay.url("/resp")).await.header("x-inlay-policy"),
        Some("headers")
    );
}

/// A WebSocket to `path` through the HTTP/1.1 upgrade.
async fn websocket(
    addr: std::net::SocketAddr,
    path: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let (ws, resp) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    ws
}

/// The echo answers `text` on `ws` within 2 s.
async fn echoes<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>, text: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    ws.send(Message::text(text)).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(2), ws.next()).await;
    assert!(
        matches!(&back, Ok(Some(Ok(Message::Text(t)))) if t.as_str() == text),
        "{text}: {back:?}"
    );
}

/// How long until `ws` is closed by the other side (at most `within`).
async fn closed_after<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    within: Duration,
) -> Duration
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::StreamExt;
    let started = std::time::Instant::now();
    match tokio::time::timeout(within, ws.next()).await {
        Ok(None | Some(Err(_))) => started.elapsed(),
        Ok(Some(Ok(m))) => panic!("unexpected message {m:?}"),
        Err(_) => panic!("still open after {within:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_websockets_open_until_shutdown_timeout_then_closes_them() {
    let origin = Origin::start();
    let mut inlay = Inlay::builder()
        .backend(&origin)
        .server("shutdown_timeout = \"2s\"")
        .toml("[log]\naccess_log_format = \"json\"")
        .spawn_process();
    let mut ws = websocket(inlay.addr, "/ws?drain").await;
    echoes(&mut ws, "before").await;
    let signalled = std::time::Instant::now();
    inlay.signal("TERM");
    // Draining: the tunnel still carries messages ...
    tokio::time::sleep(Duration::from_millis(1000)).await;
    echoes(&mut ws, "while draining").await;
    // ... until shutdown_timeout, when it is closed and the process exits.
    closed_after(&mut ws, Duration::from_secs(5)).await;
    let open_for = signalled.elapsed();
    assert!(
        (Duration::from_millis(1900)..Duration::from_secs(4)).contains(&open_for),
        "closed {open_for:?} after SIGTERM"
    );
    let st =
        tokio::task::block_in_place(|| inlay.wait(Duration::from_secs(10))).expect("inlay exited");
    assert!(st.success(), "exit status {st:?}\n{}", inlay.log.text());
    assert!(
        inlay
            .access
            .wait_for("end of the drain", Duration::from_secs(5)),
        "{}",
        inlay.access.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_closes_the_websockets_it_replaced_after_shutdown_timeout() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .server("shutdown_timeout = \"2s\"")
        .spawn_process();
    let mut old = websocket(inlay.addr, "/ws?old").await;
    let text = std::fs::read_to_string(&inlay.config).unwrap();
    let reloaded = std::time::Instant::now();
    tokio::task::block_in_place(|| inlay.reload_to(&text, 2));
    // The new generation's tunnels and the old one's work side by side ...
    let mut new = websocket(inlay.addr, "/ws?new").await;
    echoes(&mut old, "old, after the reload").await;
    echoes(&mut new, "new").await;
    // ... until shutdown_timeout after the reload closes the old one.
    closed_after(&mut old, Duration::from_secs(5)).await;
    let open_for = reloaded.elapsed();
    assert!(
        (Duration::from_millis(1900)..Duration::from_secs(5)).contains(&open_for),
        "closed {open_for:?} after the reload"
    );
    echoes(&mut new, "new, after the old one closed").await;
}

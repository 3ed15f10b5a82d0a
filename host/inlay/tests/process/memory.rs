//! The resident memory of the whole process: bodies stream through in
//! bounded memory, failing policies do not leak, and bans take at most
//! their budget and give it back when they go.

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::common::{Inlay, Origin, get, policy, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_body_streams_through_with_bounded_memory() {
    let origin = Origin::start();
    // The upload below is larger than the default `max_request_body`.
    let inlay = Inlay::builder()
        .backend(&origin)
        .server("max_request_body = \"1GiB\"")
        .spawn_process();
    let before = inlay.rss_kib();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(inlay.url("/bytes/1073741824?chunk=65536"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    let mut total: u64 = 0;
    let mut peak = before;
    let mut frames = 0u64;
    while let Some(f) = resp.body_mut().frame().await {
        total += f.unwrap().data_ref().map(|d| d.len() as u64).unwrap_or(0);
        frames += 1;
        if frames.is_multiple_of(2048) {
            peak = peak.max(inlay.rss_kib());
        }
    }
    assert_eq!(total, 1 << 30);
    let growth_mib = (peak.saturating_sub(before)) / 1024;
    assert!(
        growth_mib <= 16,
        "inlay grew by {growth_mib} MiB while streaming 1 GiB (rss {before} -> {peak} KiB)"
    );

    // And a 256 MiB request body streams to the origin the same way.
    let (tx, body) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 1 << 20]);
        for _ in 0..256 {
            if tx
                .send(Ok(http_body::Frame::data(chunk.clone())))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let mut rx = body;
    let body =
        http_body_util::StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let up = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::post(inlay.url("/upload"))
        .body(body)
        .unwrap();
    let resp = up.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let j: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(j["bytes"], 256u64 << 20);
    let after = inlay.rss_kib();
    assert!(
        (after.saturating_sub(before)) / 1024 <= 16,
        "rss {before} -> {after} KiB after upload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_out_of_memory_leaves_the_process_memory_bounded() {
    // That each such request fails alone: policies.rs.
    let origin = Origin::start();
    // As in policies.rs: a CPU budget the fixture cannot use up, so that
    // it is the memory cap that stops each request.
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\ncpu_time = \"3s\"",
            policy("oom").display().to_string()
        ))
        .spawn_process();
    // Warm up: the first failure and a good request set the baseline.
    assert!(get(&inlay.url("/oom")).await.status >= 500);
    assert_eq!(get(&inlay.url("/resp")).await.status, 200);
    let rss_before = inlay.rss_kib();
    for _ in 0..10 {
        assert!(get(&inlay.url("/oom")).await.status >= 500);
    }
    let growth = inlay.rss_kib().saturating_sub(rss_before) / 1024;
    assert!(
        growth < 100,
        "rss grew by {growth} MiB over 10 OOM requests"
    );
}

/// An origin that answers one cacheable response and holds the last byte
/// of its body until `release` fires: the fill stays open, and the ban
/// lurker drops no ban made meanwhile (a ban goes only once every fill
/// older than it has ended), so the test does not race the lurker.
async fn holding_origin() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = [0u8; 4096];
        let _ = s.read(&mut head).await;
        s.write_all(b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 2\r\n\r\na")
            .await
            .unwrap();
        let _ = released.await;
        let _ = s.write_all(b"b").await;
        let _ = s.read(&mut head).await;
    });
    (addr, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_take_at_most_their_budget_and_give_it_back_when_the_lurker_drops_them() {
    let (origin, release) = holding_origin().await;
    let inlay = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://{origin}\""
        ))
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let admin = crate::admin::admin_addr(&inlay);
    // Bans need the cache open (the admin API answers before it is).
    while get(&format!("http://{admin}/readyz")).await.status != 200 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let json = [("content-type", "application/json")];
    let ban = |n: usize| {
        // The ban: 16 regexes each just under the size limit.
        let expression = (0..16)
            .map(|i| format!("obj.http.x-{n}-{i} ~ \"[a-z0-9_]{{737}}I\""))
            .collect::<Vec<_>>()
            .join(" && ");
        Bytes::from(serde_json::json!({ "expression": expression }).to_string())
    };
    let url = format!("http://{admin}/ban");
    let bans_left = || async {
        let r = get(&format!("http://{admin}/bans")).await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        v["counts"]["active"].as_u64().unwrap()
    };
    let wait_dropped = || async {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while bans_left().await > 0 {
            assert!(
                std::time::Instant::now() < until,
                "the lurker kept the bans"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    // Warm up: one ban made and dropped, so the baseline has the heap
    // the first one leaves.
    assert_eq!(request("POST", &url, &json, ban(0)).await.status, 200);
    wait_dropped().await;
    let before = inlay.rss_kib();
    // A fill stays open: the lurker keeps every ban made from now on.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let req = http::Request::get(inlay.url("/held"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let held = client.request(req).await.unwrap();
    assert_eq!(held.status(), 200);
    // 300 of these took the process from 23 to 260 MB: the budget
    // (cache.ban_memory, 64 MiB) refuses one long before.
    let mut added = 0;
    loop {
        assert!(added < 300, "300 heavy bans accepted");
        let r = request("POST", &url, &json, ban(added + 1)).await;
        if r.status != 200 {
            assert_eq!(r.status, 400, "{}", r.text());
            assert!(r.text().contains("ban memory budget"), "{}", r.text());
            break;
        }
        added += 1;
    }
    assert_eq!(bans_left().await, added as u64, "the lurker kept them");
    let peak = inlay.rss_kib();
    let growth_mib = peak.saturating_sub(before) / 1024;
    assert!(
        growth_mib <= 96,
        "{added} bans grew the process by {growth_mib} MiB (rss {before} -> {peak} KiB)"
    );
    // The fill ends and the lurker drops them: the memory comes back.
    release.send(()).unwrap();
    drop(held);
    wait_dropped().await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let after = loop {
        let now = inlay.rss_kib();
        if now.saturating_sub(before) / 1024 <= 16 || std::time::Instant::now() > until {
            break now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        after.saturating_sub(before) / 1024 <= 16,
        "the memory of {added} dropped bans stayed: rss {before} -> {peak} -> {after} KiB"
    );
}

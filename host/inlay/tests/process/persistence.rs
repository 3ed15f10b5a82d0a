//! What survives the process: the cache after kill -9, kv after a clean stop.

use std::time::Duration;

use bytes::Bytes;

use crate::common::{Inlay, Origin, get, get_site, policy, request, unused_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_survives_kill_9_and_purges_stay_purged() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start();
    let cache_arg = dir.path().join("cache").display().to_string();
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("--cache-dir")
        .arg(&cache_arg)
        .spawn_process();
    for n in [101, 102, 103] {
        get_site(&inlay.url(&format!("/bytes/{n}?cc=max-age%3D600"))).await;
    }
    get_site(&inlay.url("/bytes/200000?cc=max-age%3D600")).await; // several chunks
    let r = request(
        "PURGE",
        &inlay.url("/bytes/103?cc=max-age%3D600"),
        &[("host", "www.example.com")],
        Bytes::new(),
    )
    .await;
    assert!(r.text().contains("\"purged\":1"), "{}", r.text());
    // sled fsyncs every 500 ms; give it one period.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    inlay.signal("KILL");
    drop(inlay);
    // Restart against a dead origin: what was cached is served from disk.
    let dead_port = unused_port();
    let restarted = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{dead_port}\""
        ))
        .arg("--cache-dir")
        .arg(&cache_arg)
        .spawn_process();
    for n in [101, 102] {
        let r = get_site(&restarted.url(&format!("/bytes/{n}?cc=max-age%3D600"))).await;
        assert_eq!(r.status, 200, "object {n} lost after kill -9");
        assert_eq!(r.body.len(), n);
    }
    let r = get_site(&restarted.url("/bytes/200000?cc=max-age%3D600")).await;
    assert_eq!((r.status, r.body.len()), (200, 200000));
    let r = get_site(&restarted.url("/bytes/103?cc=max-age%3D600")).await;
    assert_eq!(r.status, 503, "a purged object must not come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_survives_kill_9_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start();
    let cache_arg = dir.path().join("cache").display().to_string();
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("--cache-dir")
        .arg(&cache_arg)
        .spawn_process();
    let json = "/bytes/111?cc=max-age%3D600&ct=application%2Fjson";
    let html = "/bytes/112?cc=max-age%3D600&ct=text%2Fhtml";
    get_site(&inlay.url(json)).await;
    get_site(&inlay.url(html)).await;
    // sled fsyncs every 500 ms: let the objects reach the disk.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = request(
        "BAN",
        &inlay.url("/"),
        &[(
            "ban",
            "req.url ~ ^/bytes/11 && obj.http.content-type ~ json",
        )],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Killed as soon as the ban is acknowledged.
    inlay.signal("KILL");
    drop(inlay);
    let dead_port = unused_port();
    let restarted = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{dead_port}\""
        ))
        .arg("--cache-dir")
        .arg(&cache_arg)
        .spawn_process();
    let r = get_site(&restarted.url(html)).await;
    assert_eq!(r.status, 200, "an object the ban does not cover is kept");
    let r = get_site(&restarted.url(json)).await;
    assert_eq!(r.status, 503, "a banned object must not come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_kv_survives_a_clean_stop_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start();
    let start = || {
        Inlay::builder()
            .backend(&origin)
            .arg("--policy")
            .arg(policy("capabilities").display().to_string())
            .arg("--cache-dir")
            .arg(dir.path().join("c").display().to_string())
            .spawn_process()
    };
    let mut inlay = start();
    assert_eq!(get(&inlay.url("/cap/kv")).await.text(), "1");
    assert_eq!(get(&inlay.url("/cap/kv")).await.text(), "2");
    // A clean stop (SIGTERM) flushes the store.
    inlay.signal("TERM");
    assert!(
        tokio::task::block_in_place(|| inlay.wait(Duration::from_secs(20)))
            .is_some_and(|s| s.success())
    );
    drop(inlay);
    let again = start();
    assert_eq!(
        get(&again.url("/cap/kv")).await.text(),
        "3",
        "kv survives a restart"
    );
}

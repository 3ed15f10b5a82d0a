//! Purge fan-out across kill -9: a node killed while the others purge,
//! restarted on its cache directory, serves none of what they purged (the
//! purges it applied before it died, and those it missed) and the rest from
//! disk.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{Harness, Inlay, NatsServer, Origin, get_site, request, unused_port};

/// `inlay_cluster_invalidations_total{kind="applied"}` on the admin API at `admin`.
async fn applied(admin: &str) -> u64 {
    let r = crate::common::get(&format!("{admin}/metrics")).await;
    r.text()
        .lines()
        .find(|l| l.starts_with("inlay_cluster_invalidations_total{kind=\"applied\"}"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_restarted_serves_nothing_the_others_purged() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let cluster = |name: &str| {
        format!(
            "[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{name}\"",
            nats.url()
        )
    };
    let a = Harness::builder()
        .backend(&origin)
        .toml(&cluster("a"))
        .start_in_process()
        .await;
    let dir = tempfile::tempdir().unwrap();
    let cache_arg = dir.path().join("cache").display().to_string();
    let admin_port = unused_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let b = Inlay::builder()
        .backend(&origin)
        .toml(&format!(
            "{}\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"",
            cluster("b")
        ))
        .arg("--cache-dir")
        .arg(&cache_arg)
        .spawn_process();
    let paths: Vec<String> = (0..4)
        .map(|i| format!("/bytes/{}?cc=max-age%3D600", 160 + i))
        .collect();
    for p in &paths {
        get_site(&b.url(p)).await;
    }
    let purge = |p: &str| {
        let url = a.url(p);
        async move { request("PURGE", &url, &[("host", "www.example.com")], Bytes::new()).await }
    };
    // One purge b applies while it runs...
    assert_eq!(purge(&paths[0]).await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while applied(&admin).await < 1 {
        assert!(Instant::now() < deadline, "b applied the purge");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.signal("KILL");
    drop(b);
    // ...and one it misses.
    assert_eq!(purge(&paths[1]).await.status, 200);

    // Restarted against a dead origin: what is still cached comes from disk.
    let restarted = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{}\"\n{}",
            unused_port(),
            cluster("b")
        ))
        .arg("--cache-dir")
        .arg(&cache_arg)
        .spawn_process();
    for p in &paths[..2] {
        let r = get_site(&restarted.url(p)).await;
        assert_eq!(r.status, 503, "{p} was purged: it must not come back");
    }
    for p in &paths[2..] {
        let r = get_site(&restarted.url(p)).await;
        assert_eq!(r.status, 200, "{p} is still served from disk");
    }
}

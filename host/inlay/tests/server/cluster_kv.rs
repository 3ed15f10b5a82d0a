//! The policies' kv shared by the cluster (`cluster.kv = "nats"`), against
//! a real `nats-server` on a loopback port (skipped, saying so, where it is
//! not installed): nodes in process running the `capabilities` fixture
//! (`/cap/kv` counts in the kv key `hits`), and the nodes' own
//! [`SharedKv`] where a test must read a node's copy without writing.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, NatsServer, Origin, get, policy, request};
use inlay::config::Config;
use inlay_cluster::Cluster;
use inlay_cluster::kv::SharedKv;

/// The `capabilities` fixture's kv namespace (its file's name).
const NS: &str = "capabilities";

fn cluster_table(nats: &NatsServer, node: &str, extra: &str) -> String {
    format!(
        "[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{node}\"\nkv = \"nats\"\n{extra}\n",
        nats.url()
    )
}

/// A node serving the `capabilities` fixture with the shared kv.
async fn node(origin: &Origin, nats: &NatsServer, name: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .arg("--policy")
        .arg(policy("capabilities").display().to_string())
        .toml(&format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n{}",
            cluster_table(nats, name, "")
        ))
        .start_in_process()
        .await
}

/// The shared kv as a node opens it, with `extra` `[cluster]` settings.
async fn shared_kv(nats: &NatsServer, name: &str, extra: &str) -> SharedKv {
    let cfg = Config::from_toml(&format!(
        "[backends.default]\naddress = \"http://127.0.0.1:9\"\n{}",
        cluster_table(nats, name, extra)
    ))
    .unwrap();
    let cluster = Cluster::connect(cfg.cluster.as_ref().unwrap(), Default::default())
        .await
        .unwrap();
    SharedKv::open(&cluster).await.unwrap()
}

/// Polls `check` until it holds, for at most 10 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn text(v: Option<Vec<u8>>) -> Option<String> {
    v.map(|v| String::from_utf8(v).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policys_kv_writes_reach_the_other_nodes_and_a_node_started_later() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&origin, &nats, "edge-a").await;
    let watcher = shared_kv(&nats, "edge-w", "").await;
    // A node reads its own writes at once.
    assert_eq!(get(&a.url("/cap/kv")).await.text(), "1");
    assert_eq!(get(&a.url("/cap/kv")).await.text(), "2");
    // Another node's copy gets them from the bucket's watch.
    eventually("the other node reads 2", || {
        text(watcher.get(NS, "hits")).as_deref() == Some("2")
    })
    .await;
    let metrics = a.metrics.render().await;
    assert!(metrics.contains("inlay_cluster_kv_keys 1\n"), "{metrics}");
    assert!(
        metrics.contains("inlay_cluster_kv_dropped_total 0\n"),
        "{metrics}"
    );
    // A node started after the writes starts with them.
    let b = node(&origin, &nats, "edge-b").await;
    assert_eq!(get(&b.url("/cap/kv")).await.text(), "3");
    // A config reload keeps the shared kv.
    let r = request("POST", &b.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(&b.url("/cap/kv")).await.text(), "4");
    eventually("the other node reads B's 4", || {
        text(watcher.get(NS, "hits")).as_deref() == Some("4")
    })
    .await;
    // Without `kv = "nats"` a node keeps its own kv.
    let alone = Harness::builder()
        .backend(&origin)
        .arg("--policy")
        .arg(policy("capabilities").display().to_string())
        .start_in_process()
        .await;
    assert_eq!(get(&alone.url("/cap/kv")).await.text(), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_deletes_propagate_between_nodes() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let a = shared_kv(&nats, "edge-a", "").await;
    let b = shared_kv(&nats, "edge-b", "").await;
    a.set(NS, "colour", b"blue".to_vec()).await.unwrap();
    assert_eq!(text(a.get(NS, "colour")).as_deref(), Some("blue"));
    eventually("b reads a's write", || {
        text(b.get(NS, "colour")).as_deref() == Some("blue")
    })
    .await;
    // A figure for docs/SCALE.md (`cargo test -p inlay --test server --
    // --nocapture cluster_kv::writes_and_deletes`): from a write's start on one node to its read on
    // the other, over 100 writes.
    let mut seen = Vec::new();
    for i in 0..100 {
        let value = format!("v{i}");
        let written = Instant::now();
        a.set(NS, "latency", value.clone().into_bytes())
            .await
            .unwrap();
        while text(b.get(NS, "latency")).as_deref() != Some(value.as_str()) {
            assert!(
                written.elapsed() < Duration::from_secs(10),
                "write {i} not seen"
            );
            tokio::task::yield_now().await;
        }
        seen.push(written.elapsed());
    }
    seen.sort();
    eprintln!(
        "shared kv: write started on one node to read on another: p50 {:?}, p99 {:?}, max {:?} (100 writes, debug build)",
        seen[49], seen[98], seen[99]
    );
    // Any key a policy may use, empty included.
    b.set(NS, "", b"empty key".to_vec()).await.unwrap();
    b.set(NS, "a b/c.*>", b"odd key".to_vec()).await.unwrap();
    eventually("a reads b's odd keys", || {
        a.get(NS, "").is_some() && a.get(NS, "a b/c.*>").is_some()
    })
    .await;
    // Namespaces stay apart.
    assert_eq!(a.get("other", "colour"), None);
    assert!(a.delete(NS, "colour").await.unwrap());
    assert_eq!(a.get(NS, "colour"), None);
    eventually("b sees the delete", || b.get(NS, "colour").is_none()).await;
    assert!(!b.delete(NS, "never-set").await.unwrap());
    // A write after a delete is read again everywhere.
    b.set(NS, "colour", b"green".to_vec()).await.unwrap();
    eventually("a reads b's write after the delete", || {
        text(a.get(NS, "colour")).as_deref() == Some("green")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_kv_is_bounded_in_the_bucket_and_in_each_copy() {
    crate::require_nats!();
    let nats = NatsServer::start();
    // The first node makes the bucket, with its bound.
    let small = shared_kv(&nats, "edge-small", "kv_max_bytes = \"4KiB\"").await;
    let kilobyte = || vec![b'x'; 1000];
    for i in 0..3 {
        small.set(NS, &format!("k{i}"), kilobyte()).await.unwrap();
    }
    let err = small.set(NS, "k3", kilobyte()).await.unwrap_err();
    assert!(err.contains("full"), "{err}");
    assert_eq!(small.get(NS, "k3"), None);
    // A node configured with a larger bound is still held to the bucket's.
    let large = shared_kv(&nats, "edge-large", "kv_max_bytes = \"1MiB\"").await;
    let err = large.set(NS, "k3", kilobyte()).await.unwrap_err();
    assert!(err.contains("full"), "{err}");
    // Values and keys as large as the local kv's limits, no larger.
    let err = large
        .set(NS, "big", vec![0; 32 * 1024 + 1])
        .await
        .unwrap_err();
    assert!(err.contains("kv value"), "{err}");
    let err = large.set(NS, &"k".repeat(1025), vec![]).await.unwrap_err();
    assert!(err.contains("kv key"), "{err}");
    // Freeing space lets writes in again.
    assert!(small.delete(NS, "k0").await.unwrap());
    small.set(NS, "k3", kilobyte()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_leaves_out_what_does_not_fit_its_bound_and_oversized_messages_are_refused() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let large = shared_kv(&nats, "edge-large", "kv_max_bytes = \"1MiB\"").await;
    let small = shared_kv(&nats, "edge-small", "kv_max_bytes = \"4KiB\"").await;
    for i in 0..6 {
        large
            .set(NS, &format!("k{i}"), vec![b'x'; 1000])
            .await
            .unwrap();
    }
    eventually("the small copy drops what it cannot hold", || {
        small.dropped() >= 3
    })
    .await;
    let held = (0..6)
        .filter(|i| small.get(NS, &format!("k{i}")).is_some())
        .count();
    assert!((1..=3).contains(&held), "{held} entries held in 4 KiB");
    // A message larger than any entry, published on the bucket's subjects
    // by hand, is refused by the stream.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let refused = match js
        .publish("$KV.INLAY_KV.x", vec![0u8; 200 * 1024].into())
        .await
    {
        Ok(ack) => ack.await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "the stream took a 200 KiB value");
}

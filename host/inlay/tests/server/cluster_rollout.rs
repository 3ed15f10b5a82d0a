//! Policy rollout over the cluster (`inlay admin policy push`, `rollback`),
//! against a real `nats-server` on a loopback port (skipped, saying so,
//! where it is not installed), with nodes in process. Every node starts
//! with the `default` policy; the `headers` policy adds
//! `x-inlay-policy: headers` to responses, so a node's behaviour says which
//! one it runs.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, NatsServer, Origin, get, policy, raw, request};
use serde_json::Value;

/// A node, once ready: it has applied the cluster's current version.
async fn node(origin: &Origin, nats: &NatsServer, name: &str, extra: &str) -> Harness {
    let node = Harness::builder()
        .backend(origin)
        .toml(&format!(
            "[policy]\npath = {:?}\n[admin]\nlisten = \"127.0.0.1:0\"\n[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{name}\"\n{extra}\n",
            policy("default").display().to_string(),
            nats.url()
        ))
        .start_in_process()
        .await;
    ready(node, name).await
}

/// `node` once its admin API says it is ready (it has applied the
/// cluster's current versions).
async fn ready(node: Harness, name: &str) -> Harness {
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&node.admin_url("/readyz")).await.status != 200 {
        assert!(Instant::now() < deadline, "{name} not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node
}

fn wasm(name: &str) -> Bytes {
    Bytes::from(std::fs::read(policy(name)).unwrap())
}

/// `POST /policy/push` on `node`: the status and the answer.
async fn push(node: &Harness, component: Bytes) -> (u16, Value) {
    let media_type = [("content-type", inlay::admin::WASM_MEDIA_TYPE)];
    let r = request(
        "POST",
        &node.admin_url("/policy/push"),
        &media_type,
        component,
    )
    .await;
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

async fn status(node: &Harness) -> Value {
    let r = get(&node.admin_url("/policy")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

/// Whether `node` answers as the `headers` policy does (a fresh URL each
/// time: a cached response says nothing of the policy running now).
async fn runs_headers(node: &Harness) -> bool {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let r = get(&node.url(&format!("/echo?probe={n}"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-inlay-policy") == Some("headers")
}

/// Polls every node until `check` holds for it, for at most 20 s.
async fn on_every_node(nodes: &[&Harness], what: &str, check: impl AsyncFn(&Harness) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for (i, n) in nodes.iter().enumerate() {
        while !check(n).await {
            assert!(
                Instant::now() < deadline,
                "node {i}: not within 20 s: {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn version(v: &Value) -> Option<&str> {
    v["version"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_reaches_every_node_and_a_rollback_returns_them_all() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&origin, &nats, "edge-a", "").await;
    let b = node(&origin, &nats, "edge-b", "").await;
    let c = node(&origin, &nats, "edge-c", "").await;
    let nodes = [&a, &b, &c];
    assert!(!runs_headers(&a).await);
    assert_eq!(status(&a).await["version"], Value::Null);

    let (code, v1) = push(&a, wasm("default")).await;
    assert_eq!(code, 200, "{v1}");
    let v1 = v1["pushed"].as_str().unwrap().to_owned();
    on_every_node(&nodes, "runs v1", async |n| {
        version(&status(n).await) == Some(v1.as_str())
    })
    .await;

    let pushed = Instant::now();
    let (code, v2) = push(&b, wasm("headers")).await;
    assert_eq!(code, 200, "{v2}");
    let v2 = v2["pushed"].as_str().unwrap().to_owned();
    assert_ne!(v1, v2);
    on_every_node(&nodes, "runs the pushed headers policy", async |n| {
        version(&status(n).await) == Some(v2.as_str()) && runs_headers(n).await
    })
    .await;
    // A figure for docs/SCALE.md: `cargo test -p inlay --test server -- --nocapture cluster_rollout::`.
    eprintln!(
        "rollout: from the push request to 3 nodes seen running the new version: {:?} (debug build)",
        pushed.elapsed()
    );
    for n in nodes {
        let text = n.metrics.render().await;
        let line = format!("inlay_policy_info{{version=\"{v2}\"}} 1");
        assert!(text.contains(&line), "no {line} in:\n{text}");
        assert!(!text.contains(&format!("version=\"{v1}\"")), "{text}");
    }
    let cluster = status(&c).await["cluster"].clone();
    assert_eq!(cluster["current"], v2.as_str());
    assert_eq!(cluster["history"], serde_json::json!([v1, v2]));

    let r = request("POST", &c.admin_url("/policy/rollback"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    on_every_node(&nodes, "back on v1", async |n| {
        version(&status(n).await) == Some(v1.as_str()) && !runs_headers(n).await
    })
    .await;
    // Rolling back the first version returns every node to its own
    // policy.path; after that there is nothing to roll back.
    let r = request("POST", &a.admin_url("/policy/rollback"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answer: Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(answer["current"], Value::Null, "{answer}");
    on_every_node(&nodes, "back on its own policy.path", async |n| {
        status(n).await["version"] == Value::Null && !runs_headers(n).await
    })
    .await;
    for n in nodes {
        let text = n.metrics.render().await;
        assert!(!text.contains("inlay_policy_info{"), "{text}");
    }
    let r = request("POST", &a.admin_url("/policy/rollback"), &[], Bytes::new()).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("nothing to roll back"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_does_not_compile_is_refused_everywhere_and_nothing_changes() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let extra = "policy_max_size = \"1MiB\"";
    let a = node(&origin, &nats, "edge-a", extra).await;
    let b = node(&origin, &nats, "edge-b", extra).await;
    let c = node(&origin, &nats, "edge-c", extra).await;
    let nodes = [&a, &b, &c];
    let (code, good) = push(&a, wasm("headers")).await;
    assert_eq!(code, 200, "{good}");
    let good = good["pushed"].as_str().unwrap().to_owned();
    on_every_node(&nodes, "runs headers", async |n| {
        version(&status(n).await) == Some(good.as_str())
    })
    .await;

    // A WebAssembly header and garbage: stored, then refused by each node.
    let (code, broken) = push(&b, Bytes::from_static(b"\0asm\x0d\0\x01\0not a component")).await;
    assert_eq!(code, 200, "{broken}");
    let broken = broken["pushed"].as_str().unwrap().to_owned();
    on_every_node(&nodes, "refuses the broken version", async |n| {
        status(n).await["refused"]["version"] == broken.as_str()
    })
    .await;
    for n in nodes {
        let s = status(n).await;
        let why = s["refused"]["error"].as_str().unwrap_or_default();
        assert!(why.contains(&format!("{broken}.wasm")), "{s}");
        assert_eq!(version(&s), Some(good.as_str()));
        assert!(runs_headers(n).await, "a node lost its policy");
    }

    // What is not WebAssembly, or is too large, is not stored at all.
    let (code, answer) = push(&c, Bytes::from_static(b"#!/bin/sh\n")).await;
    assert_eq!(code, 400, "{answer}");
    // (The head alone: the answer comes before the body, and the client
    // may see the connection close while it still sends.)
    let head = format!(
        "POST /policy/push HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/wasm\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        (1 << 20) + 1
    );
    let (answer, _) = raw(
        c.admin_addr.unwrap(),
        head.as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(status(&c).await["cluster"]["current"], broken.as_str());
    // One push at a time per node (each may buffer policy_max_size): while
    // one's body is awaited, another is refused. (If the second comes
    // first, the slow one is the refused one: try again.)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut slow = tokio::net::TcpStream::connect(c.admin_addr.unwrap())
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut slow,
            b"POST /policy/push HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/wasm\r\ncontent-length: 1000\r\n\r\n\0asm",
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (code, answer) = push(&c, wasm("headers")).await;
        if code == 409 {
            break;
        }
        assert_eq!(code, 200, "{answer}");
        assert!(Instant::now() < deadline, "a second push was never refused");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_after_a_push_runs_the_pushed_version() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&origin, &nats, "edge-a", "").await;
    let (code, pushed) = push(&a, wasm("headers")).await;
    assert_eq!(code, 200, "{pushed}");
    let pushed = pushed["pushed"].as_str().unwrap().to_owned();
    // It applies the current version before it serves.
    let late = node(&origin, &nats, "edge-late", "").await;
    assert_eq!(version(&status(&late).await), Some(pushed.as_str()));
    assert!(runs_headers(&late).await);
    // A config reload keeps the pushed version (it replaces policy.path's
    // file until the next push).
    let r = request("POST", &late.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        runs_headers(&late).await,
        "a reload went back to policy.path"
    );
    // Its own policy.path is what a node without the cluster runs.
    let alone = Harness::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}",
            policy("default").display().to_string()
        ))
        .start_in_process()
        .await;
    assert!(!runs_headers(&alone).await);
}

/// A node whose default backend is the `hello-rs` component, once ready.
async fn component_node(nats: &NatsServer, name: &str) -> Harness {
    let node = Harness::builder()
        .toml(&format!(
            "[backends.default]\ncomponent = {:?}\n[admin]\nlisten = \"127.0.0.1:0\"\n[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{name}\"\n",
            common::component("hello-rs").display().to_string(),
            nats.url()
        ))
        .start_in_process()
        .await;
    ready(node, name).await
}

/// What `node`'s component answers to `/hello` (a fresh URL each time:
/// not cached).
async fn hello(node: &Harness) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let r = get(&node.url(&format!("/hello?probe={n}"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_backends_file_rolls_out_to_every_node_without_dropping_a_request() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let a = component_node(&nats, "edge-a").await;
    let b = component_node(&nats, "edge-b").await;
    let c = component_node(&nats, "edge-c").await;
    let nodes = [&a, &b, &c];
    const RUST: &str = "hello from a Rust component\n";
    const P3: &str = "hello from a Rust 0.3 component\n";
    assert_eq!(hello(&a).await, RUST);
    // Requests run on every node all through the rollout.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = nodes
        .iter()
        .map(|n| {
            let stop = std::sync::Arc::clone(&stop);
            let url = n.url("/hello?load");
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = get(&format!("{url}={}", statuses.len())).await;
                    statuses.push(r.status);
                }
                statuses
            })
        })
        .collect();
    let media_type = [("content-type", inlay::admin::WASM_MEDIA_TYPE)];
    let bytes = Bytes::from(std::fs::read(common::component("hello-p3-rs")).unwrap());
    let r = request(
        "POST",
        &b.admin_url("/policy/push?component=default"),
        &media_type,
        bytes,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let pushed: Value = serde_json::from_slice(&r.body).unwrap();
    let pushed = pushed["pushed"].as_str().unwrap().to_owned();
    on_every_node(&nodes, "serves the pushed component", async |n| {
        hello(n).await == P3
    })
    .await;
    for n in nodes {
        let r = get(&n.admin_url("/policy?component=default")).await;
        let s: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(version(&s), Some(pushed.as_str()), "{s}");
        // The policy's own rollout is apart.
        assert_eq!(status(n).await["cluster"], Value::Null);
    }
    // A reload keeps the pushed file.
    let r = request("POST", &c.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(hello(&c).await, P3);
    // Rolling it back returns every node to its configured file.
    let r = request(
        "POST",
        &a.admin_url("/policy/rollback?component=default"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    on_every_node(&nodes, "back on its configured file", async |n| {
        hello(n).await == RUST
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let statuses = task.await.unwrap();
        assert!(!statuses.is_empty());
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
    // A backend that is not a component is not a name a push takes.
    let r = request(
        "POST",
        &a.admin_url("/policy/rollback?component=no%20such"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

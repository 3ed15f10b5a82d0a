//! Sharding by key with real processes: the owner of a third of the keys is
//! killed (SIGKILL: no leave message) while clients load the other nodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::common::{Inlay, NatsServer, Origin, request};

fn node(nats: &NatsServer, origin: &Origin, name: &str) -> Inlay {
    Inlay::builder()
        .backend(origin)
        .toml(&format!(
            "[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{name}\"\nshard = true\n\
             heartbeat_interval = \"200ms\"\ndead_after = \"1s\"\npeer_connect_timeout = \"300ms\"",
            nats.url()
        ))
        .spawn_process()
}

/// Lines of `inlay`'s diagnostic log that contain `needle`.
fn count(inlay: &Inlay, needle: &str) -> usize {
    inlay
        .log
        .all()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

/// Polls `done` every 20 ms; fails after `within`. Returns the time taken.
async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_costs_no_client_an_error() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = Arc::new(node(&nats, &origin, "edge-a"));
    let b = Arc::new(node(&nats, &origin, "edge-b"));
    let c = node(&nats, &origin, "edge-c");
    wait_until("membership converges", Duration::from_secs(30), || {
        [&*a, &*b, &c]
            .iter()
            .all(|n| count(n, "cluster: a node joined") >= 2)
    })
    .await;
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let (done, finished) = tokio::sync::watch::channel(false);
    let mut clients = Vec::new();
    for k in 0..2 {
        let (a, b, ok, errors, mut finished) = (
            a.clone(),
            b.clone(),
            ok.clone(),
            errors.clone(),
            finished.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut i = k;
            while !*finished.borrow_and_update() {
                let node = if i % 2 == 0 { &a } else { &b };
                // A new object each time: a miss, a third of them owned by edge-c.
                let n = 1000 + i;
                let r = request(
                    "GET",
                    &node.url(&format!("/static/{n}")),
                    &[("host", "www.example.com")],
                    Bytes::new(),
                )
                .await;
                if r.status == 200 && r.body.len() == n {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("/static/{n}: {} {}", r.status, r.text());
                }
                i += 1;
            }
        }));
    }
    wait_until("load runs", Duration::from_secs(30), || {
        ok.load(Ordering::Relaxed) >= 300
    })
    .await;
    c.signal("KILL");
    let killed = Instant::now();
    let before = ok.load(Ordering::Relaxed);
    let dropped = wait_until(
        "the others find edge-c dead",
        Duration::from_secs(30),
        || count(&a, "a node is dead") >= 1 && count(&b, "a node is dead") >= 1,
    )
    .await;
    wait_until("load goes on", Duration::from_secs(30), || {
        ok.load(Ordering::Relaxed) >= before + 600
    })
    .await;
    done.send(true).unwrap();
    for client in clients {
        client.await.unwrap();
    }
    let fell_back = count(&a, "owner cannot be reached") + count(&b, "owner cannot be reached");
    eprintln!(
        "owner killed under load: {} good responses, {} errors; edge-c dropped {dropped:?} after SIGKILL (dead_after 1s); {fell_back} nodes logged falling back; {:?} in all",
        ok.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        killed.elapsed()
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert!(fell_back >= 1, "no request went to the killed owner");
}

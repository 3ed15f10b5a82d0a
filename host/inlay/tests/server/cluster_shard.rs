//! Sharding by key (`[cluster] shard = true`): three nodes in process, a
//! real `nats-server` and the test origin on loopback (skipped, saying so,
//! where nats-server is not installed).
//!
//! Every request names `Host: www.example.com`, so the three nodes compute
//! the same cache keys whatever port the client reached them on.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{NatsServer, Origin, Reply, request, unused_port};
use inlay::config::{AccessLogTarget, Config};
use inlay::listeners::Listener;
use inlay::startup::Proxy;
use inlay_cluster::Cluster;
use inlay_cluster::shard::MAX_MEMBERS;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SITE: &str = "www.example.com";

/// One node serving in the test's runtime.
struct Node {
    addr: SocketAddr,
    cluster: Cluster,
    metrics: Arc<inlay::metrics::Metrics>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(nats: &NatsServer, origin: &Origin, name: &str, extra: &str) -> Self {
        Self::start_sharding(nats, origin, name, true, extra).await
    }

    async fn start_sharding(
        nats: &NatsServer,
        origin: &Origin,
        name: &str,
        shard: bool,
        extra: &str,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\nshutdown_timeout = \"10s\"\n\
             [backends.default]\naddress = \"{}\"\nfirst_byte_timeout = \"3s\"\n\
             [cache]\ndir = \"{}\"\n\
             [cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{name}\"\nshard = {shard}\n\
             heartbeat_interval = \"200ms\"\ndead_after = \"5s\"\n{extra}\n",
            origin.url(),
            dir.path().join("cache").display(),
            nats.url(),
        );
        let mut cfg = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        cfg.log.access_log = AccessLogTarget::Off;
        let proxy = Proxy::load(cfg).await.expect("the node starts");
        let cluster = proxy.cluster().cloned().expect("[cluster] joins");
        let metrics = proxy.metrics().clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(proxy.run([Listener::plain(listener)], async {
            let _ = stopped.await;
        }));
        let node = Self {
            addr,
            cluster,
            metrics,
            stop: Some(stop),
            served: Some(served),
            _dir: dir,
        };
        if shard {
            wait_until("the node shards", Duration::from_secs(10), || {
                node.cluster.shard().is_some()
            })
            .await;
        }
        node
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The members this node sees, in order.
    fn members(&self) -> Vec<String> {
        self.cluster.shard().expect("sharding").live().names()
    }

    /// Stop as SIGTERM does: leave, drain, flush.
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            tokio::time::timeout(Duration::from_secs(30), served)
                .await
                .expect("stopped within 30 s")
                .expect("no panic")
                .expect("stopped cleanly");
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn get(node: &Node, path: &str) -> Reply {
    get_with(node, path, &[]).await
}

async fn get_with(node: &Node, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![("host", SITE)];
    all.extend_from_slice(headers);
    request("GET", &node.url(path), &all, Bytes::new()).await
}

/// Polls `done` every 20 ms until it holds, or fails after `within`.
async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

async fn three_nodes(nats: &NatsServer, origin: &Origin) -> Vec<Node> {
    let mut nodes = Vec::new();
    let mut last = Instant::now();
    for name in ["edge-a", "edge-b", "edge-c"] {
        last = Instant::now();
        nodes.push(Node::start(nats, origin, name, "").await);
    }
    wait_until("membership converges", Duration::from_secs(10), || {
        nodes
            .iter()
            .all(|n| n.members() == ["edge-a", "edge-b", "edge-c"])
    })
    .await;
    eprintln!(
        "membership of 3 nodes converged {:?} after the last one began to start",
        last.elapsed()
    );
    nodes
}

/// Each node's member-table version and fallbacks, for a failure message
/// (a version past 3 means membership changed during the test).
fn diagnose(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            let s = n.cluster.shard().unwrap();
            format!(
                "{}: {:?} version {} owner fetches {} fallbacks {}",
                n.cluster.node(),
                n.members(),
                s.live().version,
                s.counts().forwarded.load(Ordering::Relaxed),
                s.counts().fallbacks.load(Ordering::Relaxed)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// An address that refuses connections. Not on 127.0.0.1: a fake member
/// announcing a port there might announce another test's origin or node,
/// and the requests forwarded to it would show in that test's counts.
fn nowhere() -> SocketAddr {
    format!("127.0.0.2:{}", unused_port()).parse().unwrap()
}

/// Object `i`: a distinct cacheable path of the test origin.
fn object(i: usize) -> String {
    format!("/static/{}", 1000 + i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_the_origin_sees_one_fetch_per_object_not_one_per_node() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let nodes = three_nodes(&nats, &origin).await;
    const N: usize = 30;
    for i in 0..N {
        for node in &nodes {
            let r = get(node, &object(i)).await;
            assert_eq!(r.status, 200, "{} on {}", object(i), node.addr);
            assert_eq!(r.body.len(), 1000 + i);
        }
    }
    let mut total = 0;
    for i in 0..N {
        let fetched = origin.count(&object(i)).await;
        assert_eq!(
            fetched,
            1,
            "{} fetched {fetched} times ({})",
            object(i),
            diagnose(&nodes)
        );
        total += fetched;
    }
    let forwarded: u64 = nodes
        .iter()
        .map(|n| {
            let s = n.cluster.shard().unwrap();
            s.counts().forwarded.load(Ordering::Relaxed)
        })
        .sum();
    eprintln!(
        "sharded: {N} objects x 3 nodes -> {total} origin fetches, {forwarded} owner fetches"
    );
    // Each object: one node owns it; the two others fetched it from the owner.
    assert_eq!(forwarded as usize, 2 * N);
    // What an operator sees on GET /metrics.
    let mut scraped = 0;
    for node in &nodes {
        let text = node.metrics.render().await;
        assert!(text.contains("inlay_cluster_members 3\n"), "{text}");
        scraped += text
            .lines()
            .find_map(|l| l.strip_prefix("inlay_cluster_owner_fetches_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("inlay_cluster_owner_fetches_total");
    }
    assert_eq!(scraped, forwarded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_shard_every_node_fetches_every_object() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let mut nodes = Vec::new();
    for name in ["edge-a", "edge-b", "edge-c"] {
        nodes.push(Node::start_sharding(&nats, &origin, name, false, "").await);
    }
    const N: usize = 30;
    for i in 0..N {
        for node in &nodes {
            assert_eq!(get(node, &object(i)).await.status, 200);
        }
    }
    let mut total = 0;
    for i in 0..N {
        total += origin.count(&object(i)).await;
    }
    eprintln!("not sharded: {N} objects x 3 nodes -> {total} origin fetches");
    // The baseline the sharded test improves on (same requests, same keys).
    assert_eq!(total as usize, 3 * N);
    assert!(nodes.iter().all(|n| n.cluster.shard().is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_hop_field_does_not_bypass_the_owner() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let nodes = three_nodes(&nats, &origin).await;
    // A real node's name with a made-up token, a bare name, a second field.
    let forged = [
        "edge-a 0123456789abcdef0123456789abcdef",
        "edge-b",
        "edge-c x",
    ];
    const N: usize = 12;
    for i in 0..N {
        for (node, hop) in nodes.iter().zip(forged) {
            let r = get_with(node, &object(i), &[("inlay-cluster-hop", hop)]).await;
            assert_eq!(r.status, 200);
        }
    }
    for i in 0..N {
        assert_eq!(
            origin.count(&object(i)).await,
            1,
            "a forged hop field made a node fetch {} itself ({})",
            object(i),
            diagnose(&nodes)
        );
    }
    let forged_seen: u64 = nodes
        .iter()
        .map(|n| {
            let s = n.cluster.shard().unwrap();
            s.counts().forged_hops.load(Ordering::Relaxed)
        })
        .sum();
    assert_eq!(forged_seen as usize, 3 * N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_stopped_under_load_costs_no_client_an_error() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let mut nodes = three_nodes(&nats, &origin).await;
    let owner = nodes.pop().expect("edge-c");
    let nodes = Arc::new(nodes);
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let (done, finished) = tokio::sync::watch::channel(false);
    // Two clients ask edge-a and edge-b for a new object each time (a
    // miss); edge-c owns about a third of them.
    let mut clients = Vec::new();
    for c in 0..2 {
        let (nodes, ok, errors, mut finished) =
            (nodes.clone(), ok.clone(), errors.clone(), finished.clone());
        clients.push(tokio::spawn(async move {
            let mut i = c;
            while !*finished.borrow_and_update() {
                let node = &nodes[i % 2];
                let path = object(i);
                let r = get(node, &path).await;
                if r.status == 200 && r.body.len() == 1000 + i {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("{path} on {}: {} {:?}", node.addr, r.status, r.text());
                }
                i += 1;
            }
        }));
    }
    wait_until("load runs", Duration::from_secs(20), || {
        ok.load(Ordering::Relaxed) >= 300
    })
    .await;
    let mut owner = owner;
    owner.stop().await;
    let before = ok.load(Ordering::Relaxed);
    let left = wait_until(
        "the others drop the stopped node",
        Duration::from_secs(5),
        || nodes.iter().all(|n| n.members() == ["edge-a", "edge-b"]),
    )
    .await;
    wait_until("load goes on", Duration::from_secs(20), || {
        ok.load(Ordering::Relaxed) >= before + 600
    })
    .await;
    done.send(true).unwrap();
    for c in clients {
        c.await.unwrap();
    }
    eprintln!(
        "owner stopped under load: {} good responses, {} errors; the others dropped it {left:?} after it stopped",
        ok.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0);
}

/// Publishes heartbeats of a member nobody runs, announcing `addr`, every 100 ms.
fn ghost(nats: &NatsServer, name: &str, addr: SocketAddr) -> JoinHandle<()> {
    let url = nats.url();
    let beat = format!(
        r#"{{"node":"{name}","addr":"{addr}","token":"0123456789abcdef0123456789abcdef"}}"#
    );
    tokio::spawn(async move {
        let client = async_nats::connect(url).await.unwrap();
        loop {
            let _ = client.publish("inlay.members", beat.clone().into()).await;
            let _ = client.flush().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Requests objects `range` on `node`; each must be 200 and fetched from
/// the origin once. Returns the slowest request's time.
async fn each_once(node: &Node, origin: &Origin, range: std::ops::Range<usize>) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in range {
        let started = Instant::now();
        let r = get(node, &object(i)).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(r.status, 200, "{}", object(i));
        assert_eq!(origin.count(&object(i)).await, 1, "{}", object(i));
    }
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_falls_back_to_the_origin_within_the_connect_timeout() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let node = Node::start(&nats, &origin, "edge-a", "peer_connect_timeout = \"300ms\"").await;
    let shard = node.cluster.shard().unwrap().clone();
    // A member that beats but refuses connections: it owns about half the keys.
    let refused = nowhere();
    let beating = ghost(&nats, "ghost", refused);
    wait_until("the ghost joins", Duration::from_secs(10), || {
        node.members() == ["edge-a", "ghost"]
    })
    .await;
    let slowest = each_once(&node, &origin, 0..40).await;
    let fallbacks = shard.counts().fallbacks.load(Ordering::Relaxed);
    eprintln!("refused owner: {fallbacks} fallbacks to the origin; slowest request {slowest:?}");
    assert!(fallbacks >= 1, "the ghost owned none of 40 keys?");
    beating.abort();
    // A member whose connections hang: a listener whose accept queue is
    // full (the kernel drops further SYNs), so connecting times out.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.listen(1).unwrap();
    let hanging = full.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..8 {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        if let Ok(Ok(c)) =
            tokio::time::timeout(Duration::from_millis(100), s.connect(hanging)).await
        {
            held.push(c);
        }
    }
    let beating = ghost(&nats, "ghost2", hanging);
    wait_until("ghost2 joins", Duration::from_secs(10), || {
        node.members().contains(&"ghost2".to_owned())
    })
    .await;
    let before = shard.counts().fallbacks.load(Ordering::Relaxed);
    let slowest = each_once(&node, &origin, 40..80).await;
    let fallbacks = shard.counts().fallbacks.load(Ordering::Relaxed) - before;
    eprintln!(
        "owner whose connect hangs (peer_connect_timeout 300ms): {fallbacks} fallbacks; slowest request {slowest:?}"
    );
    assert!(fallbacks >= 1, "ghost2 owned none of 40 keys?");
    // Within the connect timeout and an origin fetch, not the 3 s first-byte timeout.
    assert!(slowest < Duration::from_millis(2500), "{slowest:?}");
    beating.abort();
    let silent = Instant::now();
    wait_until(
        "the silent ghost2 is dropped",
        Duration::from_secs(20),
        || node.members() == ["edge-a"],
    )
    .await;
    eprintln!(
        "a member that stopped beating was dropped {:?} after its last heartbeat (dead_after 5s)",
        silent.elapsed()
    );
    drop((held, full));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_announcing_this_nodes_own_address_does_not_make_it_loop() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let node = Node::start(&nats, &origin, "edge-a", "").await;
    let beating = ghost(&nats, "echo", node.addr);
    wait_until("the echo joins", Duration::from_secs(10), || {
        node.members() == ["echo", "edge-a"]
    })
    .await;
    let slowest = each_once(&node, &origin, 0..20).await;
    let counts = node.cluster.shard().unwrap().counts();
    let forwarded = counts.forwarded.load(Ordering::Relaxed);
    eprintln!(
        "echo: {forwarded} forwarded, {} fallbacks, slowest {slowest:?}",
        counts.fallbacks.load(Ordering::Relaxed)
    );
    assert_eq!(forwarded, 0);
    assert!(
        counts.fallbacks.load(Ordering::Relaxed) >= 1,
        "echo owned none of 20 keys?"
    );
    // Told at once, not after the backend's 3 s first-byte timeout.
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    beating.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_heartbeats_neither_panic_nor_grow_the_member_table() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let node = Node::start(&nats, &origin, "edge-a", "").await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let shard = node.cluster.shard().unwrap().clone();
    // Garbage, a huge message, a bad name, a bad address.
    for bad in [
        "garbage".to_owned(),
        "x".repeat(256 << 10),
        r#"{"node":"a.b","addr":"127.0.0.1:1","token":"0123456789abcdef"}"#.to_owned(),
        r#"{"node":"a","addr":"0.0.0.0:1","token":"0123456789abcdef"}"#.to_owned(),
        "\u{0}\u{ff}{".to_owned(),
    ] {
        client.publish("inlay.members", bad.into()).await.unwrap();
    }
    // Thousands of fake nodes.
    let nowhere = nowhere();
    for i in 0..3 * MAX_MEMBERS {
        let beat =
            format!(r#"{{"node":"fake-{i}","addr":"{nowhere}","token":"0123456789abcdef"}}"#);
        client.publish("inlay.members", beat.into()).await.unwrap();
    }
    client.flush().await.unwrap();
    wait_until("the flood is read", Duration::from_secs(20), || {
        shard.counts().refused_members.load(Ordering::Relaxed) > 0
            && shard.counts().bad_heartbeats.load(Ordering::Relaxed) >= 5
    })
    .await;
    assert!(shard.live().peers.len() <= MAX_MEMBERS);
    // Still serving (keys owned by fakes go to the origin).
    assert_eq!(get(&node, &object(1)).await.status, 200);
    // The fakes stop beating: they are dropped.
    wait_until("the fakes are dropped", Duration::from_secs(20), || {
        node.members() == ["edge-a"]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_caches_the_owners_response_as_it_would_the_origins() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let nodes = three_nodes(&nats, &origin).await;
    let forwarded = |nodes: &[Node]| -> u64 {
        nodes
            .iter()
            .map(|n| {
                let s = n.cluster.shard().unwrap();
                s.counts().forwarded.load(Ordering::Relaxed)
            })
            .sum()
    };
    // Only Surrogate-Control lets an edge cache it: the owner must pass it on.
    const N: usize = 6;
    for i in 0..N {
        let path = format!("{}?cc=no-store&sc=max-age%3D60", object(i));
        for _ in 0..3 {
            for node in &nodes {
                assert_eq!(get(node, &path).await.status, 200);
            }
        }
        assert_eq!(origin.count(&object(i)).await, 1);
    }
    // Each non-owner asked the owner once per object, then hit its own copy.
    assert_eq!(forwarded(&nodes) as usize, 2 * N);
    // An ESI page: the owner sends the template, each node assembles it,
    // and the template and each fragment come from the origin once.
    let before = forwarded(&nodes);
    for node in &nodes {
        let page = get(node, "/esi/page?n=3").await;
        assert_eq!(page.status, 200);
        let html = page.text();
        assert!(
            !html.contains("<esi:"),
            "not assembled on {}: {html}",
            node.addr
        );
        assert!(html.matches("fragment").count() >= 3, "{html}");
    }
    assert_eq!(origin.count("/esi/page").await, 1);
    for i in 0..3 {
        assert_eq!(origin.count(&format!("/esi/fragment/{i}")).await, 1);
    }
    assert!(forwarded(&nodes) > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_objects_refresh_goes_to_its_owner_too() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let nodes = three_nodes(&nats, &origin).await;
    let path = "/static/2000?cc=max-age%3D2%2C%20stale-while-revalidate%3D60";
    for node in &nodes {
        assert_eq!(get(node, path).await.status, 200);
    }
    let fetched = Instant::now();
    assert_eq!(origin.count("/static/2000").await, 1);
    // Past max-age on every node: each serves it stale and refreshes it.
    wait_until("the object expires", Duration::from_secs(5), || {
        fetched.elapsed() > Duration::from_millis(2200)
    })
    .await;
    for node in &nodes {
        let r = get(node, path).await;
        assert_eq!(r.status, 200);
    }
    // Until every node serves it fresh again.
    let started = Instant::now();
    for node in &nodes {
        loop {
            let r = get(node, path).await;
            let status = r.headers["cache-status"].to_str().unwrap().to_owned();
            if status.contains("hit; ttl=") && !status.contains("ttl=-") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{} still serves {status}",
                node.addr
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // One refresh from the origin (the owner's), not one per node.
    assert_eq!(origin.count("/static/2000").await, 2);
}

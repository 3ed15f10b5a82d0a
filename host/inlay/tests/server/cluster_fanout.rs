//! Purge, soft purge and ban fan-out (`[cluster]`): three nodes in the
//! test process against a real `nats-server` (skipped, saying so, where it
//! is not installed) and one origin. Every request names the same Host, so
//! the nodes share cache keys.
//!
//! The fan-out latency figures: `cargo test -p inlay --test server --
//! --nocapture cluster_fanout::fan_out_latency` prints p50/p99 over 200 purges.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, NatsServer, Origin, Reply, request};
use inlay_cluster::fanout::kind;

const HOST: &str = "www.example.com";

/// A node named `name` of the cluster on `nats`, with `extra` TOML.
async fn node(nats: &NatsServer, origin: &Origin, name: &str, extra: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .toml(&format!(
            "[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"{name}\"\n{extra}",
            nats.url()
        ))
        .start_in_process()
        .await
}

/// A node whose cache is on disk in `dir`.
async fn disk_node(
    nats: &NatsServer,
    origin: &Origin,
    name: &str,
    dir: &std::path::Path,
    cluster_extra: &str,
) -> Harness {
    node(
        nats,
        origin,
        name,
        &format!("{cluster_extra}\n[cache]\ndir = \"{}\"", dir.display()),
    )
    .await
}

async fn send(node: &Harness, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![("host", HOST)];
    all.extend_from_slice(headers);
    request(method, &node.url(path), &all, Bytes::new()).await
}

async fn fetch(node: &Harness, path: &str) -> Reply {
    send(node, "GET", path, &[]).await
}

fn status(r: &Reply) -> String {
    r.header("cache-status").unwrap_or_default().to_owned()
}

/// Whether the node answers `path` from its cache, fresh.
async fn fresh_hit(node: &Harness, path: &str) -> bool {
    let s = status(&fetch(node, path).await);
    s.contains("hit") && !s.contains("ttl=-")
}

/// Wait (at most 20 s) until `node` has counted `n` events of `kind`.
async fn wait_count(node: &Harness, kind: &'static str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while node.cluster_invalidations(kind) < n {
        assert!(
            Instant::now() < deadline,
            "{kind}: {} of {n} within 20 s",
            node.cluster_invalidations(kind)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Cache `path` on every node, and check each now serves it as a hit.
async fn warm(nodes: &[&Harness], path: &str) {
    for n in nodes {
        fetch(n, path).await;
        assert!(fresh_hit(n, path).await, "{path} cached");
    }
}

fn ok(r: &Reply) {
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_soft_purges_and_bans_on_one_node_reach_the_others() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "").await;
    let b = node(&nats, &origin, "b", "").await;
    let c = node(&nats, &origin, "c", "").await;
    let all = [&a, &b, &c];

    // A purge by URL on a.
    let url = "/bytes/81?cc=max-age%3D60";
    warm(&all, url).await;
    ok(&send(&a, "PURGE", url, &[]).await);
    wait_count(&b, kind::APPLIED, 1).await;
    wait_count(&c, kind::APPLIED, 1).await;
    assert!(!fresh_hit(&b, url).await && !fresh_hit(&c, url).await);
    assert_eq!(a.cluster_invalidations(kind::APPLIED), 0, "its own");
    wait_count(&a, kind::PUBLISHED, 1).await;

    // By surrogate key on b.
    let tagged = "/bytes/82?cc=max-age%3D60&sk=product-2%20all";
    warm(&all, tagged).await;
    ok(&send(&b, "PURGE", "/", &[("surrogate-key", "product-2")]).await);
    wait_count(&a, kind::APPLIED, 1).await;
    wait_count(&c, kind::APPLIED, 2).await;
    assert!(!fresh_hit(&a, tagged).await && !fresh_hit(&c, tagged).await);

    // Soft on c: the others keep the object, stale (served in grace).
    let soft = "/bytes/83?cc=max-age%3D60";
    warm(&all, soft).await;
    ok(&send(&c, "PURGE", soft, &[("soft-purge", "1")]).await);
    wait_count(&a, kind::APPLIED, 2).await;
    wait_count(&b, kind::APPLIED, 2).await;
    for n in [&a, &b] {
        let s = status(&fetch(n, soft).await);
        assert!(s.contains("hit") && s.contains("ttl=-"), "stale: {s}");
    }

    // A ban on a.
    let banned = "/bytes/84?cc=max-age%3D60";
    let spared = "/bytes/85?cc=max-age%3D60";
    warm(&all, banned).await;
    warm(&all, spared).await;
    ok(&send(&a, "BAN", "/", &[("ban", "req.url ~ ^/bytes/84")]).await);
    wait_count(&b, kind::APPLIED, 3).await;
    wait_count(&c, kind::APPLIED, 3).await;
    for n in [&b, &c] {
        assert!(!fresh_hit(n, banned).await, "banned");
        assert!(fresh_hit(n, spared).await, "the ban spares other URLs");
    }
}

/// A series' value in `node`'s metrics text.
async fn metric(node: &Harness, series: &str) -> u64 {
    let text = node.metrics.render().await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// The objects another node's purge removes here count in this node's
/// `inlay_purged_objects_total`, as its own purges' do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_another_nodes_purge_removes_here_are_counted_here() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "").await;
    let b = node(&nats, &origin, "b", "").await;
    let tagged = [
        "/bytes/91?cc=max-age%3D60&sk=counted",
        "/bytes/92?cc=max-age%3D60&sk=counted",
    ];
    for path in tagged {
        warm(&[&a, &b], path).await;
    }
    assert_eq!(metric(&b, "inlay_purged_objects_total").await, 0);
    ok(&send(&a, "PURGE", "/", &[("surrogate-key", "counted")]).await);
    wait_count(&b, kind::APPLIED, 1).await;
    assert_eq!(metric(&a, "inlay_purged_objects_total").await, 2);
    assert_eq!(metric(&b, "inlay_purged_objects_total").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_and_bans_through_the_admin_api_reach_the_others() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "[admin]\nlisten = \"127.0.0.1:0\"").await;
    let b = node(&nats, &origin, "b", "").await;
    let c = node(&nats, &origin, "c", "").await;
    let url = "/bytes/91?cc=max-age%3D60";
    warm(&[&a, &b, &c], url).await;
    let body = serde_json::json!({ "url": url, "host": HOST }).to_string();
    let json = [("content-type", "application/json")];
    let r = request("POST", &a.admin_url("/purge"), &json, Bytes::from(body)).await;
    ok(&r);
    wait_count(&b, kind::APPLIED, 1).await;
    wait_count(&c, kind::APPLIED, 1).await;
    assert!(!fresh_hit(&b, url).await && !fresh_hit(&c, url).await);

    let banned = "/bytes/92?cc=max-age%3D60";
    warm(&[&a, &b, &c], banned).await;
    let body = serde_json::json!({ "expression": "req.url ~ ^/bytes/92" }).to_string();
    let r = request("POST", &a.admin_url("/ban"), &json, Bytes::from(body)).await;
    ok(&r);
    wait_count(&b, kind::APPLIED, 2).await;
    wait_count(&c, kind::APPLIED, 2).await;
    assert!(!fresh_hit(&b, banned).await && !fresh_hit(&c, banned).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_its_disk_serves_nothing_purged_while_it_was_away() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let a = node(&nats, &origin, "a", "").await;
    let mut b = disk_node(&nats, &origin, "b", dir.path(), "").await;
    let paths: Vec<String> = (0..6)
        .map(|i| format!("/bytes/{}?cc=max-age%3D300&sk=k{i}", 100 + i))
        .collect();
    for p in &paths {
        warm(&[&a, &b], p).await;
    }
    b.stop().await;
    // While b is away: a URL purge, a surrogate-key purge, a ban.
    ok(&send(&a, "PURGE", &paths[0], &[]).await);
    ok(&send(&a, "PURGE", "/", &[("surrogate-key", "k1")]).await);
    ok(&send(&a, "BAN", "/", &[("ban", "req.url ~ ^/bytes/102")]).await);
    wait_count(&a, kind::PUBLISHED, 3).await;

    let b = disk_node(&nats, &origin, "b", dir.path(), "").await;
    for p in &paths[..3] {
        assert!(!fresh_hit(&b, p).await, "{p} was purged while b was away");
    }
    // It answered: it replayed before it served.
    assert_eq!(b.cluster_invalidations(kind::REPLAYED), 3);
    assert_eq!(b.cluster_invalidations(kind::CACHE_CLEARED), 0);
    for p in &paths[3..] {
        assert!(fresh_hit(&b, p).await, "{p} is still served from disk");
    }
    // And it reads on: a purge made now reaches it.
    ok(&send(&a, "PURGE", &paths[3], &[]).await);
    wait_count(&b, kind::APPLIED, 1).await;
    assert!(!fresh_hit(&b, &paths[3]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_more_than_the_stream_keeps_starts_empty() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let keep = "invalidation_max_messages = 2";
    let a = node(&nats, &origin, "a", keep).await;
    let mut b = disk_node(&nats, &origin, "b", dir.path(), keep).await;
    let kept = "/bytes/120?cc=max-age%3D300";
    warm(&[&b], kept).await;
    b.stop().await;
    for i in 0..5 {
        ok(&send(&a, "PURGE", &format!("/gone/{i}"), &[]).await);
    }
    wait_count(&a, kind::PUBLISHED, 5).await;

    let b = disk_node(&nats, &origin, "b", dir.path(), keep).await;
    assert!(
        !fresh_hit(&b, kept).await,
        "b cannot know what it missed: nothing from before is served"
    );
    assert_eq!(b.cluster_invalidations(kind::CACHE_CLEARED), 1);
}

/// A client of the test's own on the cluster's subjects, as any node (or
/// anyone NATS lets publish there) would be.
async fn outsider(nats: &NatsServer) -> async_nats::Client {
    async_nats::connect(nats.url()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_twice_is_applied_once_and_malformed_ones_are_skipped() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let b = node(&nats, &origin, "b", "").await;
    let url = "/bytes/130?cc=max-age%3D60";
    warm(&[&b], url).await;
    let key = inlay_cache::PrimaryKey::new(HOST, url, &[]);
    let message = serde_json::json!({
        "id": "x-1-0", "node": "x", "op": "purge_url", "key": key.as_str(), "soft": false,
    })
    .to_string();
    let client = outsider(&nats).await;
    let js = async_nats::jetstream::new(client.clone());
    // Stored twice (no Nats-Msg-Id): two sequences, one id.
    js.publish("inlay.inv.x", message.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    wait_count(&b, kind::APPLIED, 1).await;
    assert!(!fresh_hit(&b, url).await, "purged");
    assert!(fresh_hit(&b, url).await, "cached again");
    js.publish("inlay.inv.x", message.into())
        .await
        .unwrap()
        .await
        .unwrap();
    wait_count(&b, kind::DUPLICATE, 1).await;
    assert!(
        fresh_hit(&b, url).await,
        "the second delivery changed nothing"
    );

    // Not JSON, an unknown operation, a ban that does not parse, a key
    // without a host part: each skipped and counted.
    for bad in [
        "\u{0}garbage".to_owned(),
        r#"{"id":"x-1-1","node":"x","op":"drop_everything"}"#.to_owned(),
        r#"{"id":"x-1-2","node":"x","op":"ban","expression":"req.url ~ ("}"#.to_owned(),
        r#"{"id":"x-1-3","node":"x","op":"purge_url","key":"/no-host","soft":false}"#.to_owned(),
    ] {
        js.publish("inlay.inv.x", bad.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    wait_count(&b, kind::MALFORMED, 4).await;
    assert!(fresh_hit(&b, url).await, "nothing was purged");
    // And the node still applies what follows.
    let next = serde_json::json!({
        "id": "x-1-4", "node": "x", "op": "purge_url", "key": key.as_str(), "soft": false,
    })
    .to_string();
    js.publish("inlay.inv.x", next.into())
        .await
        .unwrap()
        .await
        .unwrap();
    wait_count(&b, kind::APPLIED, 2).await;
    assert!(!fresh_hit(&b, url).await);
}

/// p50/p99 from a PURGE sent to one node to the last of the other two
/// applying it, over 200 purges. Prints the figures; asserts only that
/// every purge reached every node.
async fn fan_out_latency_with(disk: bool) {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        nodes.push(if disk {
            disk_node(&nats, &origin, name, dirs[i].path(), "").await
        } else {
            node(&nats, &origin, name, "").await
        });
    }
    // Each answers once it has joined the stream (a node serves only then).
    for n in &nodes {
        fetch(n, "/bytes/1").await;
    }
    const N: u64 = 200;
    let mut took = Vec::new();
    for i in 0..N {
        let start = Instant::now();
        ok(&send(&nodes[0], "PURGE", &format!("/latency/{i}"), &[]).await);
        for n in &nodes[1..] {
            while n.cluster_invalidations(kind::APPLIED) < i + 1 {
                assert!(start.elapsed() < Duration::from_secs(20), "purge {i} lost");
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
        }
        took.push(start.elapsed());
    }
    took.sort();
    let pct = |p: usize| took[(took.len() * p / 100).min(took.len() - 1)];
    println!(
        "fan-out ({}), {N} purges, 3 nodes: p50 {:?}, p99 {:?}, max {:?}",
        if disk { "disk tier" } else { "memory only" },
        pct(50),
        pct(99),
        took[took.len() - 1]
    );
    for n in &nodes[1..] {
        assert_eq!(n.cluster_invalidations(kind::APPLIED), N);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_latency_memory_only() {
    fan_out_latency_with(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_latency_disk_tier() {
    fan_out_latency_with(true).await;
}

/// A policy's `cache.purge-url` and `cache.purge-key` reach the other
/// nodes as the PURGE method's do (the capabilities fixture purges the URL
/// or key its request names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_a_policy_makes_reach_the_others() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let policy = format!(
        "[policy]\npath = \"{}\"\n",
        common::policy("capabilities").display()
    );
    let p = node(&nats, &origin, "p", &policy).await;
    let b = node(&nats, &origin, "b", "").await;
    let c = node(&nats, &origin, "c", "").await;
    let url = "/bytes/140?cc=max-age%3D60&sk=from-policy";
    let other = "/bytes/141?cc=max-age%3D60&sk=from-policy";
    warm(&[&b, &c], url).await;
    warm(&[&b, &c], other).await;
    let r = fetch(&p, &format!("/cap/purge-url?{url}")).await;
    ok(&r);
    wait_count(&b, kind::APPLIED, 1).await;
    wait_count(&c, kind::APPLIED, 1).await;
    assert!(!fresh_hit(&b, url).await && !fresh_hit(&c, url).await);
    ok(&fetch(&p, "/cap/purge-key?from-policy").await);
    wait_count(&b, kind::APPLIED, 2).await;
    wait_count(&c, kind::APPLIED, 2).await;
    assert!(!fresh_hit(&b, other).await && !fresh_hit(&c, other).await);
    assert_eq!(p.cluster_invalidations(kind::PUBLISHED), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_made_while_nats_is_down_apply_here_and_reach_the_others_when_it_is_back() {
    crate::require_nats!();
    let mut nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "invalidation_queue = 2").await;
    let b = node(&nats, &origin, "b", "").await;
    let paths: Vec<String> = (0..5)
        .map(|i| format!("/bytes/{}?cc=max-age%3D300", 150 + i))
        .collect();
    for p in &paths {
        warm(&[&a, &b], p).await;
    }
    nats.stop();
    for p in &paths {
        ok(&send(&a, "PURGE", p, &[]).await);
        assert!(!fresh_hit(&a, p).await, "applied here at once");
    }
    // Two wait for NATS; the other three are applied on a only, and counted.
    assert_eq!(a.cluster_invalidations(kind::LOST), 3);
    wait_count(&a, kind::PUBLISH_FAILED, 1).await;
    assert!(fresh_hit(&b, &paths[0]).await, "b has heard nothing yet");

    nats.restart();
    wait_count(&a, kind::PUBLISHED, 2).await;
    // b's reader comes back by itself (its consumer is made anew).
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.cluster_invalidations(kind::APPLIED) < 2 {
        assert!(Instant::now() < deadline, "b applied the queued purges");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!fresh_hit(&b, &paths[0]).await && !fresh_hit(&b, &paths[1]).await);
    assert!(
        fresh_hit(&b, &paths[4]).await,
        "a lost purge never reaches b"
    );
}

/// `max_disconnected`: a node that cannot confirm it has read every purge
/// stops reading its cache (requests go to the origin) until it has caught
/// up; a node without it serves what it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_disconnected_a_node_cut_off_from_purges_stops_reading_its_cache_until_it_caught_up()
 {
    crate::require_nats!();
    let mut nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "").await;
    let b = node(&nats, &origin, "b", "max_disconnected = \"2s\"").await;
    let c = node(&nats, &origin, "c", "").await;
    let url = "/bytes/190?cc=max-age%3D600";
    warm(&[&a, &b, &c], url).await;
    nats.stop();
    // Purged on a while the others cannot hear of it.
    ok(&send(&a, "PURGE", url, &[]).await);
    // b goes to the origin once its last confirmation is more than 2 s
    // old (a confirmation it was waiting for may still come, and move that
    // time forward once: it was in touch then).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(&fetch(&b, url).await);
        if s.contains("fwd=") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b still serves its cache 30 s after it lost NATS: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        fresh_hit(&c, url).await,
        "without max_disconnected a node serves what it has"
    );
    nats.restart();
    // b applies a's purge, then serves from its cache again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        fetch(&b, url).await;
        if b.cluster_invalidations(kind::APPLIED) >= 1 && fresh_hit(&b, url).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b reads its cache again once it has caught up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_count(&c, kind::APPLIED, 1).await;
    assert!(
        !fresh_hit(&c, url).await,
        "c applied the purge when NATS came back"
    );
}

/// How long a node with a disk tier takes to replay 500 purges it missed
/// before it serves. Prints the figure; asserts that it replayed them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_rate_at_start() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let a = node(&nats, &origin, "a", "").await;
    let mut b = disk_node(&nats, &origin, "b", dir.path(), "").await;
    warm(&[&b], "/bytes/170?cc=max-age%3D600").await;
    b.stop().await;
    const N: u64 = 500;
    for i in 0..N {
        ok(&send(&a, "PURGE", &format!("/missed/{i}"), &[]).await);
    }
    wait_count(&a, kind::PUBLISHED, N).await;
    let start = Instant::now();
    let b = disk_node(&nats, &origin, "b", dir.path(), "").await;
    assert!(fresh_hit(&b, "/bytes/170?cc=max-age%3D600").await);
    let took = start.elapsed();
    assert_eq!(b.cluster_invalidations(kind::REPLAYED), N);
    println!("replay at start (disk tier): {N} purges, first answer after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_under_running_nodes_is_made_anew_and_their_caches_emptied() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "").await;
    let b = node(&nats, &origin, "b", "").await;
    let url = "/bytes/180?cc=max-age%3D600";
    warm(&[&a, &b], url).await;
    ok(&send(&a, "PURGE", "/before", &[]).await);
    wait_count(&b, kind::APPLIED, 1).await;
    let js = async_nats::jetstream::new(outsider(&nats).await);
    js.delete_stream("INLAY_INVALIDATIONS").await.unwrap();
    // Its sequences start again: what was published meanwhile is unknown.
    wait_count(&b, kind::CACHE_CLEARED, 1).await;
    assert!(!fresh_hit(&b, url).await, "emptied");
    // And purges flow again through the new stream.
    wait_count(&a, kind::CACHE_CLEARED, 1).await;
    warm(&[&b], url).await;
    ok(&send(&a, "PURGE", url, &[]).await);
    wait_count(&b, kind::APPLIED, 2).await;
    assert!(!fresh_hit(&b, url).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_past_a_nodes_memory_budget_is_refused_there_and_counted() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let a = node(&nats, &origin, "a", "").await;
    let b = node(&nats, &origin, "b", "\n[cache]\nban_memory = \"1MiB\"").await;
    // 16 regexes each just under the size limit: over a MiB compiled.
    let heavy = (0..16)
        .map(|i| format!("obj.http.x-{i} ~ \"[a-z0-9_]{{737}}I\""))
        .collect::<Vec<_>>()
        .join(" && ");
    ok(&send(&a, "BAN", "/", &[("ban", &heavy)]).await);
    wait_count(&b, kind::REFUSED, 1).await;
    // Refused here alone: b still has room for what fits.
    let r = send(&b, "BAN", "/", &[("ban", &heavy)]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("cache.ban_memory"), "{}", r.text());
    ok(&send(&a, "BAN", "/", &[("ban", "req.url ~ ^/cheap")]).await);
    wait_count(&b, kind::APPLIED, 1).await;
    assert_eq!(b.cluster_invalidations(kind::APPLY_FAILED), 0);
    assert_eq!(a.cluster_invalidations(kind::REFUSED), 0);
}

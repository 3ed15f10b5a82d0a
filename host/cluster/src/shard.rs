//! Sharding by key (`[cluster] shard = true`): each cache key has one owner
//! among the live nodes, chosen by rendezvous hashing
//! ([`inlay_core::rendezvous`]), and a miss on any other node is fetched
//! from the owner instead of the origin, so the origin sees one fetch per
//! object across the cluster.
//!
//! For the host this is a choice of upstream: [`Shard::owner`] names the
//! node a key's fetch goes to (`None`: the host's own backend), and
//! [`Shard::fetch`] sends it there, or says to fall back to the backend.
//!
//! Membership comes from heartbeats on `PREFIX.members` (core NATS, no
//! JetStream): every `heartbeat_interval` each node publishes its name, the
//! HTTP address its peers reach it at, and a random token made at start; a
//! node not heard from for `dead_after` is dead, and a node that stops
//! cleanly says so. The live set (this node included) is ordered by name
//! and versioned; joins and leaves are logged.
//!
//! A request to the owner carries `Inlay-Cluster-Hop: NODE TOKEN`. The
//! owner accepts it only with the token NODE announced in its heartbeats
//! (clients never see them), and then fetches from the origin itself
//! instead of forwarding again; a client's hop field that does not match
//! is removed, so a client cannot forge one. Whoever can publish on the
//! cluster's subjects is trusted as a node: NATS authentication is the
//! boundary. Even so a heartbeat is bounded: at most [`MAX_HEARTBEAT`]
//! bytes, strict fields, and at most [`MAX_MEMBERS`] members (a table kept
//! full by fake names empties as they stop beating).
//!
//! An owner that cannot be reached (connection refused, reset, the connect
//! timeout `peer_connect_timeout`, no response head within the origin
//! backend's `first_byte_timeout`) is suspect until its next heartbeat:
//! the request, and the next ones for its keys, go to the origin
//! ([`FallBack`]).
//!
//! The owner answers a peer as an edge answers an edge: `Surrogate-Control`,
//! `Surrogate-Key` and `Inlay-Cache-Control` go on and an ESI template is
//! not assembled, so the peer caches and assembles the object as it would
//! the origin's. Hop requests travel in plain HTTP with the client's own
//! fields (as the origin gets them): advertise addresses on a network only
//! the nodes share. A member announcing this node's own address makes it
//! answer itself `508` ([`loop_response`]) and fetch from the origin.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use futures_util::StreamExt as _;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use inlay_core::body::{self, ProxyBody};
use inlay_core::rendezvous;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::Cluster;
use crate::config::ShardConfig;

/// The field that marks a request from a node to a key's owner:
/// `Inlay-Cluster-Hop: NODE TOKEN`.
pub const HOP: HeaderName = HeaderName::from_static("inlay-cluster-hop");

/// Most members a node keeps (itself included); heartbeats of further
/// names are dropped and counted.
pub const MAX_MEMBERS: usize = 1024;

/// Largest heartbeat a node reads; a larger one is dropped and counted.
pub const MAX_HEARTBEAT: usize = 512;

/// Longest node name (a NATS subject token, as `cluster.node_name`).
const MAX_NAME: usize = 64;

/// A key's owner did not answer a [`Shard::fetch`]: send the request to
/// the backend instead (the owner is suspect until its next heartbeat).
#[derive(Debug, thiserror::Error)]
#[error("cluster node {owner} did not answer ({reason}); fetching from the backend")]
pub struct FallBack {
    /// The owner's node name.
    pub owner: String,
    /// Why it did not answer.
    pub reason: String,
}

/// What a node publishes on `PREFIX.members`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Heartbeat {
    /// The node's name.
    node: String,
    /// `IP:PORT` its peers reach it at over HTTP.
    addr: String,
    /// The token its hop requests carry (hex, made at start).
    token: String,
    /// The node is stopping: drop it now.
    #[serde(default)]
    leaving: bool,
}

/// A member of the cluster as this node knows it.
#[derive(Debug)]
pub struct Peer {
    name: String,
    addr: SocketAddr,
    token: String,
    /// [`rendezvous::hash`] of the name.
    hash: u64,
    /// A request to it failed; cleared by its next heartbeat.
    suspect: AtomicBool,
}

impl Peer {
    fn new(name: String, addr: SocketAddr, token: String) -> Self {
        Self {
            hash: rendezvous::hash(&name),
            name,
            addr,
            token,
            suspect: AtomicBool::new(false),
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address its peers reach it at.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether a request to it failed since its last heartbeat.
    pub fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Relaxed)
    }
}

/// The live set: every member this node hears from, itself included,
/// ordered by name; `version` goes up at each join, leave or move.
#[derive(Debug, Clone)]
pub struct Live {
    /// Changes at each join, leave and change of address.
    pub version: u64,
    /// The members, ordered by name.
    pub peers: Vec<Arc<Peer>>,
}

impl Live {
    /// The members' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.peers.iter().map(|p| p.name.clone()).collect()
    }
}

/// What sharding counted since start.
#[derive(Debug, Default)]
pub struct ShardCounts {
    /// Misses fetched from their owner.
    pub forwarded: AtomicU64,
    /// Misses whose owner could not be reached, fetched from the origin.
    pub fallbacks: AtomicU64,
    /// Heartbeats dropped: too large, not JSON, or bad fields.
    pub bad_heartbeats: AtomicU64,
    /// Heartbeats of new names dropped because the table was full.
    pub refused_members: AtomicU64,
    /// Client requests whose hop field did not match a member's token.
    pub forged_hops: AtomicU64,
}

/// This node's part in sharding: the member table, the heartbeat tasks,
/// and the HTTP client to the owners.
pub struct Shard {
    me: Arc<Peer>,
    cluster: Cluster,
    cfg: ShardConfig,
    /// The other members and when each was last heard from.
    table: Mutex<HashMap<String, (Arc<Peer>, Instant)>>,
    live: ArcSwap<Live>,
    client: Client<HttpConnector, ProxyBody>,
    counts: ShardCounts,
    /// Publish a heartbeat now (a member joined: let it learn us at once).
    beat_now: Notify,
    /// This node said it leaves: it owns nothing and forwards nothing.
    left: AtomicBool,
    /// Another node announced this node's name with another token.
    duplicate_warned: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("me", &self.me.name)
            .field("addr", &self.me.addr)
            .field("live", &self.live.load().names())
            .finish_non_exhaustive()
    }
}

/// Start sharding when `cluster` has `shard = true`: `listening` is the
/// first listener's bound address, advertised when `cluster.advertise` is
/// not set. The node joins (its first heartbeat) before this returns.
pub async fn start(
    cluster: Option<&Cluster>,
    listening: Option<SocketAddr>,
) -> anyhow::Result<Option<Arc<Shard>>> {
    let Some(cluster) = cluster.filter(|c| c.config().shard) else {
        return Ok(None);
    };
    let cfg = cluster.config().sharding.clone();
    let addr = match cfg.advertise.or(listening) {
        Some(a) if !a.ip().is_unspecified() && a.port() != 0 => a,
        other => anyhow::bail!(
            "cluster.advertise: shard = true needs the address peers reach this node at (the first listener is {})",
            other.map_or("absent".to_owned(), |a| a.to_string())
        ),
    };
    let token: String = rand::random::<[u8; 16]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let me = Arc::new(Peer::new(cluster.node().to_owned(), addr, token));
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(cfg.peer_connect_timeout));
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    let shard = Arc::new(Shard {
        live: ArcSwap::from_pointee(Live {
            version: 1,
            peers: vec![Arc::clone(&me)],
        }),
        me,
        cluster: cluster.clone(),
        cfg,
        table: Mutex::new(HashMap::new()),
        client,
        counts: ShardCounts::default(),
        beat_now: Notify::new(),
        left: AtomicBool::new(false),
        duplicate_warned: AtomicBool::new(false),
        tasks: Mutex::new(Vec::new()),
    });
    let members = cluster
        .client()
        .subscribe(cluster.subject("members"))
        .await
        .map_err(|e| anyhow::anyhow!("cluster: subscribing to the members' heartbeats: {e}"))?;
    let receiving = tokio::spawn(receive(Arc::downgrade(&shard), members));
    shard.publish(false).await;
    let beating = tokio::spawn(beat(Arc::downgrade(&shard)));
    shard.tasks.lock().extend([receiving, beating]);
    let _ = cluster.shard.set(Arc::clone(&shard));
    cluster.metrics().observe_shard(&shard);
    info!(node = %shard.me.name, addr = %shard.me.addr, "cluster: sharding by key");
    Ok(Some(shard))
}

/// Reads heartbeats until the shard is dropped or the subscription ends.
async fn receive(shard: Weak<Shard>, mut members: async_nats::Subscriber) {
    while let Some(msg) = members.next().await {
        let Some(shard) = shard.upgrade() else { return };
        shard.on_heartbeat(&msg.payload);
    }
}

/// Publishes a heartbeat every interval (and at once when a member
/// joins), and drops the members that stopped beating.
async fn beat(shard: Weak<Shard>) {
    let Some(interval) = shard.upgrade().map(|s| s.cfg.heartbeat_interval) else {
        return;
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let notified = match shard.upgrade() {
            Some(s) => {
                s.publish(false).await;
                s.reap();
                s
            }
            None => return,
        };
        tokio::select! {
            _ = tick.tick() => {}
            _ = notified.beat_now.notified() => {}
        }
    }
}

impl Shard {
    /// This node as a member.
    pub fn me(&self) -> &Arc<Peer> {
        &self.me
    }

    /// The live set now.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// What sharding counted.
    pub fn counts(&self) -> &ShardCounts {
        &self.counts
    }

    /// The owner of `key` when it is another live node that is not
    /// suspect; `None` when this node owns it (or has left).
    pub fn owner(&self, key: &str) -> Option<Arc<Peer>> {
        if self.left.load(Ordering::Relaxed) {
            return None;
        }
        let live = self.live.load();
        let candidates = live
            .peers
            .iter()
            .filter(|p| Arc::ptr_eq(p, &self.me) || !p.is_suspect());
        let owner = rendezvous::owner(
            rendezvous::hash(key),
            candidates.map(|p| (p.name.as_str(), p.hash, p)),
        )?;
        (!Arc::ptr_eq(owner, &self.me)).then(|| Arc::clone(owner))
    }

    /// Keep the hop field of a request only when it names a member with its
    /// token; remove any other (a client's forgery).
    pub fn accept_hop(&self, headers: &mut HeaderMap) {
        let mut fields = headers.get_all(&HOP).iter();
        let (Some(first), None) = (fields.next(), fields.next()) else {
            if headers.remove(&HOP).is_some() {
                self.counts.forged_hops.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        let valid = first
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .is_some_and(|(node, token)| self.knows(node, token));
        if !valid {
            headers.remove(&HOP);
            self.counts.forged_hops.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether `node` is a member whose token is `token` (this node too: a
    /// member announcing this node's address must not make it forward to
    /// itself forever).
    fn knows(&self, node: &str, token: &str) -> bool {
        if node == self.me.name {
            return bool::from(self.me.token.as_bytes().ct_eq(token.as_bytes()));
        }
        let table = self.table.lock();
        table
            .get(node)
            .is_some_and(|(p, _)| bool::from(p.token.as_bytes().ct_eq(token.as_bytes())))
    }

    /// Whether the (checked) hop field of a request names this node: it
    /// forwarded to itself (a member announced this node's address), and
    /// must be told at once ([`loop_response`]) rather than wait on its own
    /// fill of the key.
    pub fn is_own_hop(&self, headers: &HeaderMap) -> bool {
        headers
            .get(&HOP)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .is_some_and(|(node, _)| node == self.me.name)
    }

    /// Fetch the request `head` describes (a GET for the cache; no body is
    /// sent) from `owner`, marked as a hop, waiting up to
    /// `first_byte_timeout` (the backend's) for the response head. The
    /// body streams from the owner: the caller bounds the time between its
    /// bytes as it does a backend's. When the owner cannot be reached it is
    /// suspect until its next heartbeat, and [`FallBack`] tells the caller
    /// to send the request to its backend instead.
    pub async fn fetch(
        &self,
        owner: &Peer,
        head: &http::request::Parts,
        first_byte_timeout: Duration,
    ) -> Result<Response<Incoming>, FallBack> {
        let fall_back = |reason: String| FallBack {
            owner: owner.name.clone(),
            reason,
        };
        let mut to_owner = Request::from_parts(head.clone(), body::empty());
        let pq = to_owner
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let uri = format!("http://{}{pq}", owner.addr).parse::<http::Uri>();
        let hop = HeaderValue::from_str(&format!("{} {}", self.me.name, self.me.token));
        let (Ok(uri), Ok(hop)) = (uri, hop) else {
            return Err(fall_back("no request to it can be made".to_owned()));
        };
        *to_owner.uri_mut() = uri;
        *to_owner.version_mut() = http::Version::HTTP_11;
        to_owner.headers_mut().insert(HOP, hop);
        let waited = Instant::now();
        let failure =
            match tokio::time::timeout(first_byte_timeout, self.client.request(to_owner)).await {
                Ok(Ok(resp)) if is_loop(&resp) => {
                    format!("{} is this node's own address", owner.addr)
                }
                Ok(Ok(resp)) => {
                    self.counts.forwarded.fetch_add(1, Ordering::Relaxed);
                    return Ok(resp);
                }
                Ok(Err(e)) => error_chain(&e),
                Err(_) => format!("no response within {first_byte_timeout:?}"),
            };
        self.counts.fallbacks.fetch_add(1, Ordering::Relaxed);
        if !owner.suspect.swap(true, Ordering::Relaxed) {
            warn!(
                owner = %owner.name,
                addr = %owner.addr,
                after = ?waited.elapsed(),
                error = %failure,
                "cluster: a key's owner cannot be reached; its keys go to the origin until its next heartbeat"
            );
        }
        Err(fall_back(failure))
    }

    /// Say this node leaves (at shutdown, before the drain): the others
    /// drop it at once, and it forwards nothing more.
    pub async fn leave(&self) {
        self.left.store(true, Ordering::Relaxed);
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        self.publish(true).await;
        let flushed =
            tokio::time::timeout(Duration::from_secs(1), self.cluster.client().flush()).await;
        if !matches!(flushed, Ok(Ok(()))) {
            warn!(
                "cluster: the leave message may not have reached NATS; peers drop this node after dead_after"
            );
        }
        info!(node = %self.me.name, "cluster: left the shard");
    }

    async fn publish(&self, leaving: bool) {
        let hb = Heartbeat {
            node: self.me.name.clone(),
            addr: self.me.addr.to_string(),
            token: self.me.token.clone(),
            leaving,
        };
        let Ok(payload) = serde_json::to_vec(&hb) else {
            return;
        };
        if let Err(e) = self
            .cluster
            .client()
            .publish(self.cluster.subject("members"), payload.into())
            .await
        {
            debug!(error = %e, "cluster: publishing a heartbeat failed");
        }
    }

    /// Apply one message of `PREFIX.members`.
    fn on_heartbeat(&self, payload: &[u8]) {
        let hb = match parse_heartbeat(payload) {
            Ok(hb) => hb,
            Err(why) => {
                let n = self.counts.bad_heartbeats.fetch_add(1, Ordering::Relaxed) + 1;
                // The first, then at each power of two: a flood costs a few lines.
                if n.is_power_of_two() {
                    warn!(dropped = n, "cluster: dropped a heartbeat: {why}");
                }
                return;
            }
        };
        let (node, addr, token, leaving) = hb;
        if leaving {
            self.remove(&node, &token);
            return;
        }
        if node == self.me.name {
            if token != self.me.token && !self.duplicate_warned.swap(true, Ordering::Relaxed) {
                warn!(%node, other = %addr, "cluster: another node announces this node's name; give each node its own cluster.node_name");
            }
            return;
        }
        let mut table = self.table.lock();
        let now = Instant::now();
        let full = table.len() + 1 >= MAX_MEMBERS;
        match table.get_mut(&node) {
            Some((peer, seen)) if peer.addr == addr && peer.token == token => {
                *seen = now;
                if peer.suspect.swap(false, Ordering::Relaxed) {
                    info!(%node, "cluster: a suspect owner beats again; its keys are its own again");
                }
                return;
            }
            Some(entry) => {
                info!(%node, %addr, "cluster: a member restarted or moved");
                *entry = (Arc::new(Peer::new(node, addr, token)), now);
            }
            None if full => {
                let n = self.counts.refused_members.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    warn!(%node, refused = n, "cluster: the member table is full ({MAX_MEMBERS}); a new node is ignored until others stop beating");
                }
                return;
            }
            None => {
                info!(%node, %addr, "cluster: a node joined");
                table.insert(node.clone(), (Arc::new(Peer::new(node, addr, token)), now));
                self.beat_now.notify_one();
            }
        }
        self.publish_live(&table);
    }

    /// Drop the members not heard from for `dead_after`.
    fn reap(&self) {
        let mut table = self.table.lock();
        let before = table.len();
        let dead_after = self.cfg.dead_after;
        table.retain(|node, (_, seen)| {
            let alive = seen.elapsed() <= dead_after;
            if !alive {
                info!(%node, silent = ?seen.elapsed(), "cluster: a node is dead (no heartbeat); its keys move to the others");
            }
            alive
        });
        if table.len() != before {
            self.publish_live(&table);
        }
    }

    /// Remove `node` when it says it leaves (with its token: the leave of
    /// an earlier run does not remove the node restarted since).
    fn remove(&self, node: &str, token: &str) {
        let mut table = self.table.lock();
        if table.get(node).is_some_and(|(p, _)| p.token == token) {
            table.remove(node);
            info!(%node, "cluster: a node left");
            self.publish_live(&table);
        }
    }

    /// The live set of `table` and this node, as the next version.
    fn publish_live(&self, table: &HashMap<String, (Arc<Peer>, Instant)>) {
        let mut peers: Vec<Arc<Peer>> = table
            .values()
            .map(|(p, _)| Arc::clone(p))
            .chain([Arc::clone(&self.me)])
            .collect();
        peers.sort_by(|a, b| a.name.cmp(&b.name));
        let version = self.live.load().version + 1;
        self.live.store(Arc::new(Live { version, peers }));
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }
}

/// A heartbeat's node, address, token and whether it leaves, or why it is
/// not one.
fn parse_heartbeat(payload: &[u8]) -> Result<(String, SocketAddr, String, bool), String> {
    if payload.len() > MAX_HEARTBEAT {
        return Err(format!("{} bytes, at most {MAX_HEARTBEAT}", payload.len()));
    }
    let hb: Heartbeat =
        serde_json::from_slice(payload).map_err(|e| format!("not a heartbeat: {e}"))?;
    let name_ok = !hb.node.is_empty()
        && hb.node.len() <= MAX_NAME
        && hb
            .node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !name_ok {
        return Err("bad node name".into());
    }
    let addr: SocketAddr = hb.addr.parse().map_err(|_| "bad address".to_owned())?;
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err("an address nobody can reach".into());
    }
    if !(16..=64).contains(&hb.token.len()) || !hb.token.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err("bad token".into());
    }
    Ok((hb.node, addr, hb.token, hb.leaving))
}

/// What a node answers a request it forwarded to itself: 508 Loop
/// Detected, marked, so that the forwarding side fetches from the origin.
pub fn loop_response() -> Response<ProxyBody> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = http::StatusCode::LOOP_DETECTED;
    resp.headers_mut()
        .insert(HOP, HeaderValue::from_static("loop"));
    resp
}

fn is_loop(resp: &Response<hyper::body::Incoming>) -> bool {
    resp.status() == http::StatusCode::LOOP_DETECTED
        && resp.headers().get(&HOP).is_some_and(|v| v == "loop")
}

/// The fields meant for edge caches that deliver removes for clients
/// (`Surrogate-Control`, `Surrogate-Key`, `Inlay-Cache-Control`): a key's
/// owner sends them on to the peer that caches its response, so the peer
/// stores the object as it would the origin's.
pub fn edge_fields(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for name in ["surrogate-control", "surrogate-key", "inlay-cache-control"] {
        for v in headers.get_all(name) {
            kept.append(HeaderName::from_static(name), v.clone());
        }
    }
    kept
}

/// The error and its sources, in one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_read_strictly() {
        let ok = br#"{"node":"edge-1","addr":"127.0.0.1:6081","token":"0123456789abcdef0123456789abcdef"}"#;
        assert!(parse_heartbeat(ok).is_ok());
        for bad in [
            &b"garbage"[..],
            br#"{"node":"a.b","addr":"127.0.0.1:1","token":"0123456789abcdef"}"#,
            br#"{"node":"a","addr":"0.0.0.0:1","token":"0123456789abcdef"}"#,
            br#"{"node":"a","addr":"127.0.0.1:1","token":"short"}"#,
            br#"{"node":"a","addr":"nowhere","token":"0123456789abcdef"}"#,
            br#"{"node":"a","addr":"127.0.0.1:1","token":"0123456789abcdef","extra":1}"#,
        ] {
            assert!(
                parse_heartbeat(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let huge = format!(
            r#"{{"node":"a","addr":"127.0.0.1:1","token":"0123456789abcdef","pad":"{}"}}"#,
            "x".repeat(4096)
        );
        assert!(
            parse_heartbeat(huge.as_bytes())
                .unwrap_err()
                .contains("bytes")
        );
    }
}

//! Purge, soft purge and ban fan-out over a JetStream stream.
//!
//! Every purge and ban this node makes through the cache's public methods
//! (`PURGE` and `BAN`, the admin API's `/purge` and `/ban`, a policy's
//! `cache.purge-*`) is applied here first, then queued (`Outbox`, the
//! cache's [`InvalidationSink`]) and published on `PREFIX.inv.NODE` to the
//! stream `PREFIX_INVALIDATIONS` with an id (`node-boot-counter`, also the
//! `Nats-Msg-Id`, so a retried publish is stored once). Every node reads
//! the whole stream with an ordered consumer and applies what the others
//! published through the `_local` forms of the same calls (what this
//! process published is applied already), skipping ids it has applied
//! recently.
//!
//! With a disk tier, a node records the stream sequence it has applied in
//! the store's kv (`inlay.cluster` / `invalidations`, after applying), so
//! that at start it replays what it missed before it serves. When the
//! stream no longer holds what it missed (its first sequence is past the
//! record, or it is another stream than the one recorded, or a sequence is
//! skipped while running), the node removes every object of its cache. A
//! memory-only node starts empty and reads from the stream's end.
//!
//! What is guaranteed:
//!
//! - **Restart, kill -9 included.** A purge is flushed to the disk tier
//!   before its sequence is recorded, so a node that died never records
//!   more than it applied; at start it applies everything after its record
//!   before it serves, or empties its cache. It never serves an object a
//!   purge in the stream covered, and never one whose purges left the
//!   stream unread.
//! - **NATS unreachable while running.** Purges made here apply here at
//!   once; up to `invalidation_queue` wait and are retried (the rest are
//!   logged and counted `lost`: the other nodes never apply them). The
//!   others' purges are applied when the connection is back, from the
//!   stream (a reader that stalled is reopened from its last sequence
//!   within about 10 s); if the stream dropped some
//!   meanwhile, the cache is emptied. **While disconnected, a node serves
//!   what it has**, including objects other nodes purged in that time:
//!   the window is the disconnection, or at most `max_disconnected` when
//!   it is set (the guard: past it the cache's reads are suspended until
//!   the reader has caught up).
//! - **Stop.** A clean stop waits up to 5 s for the queue to reach NATS;
//!   kill -9 loses what was queued (applied here, never sent).
//!
//! Anyone who can publish on `PREFIX.inv.>` is trusted as a node (NATS
//! authorization is the boundary); a message that is too large or does not
//! parse is skipped and counted (`inlay_cluster_invalidations_total{kind=
//! "malformed"}`), never applied.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt as _;
use inlay_cache::{BanError, HttpCache, Invalidation, InvalidationSink, PrimaryKey};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::{Cluster, ClusterMetrics};

/// Largest message published or applied, in bytes (a purge names one URL
/// or surrogate key, a ban one expression).
pub const MAX_MESSAGE: usize = 128 * 1024;
/// Ids of applied messages remembered to skip a second delivery.
const RECENT_IDS: usize = 100_000;
/// Longest id accepted.
const MAX_ID: usize = 256;
/// Messages published before their acknowledgements are awaited.
const PUBLISH_BATCH: usize = 64;
/// How long a batch of publications may wait for JetStream's acks.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a replay at start may wait for the next message before the
/// node gives up on it and starts with an empty cache.
const REPLAY_IDLE: Duration = Duration::from_secs(10);
/// How often a running node checks that the stream is still the one it
/// reads (a stream deleted and made anew restarts its sequences).
const STREAM_CHECK: Duration = Duration::from_secs(5);
/// The kv namespace and key of the applied sequence (policies' kv
/// namespaces start with `policy.`).
const RECORD_NS: &str = "inlay.cluster";
const RECORD_KEY: &str = "invalidations";

/// The counters of `inlay_cluster_invalidations_total{kind=...}`.
pub mod kind {
    /// Purges and bans of this node stored in the stream.
    pub const PUBLISHED: &str = "published";
    /// Publications that failed (NATS unreachable, no ack); retried.
    pub const PUBLISH_FAILED: &str = "publish_failed";
    /// Purges and bans applied here only: the queue for NATS was full or
    /// the message too large. Other nodes never see them.
    pub const LOST: &str = "lost";
    /// Other nodes' purges and bans applied while serving.
    pub const APPLIED: &str = "applied";
    /// Other nodes' purges and bans applied at start, before serving.
    pub const REPLAYED: &str = "replayed";
    /// Messages skipped because their id was applied already.
    pub const DUPLICATE: &str = "duplicate";
    /// Messages that are too large or do not parse; skipped.
    pub const MALFORMED: &str = "malformed";
    /// Messages that parsed but could not be applied (the store failed).
    pub const APPLY_FAILED: &str = "apply_failed";
    /// Other nodes' bans this node refused: past its ban memory budget
    /// (`cache.ban_memory`) or its most bans kept. The objects they cover
    /// stay cached here.
    pub const REFUSED: &str = "refused";
    /// Times the whole cache was emptied because purges were missed.
    pub const CACHE_CLEARED: &str = "cache_cleared";
}

/// What travels on the stream: one purge or ban.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Unique in the cluster: the node, its start time and a counter.
    pub id: String,
    /// The node that made it.
    pub node: String,
    /// What to do.
    #[serde(flatten)]
    pub op: Op,
}

/// The operation of a [`Message`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Every variant of a primary key (`PrimaryKey::as_str`).
    PurgeUrl {
        /// The primary key's text.
        key: String,
        /// Marked stale rather than removed.
        soft: bool,
    },
    /// Every object tagged with a surrogate key.
    PurgeKey {
        /// The surrogate key.
        key: String,
        /// Marked stale rather than removed.
        soft: bool,
    },
    /// A ban expression (`inlay_cache::BanExpression`).
    Ban {
        /// The expression as given.
        expression: String,
    },
}

impl Op {
    fn of(inv: Invalidation<'_>) -> Self {
        match inv {
            Invalidation::Url { key, soft } => Op::PurgeUrl {
                key: key.as_str().to_owned(),
                soft,
            },
            Invalidation::SurrogateKey { key, soft } => Op::PurgeKey {
                key: key.to_owned(),
                soft,
            },
            Invalidation::Ban { expression } => Op::Ban {
                expression: expression.to_owned(),
            },
        }
    }
}

/// What the fan-out needs of the node it runs in.
///
/// Other nodes' purges and bans are applied through the cache's `_local`
/// calls, without the host's reload lock: with `[cluster]` a reload never
/// moves the cache to another store (a new `cache.dir` waits for a
/// restart), so a ban applied here cannot be left behind on a cache a
/// reload replaced.
pub trait FanoutHost: Send + Sync + 'static {
    /// The cache new requests use (a reload may make another one).
    fn cache(&self) -> HttpCache;

    /// `objects` were removed or marked stale by a purge another node made
    /// (the host counts them with its own purges).
    fn purged(&self, objects: u64);
}

/// The running fan-out of a node: its publisher and its consumer.
pub struct Fanout {
    outbox: Arc<Outbox>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("queued", &self.outbox.queue.lock().len())
            .finish()
    }
}

impl Fanout {
    /// Start the fan-out of `cluster` for the cache `host` gives: make
    /// the stream if it is missing, replay what this node missed (or empty
    /// its cache when the stream no longer holds it), then read on and
    /// publish in the background. Returns once the cache may be served.
    pub async fn start(cluster: &Cluster, host: Arc<dyn FanoutHost>) -> anyhow::Result<Self> {
        let metrics = Arc::clone(cluster.metrics());
        let js = cluster.jetstream().clone();
        let stream_name = cluster.name("INVALIDATIONS");
        let inv = &cluster.config().invalidations;
        let config = stream::Config {
            name: stream_name.clone(),
            subjects: vec![cluster.subject("inv.>")],
            max_age: inv.max_age,
            max_messages: i64::try_from(inv.max_messages).unwrap_or(i64::MAX),
            max_message_size: MAX_MESSAGE as i32,
            duplicate_window: Duration::from_secs(120),
            discard: stream::DiscardPolicy::Old,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let stream = js
            .get_or_create_stream(config.clone())
            .await
            .with_context(|| format!("cluster: cannot open or create the stream {stream_name}"))?;
        let outbox = Arc::new(Outbox {
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            cap: inv.queue,
            node: cluster.node().to_owned(),
            subject: cluster.subject(&format!("inv.{}", cluster.node())),
            boot: boot_id(),
            counter: AtomicU64::new(0),
            metrics: Arc::clone(&metrics),
        });
        host.cache().set_invalidation_sink(outbox.clone());
        let mut reader = Reader {
            js: js.clone(),
            config,
            host,
            metrics,
            own: format!("{}-{}-", outbox.node, outbox.boot),
            recent: RecentIds::default(),
            applied: 0,
            applied_shared: Arc::new(AtomicU64::new(0)),
            stream_created: String::new(),
        };
        let (consumer, last) = reader.position(stream).await?;
        let consumer = reader.replay(consumer, last).await;
        let guard = (!inv.max_disconnected.is_zero()).then(|| Guard {
            js: js.clone(),
            stream: stream_name,
            applied: Arc::clone(&reader.applied_shared),
            host: Arc::clone(&reader.host),
            max: inv.max_disconnected,
        });
        let mut tasks = vec![
            tokio::spawn(reader.run(consumer)),
            tokio::spawn(publish(Arc::clone(&outbox), js)),
        ];
        tasks.extend(guard.map(|g| tokio::spawn(g.run())));
        Ok(Self { outbox, tasks })
    }

    /// Purges and bans queued for NATS now.
    pub fn queued(&self) -> usize {
        self.outbox.queue.lock().len()
    }

    /// Wait up to `within` for the queue to reach NATS, then stop reading
    /// and publishing. What is still queued is logged as lost.
    pub async fn stop(mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.queued() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.queued();
        if left > 0 {
            error!(
                left,
                "cluster: purges and bans made here were not published before shutdown; other nodes will not apply them"
            );
        }
        // Awaited, so that the cache they hold is closed when this returns.
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for Fanout {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One message waiting for NATS.
#[derive(Clone)]
struct Outgoing {
    id: String,
    payload: Bytes,
}

/// Unique to this start of this process (several nodes may share a
/// process in tests): the time, the process id and a counter, without `-`.
fn boot_id() -> String {
    static STARTS: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:x}.{:x}.{}",
        inlay_storage::now_ms(),
        std::process::id(),
        STARTS.fetch_add(1, Ordering::Relaxed)
    )
}

/// The purges and bans this node made, waiting to be published: the
/// cache's [`InvalidationSink`]. Bounded by `invalidation_queue`.
struct Outbox {
    queue: Mutex<VecDeque<Outgoing>>,
    wake: Notify,
    cap: usize,
    node: String,
    subject: String,
    boot: String,
    counter: AtomicU64,
    metrics: Arc<ClusterMetrics>,
}

impl InvalidationSink for Outbox {
    fn invalidated(&self, inv: Invalidation<'_>) {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{}-{n}", self.node, self.boot);
        let message = Message {
            id: id.clone(),
            node: self.node.clone(),
            op: Op::of(inv),
        };
        let payload = match serde_json::to_vec(&message) {
            Ok(p) if p.len() <= MAX_MESSAGE => Bytes::from(p),
            _ => {
                self.metrics.invalidation(kind::LOST, 1);
                error!(
                    ?inv,
                    "cluster: a purge too large to publish was applied on this node only"
                );
                return;
            }
        };
        {
            let mut q = self.queue.lock();
            if q.len() >= self.cap {
                drop(q);
                self.metrics.invalidation(kind::LOST, 1);
                error!(
                    ?inv,
                    queue = self.cap,
                    "cluster: the queue for NATS is full (cluster.invalidation_queue); this purge was applied on this node only"
                );
                return;
            }
            q.push_back(Outgoing { id, payload });
        }
        self.wake.notify_one();
    }
}

/// Publish the outbox, oldest first, up to [`PUBLISH_BATCH`] at a time;
/// what fails stays queued and is retried with a growing pause (the
/// `Nats-Msg-Id` makes a retry of a message stored once harmless).
async fn publish(outbox: Arc<Outbox>, js: jetstream::Context) {
    const FIRST_PAUSE: Duration = Duration::from_millis(50);
    let mut pause = FIRST_PAUSE;
    loop {
        let batch: Vec<Outgoing> = outbox
            .queue
            .lock()
            .iter()
            .take(PUBLISH_BATCH)
            .cloned()
            .collect();
        if batch.is_empty() {
            outbox.wake.notified().await;
            continue;
        }
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        let mut acks = Vec::with_capacity(batch.len());
        for m in &batch {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, m.id.as_str());
            let sent = tokio::time::timeout_at(
                deadline,
                js.publish_with_headers(outbox.subject.clone(), headers, m.payload.clone()),
            )
            .await;
            acks.push(match sent {
                Ok(Ok(ack)) => Some(ack),
                _ => None,
            });
        }
        let mut stored = HashSet::new();
        let mut last_error = None;
        for (m, ack) in batch.iter().zip(acks) {
            let Some(ack) = ack else { continue };
            match tokio::time::timeout_at(deadline, ack).await {
                Ok(Ok(_)) => {
                    stored.insert(m.id.clone());
                }
                Ok(Err(e)) => last_error = Some(e.to_string()),
                Err(_) => last_error = Some("no acknowledgement in time".to_owned()),
            }
        }
        outbox.queue.lock().retain(|m| !stored.contains(&m.id));
        let failed = batch.len() - stored.len();
        outbox
            .metrics
            .invalidation(kind::PUBLISHED, stored.len() as u64);
        if failed == 0 {
            pause = FIRST_PAUSE;
            continue;
        }
        outbox
            .metrics
            .invalidation(kind::PUBLISH_FAILED, failed as u64);
        warn!(
            failed,
            queued = outbox.queue.lock().len(),
            error = last_error.as_deref().unwrap_or("not sent"),
            "cluster: publishing purges failed; retrying"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Ids applied lately, oldest first, at most [`RECENT_IDS`].
#[derive(Default)]
struct RecentIds {
    order: VecDeque<Arc<str>>,
    set: HashSet<Arc<str>>,
}

impl RecentIds {
    /// Remembers `id`; false if it was remembered already.
    fn insert(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        let id: Arc<str> = Arc::from(id);
        if self.order.len() >= RECENT_IDS
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.order.push_back(Arc::clone(&id));
        self.set.insert(id);
        true
    }
}

/// How often the guard of `max_disconnected` asks the stream where it ends.
const GUARD_CHECK: Duration = Duration::from_secs(1);

/// `max_disconnected`: suspends the cache's reads while this node cannot
/// confirm that it has read every purge in the stream.
///
/// Each check asks the stream where it ends now (`target`, at `asked`).
/// Once the reader has applied up to a target, every purge stored before
/// its `asked` time is applied here: the node is in touch as of then. When
/// that time is more than `max` ago (NATS unreachable, the reader stalled
/// or far behind), reads are suspended until a later check confirms again.
struct Guard {
    js: jetstream::Context,
    stream: String,
    applied: Arc<AtomicU64>,
    host: Arc<dyn FanoutHost>,
    max: Duration,
}

impl Guard {
    async fn run(self) {
        let mut in_touch = tokio::time::Instant::now();
        let mut pending: Option<(u64, tokio::time::Instant)> = None;
        let mut suspended = false;
        let mut tick = tokio::time::interval(GUARD_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = tokio::time::Instant::now();
            if let Some((target, asked)) = pending
                && self.applied.load(Ordering::Relaxed) >= target
            {
                in_touch = in_touch.max(asked);
                pending = None;
            }
            if let Some(last) = self.stream_end().await {
                if self.applied.load(Ordering::Relaxed) >= last {
                    in_touch = now;
                    pending = None;
                } else if pending.is_none_or(|(target, _)| last < target) {
                    // A stream made anew restarts its sequences: the
                    // reader starts over at its end, below the old target.
                    pending = Some((last, now));
                }
            }
            let out = now.saturating_duration_since(in_touch) > self.max;
            // Set on every check: a reload may have made another cache.
            self.host.cache().set_reads_suspended(out);
            if out != suspended {
                suspended = out;
                if out {
                    warn!(
                        max_disconnected = ?self.max,
                        "cluster: this node cannot confirm it has read every purge; its cache is not read (requests go to the origin) until it has"
                    );
                } else {
                    info!("cluster: this node has read every purge again; its cache is read again");
                }
            }
        }
    }

    /// The stream's last sequence now, if NATS answers within a check.
    async fn stream_end(&self) -> Option<u64> {
        let ask = async {
            let stream = self.js.get_stream(&self.stream).await.ok()?;
            Some(stream.cached_info().state.last_sequence)
        };
        tokio::time::timeout(GUARD_CHECK, ask).await.ok().flatten()
    }
}

/// The applied position, as recorded in the store's kv.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Record {
    stream: String,
    /// The stream's creation time (unix ns): a stream made anew restarts
    /// its sequences.
    created: String,
    seq: u64,
}

type Consumer = consumer::pull::Ordered;

/// Reads the stream and applies other nodes' messages.
struct Reader {
    js: jetstream::Context,
    config: stream::Config,
    host: Arc<dyn FanoutHost>,
    metrics: Arc<ClusterMetrics>,
    /// The prefix of the ids this process publishes (`node-boot-`): its
    /// own messages are applied already. Not the node name alone: two
    /// nodes configured with one name still apply each other's purges, and
    /// a restarted node applies again what it made before (harmless).
    own: String,
    recent: RecentIds,
    /// The last stream sequence handled.
    applied: u64,
    /// `applied`, for the guard of `max_disconnected`.
    applied_shared: Arc<AtomicU64>,
    stream_created: String,
}

impl Reader {
    fn set_applied(&mut self, seq: u64) {
        self.applied = seq;
        self.applied_shared.store(seq, Ordering::Relaxed);
    }

    /// Decide where to read from: after the recorded sequence when the
    /// stream still holds everything after it, otherwise from the end,
    /// with the cache emptied. Returns the consumer and the stream's last
    /// sequence now (what a replay must reach).
    async fn position(&mut self, mut stream: stream::Stream) -> anyhow::Result<(Consumer, u64)> {
        let info = stream
            .info()
            .await
            .context("cluster: reading the invalidation stream's state")?;
        let (first, last) = (info.state.first_sequence, info.state.last_sequence);
        let created = info.created.unix_timestamp_nanos().to_string();
        self.stream_created = created.clone();
        let cache = self.host.cache();
        let start = if !cache.store().has_disk() {
            // Nothing survives a restart: there is nothing to replay.
            last + 1
        } else {
            match self.record(&cache).await {
                Some(r)
                    if r.stream == self.config.name
                        && r.created == created
                        && r.seq <= last
                        && r.seq + 1 >= first =>
                {
                    info!(
                        from = r.seq + 1,
                        to = last,
                        "cluster: replaying the purges this node missed"
                    );
                    r.seq + 1
                }
                r => {
                    let why = match r {
                        None => "this cache has no record of the cluster's purges".to_owned(),
                        Some(r) if r.stream != self.config.name || r.created != created => {
                            "the invalidation stream is not the one this cache read".to_owned()
                        }
                        Some(r) => format!(
                            "purges after sequence {} are no longer in the stream (it starts at {first})",
                            r.seq
                        ),
                    };
                    self.clear(&cache, &why).await;
                    last + 1
                }
            }
        };
        self.set_applied(start - 1);
        self.save(&cache).await;
        Ok((self.consumer(start).await?, last))
    }

    /// An ordered consumer of the whole stream from `start`.
    async fn consumer(&self, start: u64) -> anyhow::Result<Consumer> {
        let stream = self
            .js
            .get_or_create_stream(self.config.clone())
            .await
            .context("cluster: opening the invalidation stream")?;
        let c = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: start,
                },
                ..Default::default()
            })
            .await
            .context("cluster: reading the invalidation stream")?;
        c.messages()
            .await
            .context("cluster: reading the invalidation stream")
    }

    /// Apply every message up to `last` before the node serves. A replay
    /// that stalls for [`REPLAY_IDLE`] empties the cache instead.
    async fn replay(&mut self, mut consumer: Consumer, last: u64) -> Consumer {
        while self.applied < last {
            match tokio::time::timeout(REPLAY_IDLE, consumer.next()).await {
                Ok(Some(Ok(m))) => self.handle(m, kind::REPLAYED).await,
                Ok(Some(Err(e))) => {
                    warn!(error = %e, "cluster: reading the invalidation stream");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(None) | Err(_) => {
                    let cache = self.host.cache();
                    self.clear(&cache, "the replay of missed purges stalled")
                        .await;
                    self.set_applied(last);
                    self.save(&cache).await;
                    break;
                }
            }
        }
        consumer
    }

    /// Read on while the node runs.
    async fn run(mut self, mut consumer: Consumer) {
        let mut check = tokio::time::interval(STREAM_CHECK);
        check.tick().await;
        let mut applied_at_check = self.applied;
        loop {
            tokio::select! {
                m = consumer.next() => match m {
                    Some(Ok(m)) => self.handle(m, kind::APPLIED).await,
                    Some(Err(e)) => {
                        warn!(error = %e, "cluster: reading the invalidation stream");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    None => consumer = self.reopen(self.applied + 1).await,
                },
                _ = check.tick() => {
                    let stalled = self.applied == applied_at_check;
                    if let Some(fresh) = self.check_stream(stalled).await {
                        consumer = fresh;
                    }
                    applied_at_check = self.applied;
                }
            }
        }
    }

    /// A consumer from `start`, retried until it opens.
    async fn reopen(&self, start: u64) -> Consumer {
        loop {
            match self.consumer(start).await {
                Ok(c) => return c,
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "cluster: reopening the invalidation stream");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// When the stream was made anew (or lost what we had not read), empty
    /// the cache and read the new stream from its end. When it holds what
    /// we have not read and nothing came since the last check (`stalled`:
    /// the consumer did not survive a NATS restart), read it again from
    /// there.
    async fn check_stream(&mut self, stalled: bool) -> Option<Consumer> {
        // Made anew when someone deleted it: purges need somewhere to go.
        let mut stream = self
            .js
            .get_or_create_stream(self.config.clone())
            .await
            .ok()?;
        let info = stream.info().await.ok()?;
        let created = info.created.unix_timestamp_nanos().to_string();
        let (first, last) = (info.state.first_sequence, info.state.last_sequence);
        if created == self.stream_created && self.applied + 1 >= first {
            if stalled && last > self.applied {
                info!(
                    from = self.applied + 1,
                    to = last,
                    "cluster: the invalidation stream's reader stalled; reading again"
                );
                return Some(self.reopen(self.applied + 1).await);
            }
            return None;
        }
        let cache = self.host.cache();
        let why = if created != self.stream_created {
            "the invalidation stream was made anew"
        } else {
            "purges this node had not read left the stream"
        };
        self.clear(&cache, why).await;
        self.stream_created = created;
        self.set_applied(last);
        self.save(&cache).await;
        Some(self.reopen(last + 1).await)
    }

    /// Handle one message of the stream: skip what is ours, a duplicate or
    /// malformed; apply the rest; record the sequence.
    async fn handle(&mut self, m: jetstream::Message, counter: &'static str) {
        let seq = match m.info() {
            Ok(i) => i.stream_sequence,
            Err(e) => {
                warn!(error = %e, "cluster: a message without its stream sequence");
                return;
            }
        };
        if seq <= self.applied {
            return;
        }
        let cache = self.host.cache();
        if seq > self.applied + 1 {
            // Sequences run without gaps: something we had not read is gone.
            let why = format!(
                "purges {}..{} left the stream before this node read them",
                self.applied + 1,
                seq - 1
            );
            self.clear(&cache, &why).await;
        }
        self.set_applied(seq);
        match parse(&m.payload) {
            Err(why) => {
                self.metrics.invalidation(kind::MALFORMED, 1);
                warn!(seq, subject = %m.subject, why, "cluster: skipping a malformed message");
            }
            Ok(msg) if msg.id.starts_with(&self.own) => {
                // Applied here when it was made.
                self.recent.insert(&msg.id);
            }
            Ok(msg) if !self.recent.insert(&msg.id) => {
                self.metrics.invalidation(kind::DUPLICATE, 1);
                debug!(seq, id = %msg.id, "cluster: skipping a message applied already");
            }
            Ok(msg) => match apply(&cache, &msg.op).await {
                Ok(n) => {
                    self.metrics.invalidation(counter, 1);
                    if let Op::PurgeUrl { .. } | Op::PurgeKey { .. } = msg.op {
                        self.host.purged(n);
                    }
                    debug!(seq, id = %msg.id, from = %msg.node, objects = n, "cluster: applied");
                }
                Err(Unapplied::Refused(e)) => {
                    self.metrics.invalidation(kind::REFUSED, 1);
                    error!(seq, id = %msg.id, from = %msg.node, error = %e, "cluster: a ban from another node was refused here; the objects it covers stay cached on this node");
                }
                Err(Unapplied::Failed(e)) => {
                    self.metrics.invalidation(kind::APPLY_FAILED, 1);
                    error!(seq, id = %msg.id, from = %msg.node, error = %e, "cluster: a purge or ban from another node could not be applied");
                }
            },
        }
        self.save(&cache).await;
    }

    /// Remove every object: this node may have missed purges.
    /// Counted once the cache is empty (or emptying it failed), so that a
    /// reader of the count never finds an object the clear removes.
    async fn clear(&self, cache: &HttpCache, why: &str) {
        match cache.purge_all().await {
            Ok(n) => warn!(why, removed = n, "cluster: emptied the cache"),
            Err(e) => error!(why, error = %e, "cluster: emptying the cache failed"),
        }
        self.metrics.invalidation(kind::CACHE_CLEARED, 1);
    }

    async fn record(&self, cache: &HttpCache) -> Option<Record> {
        let raw = cache
            .store()
            .kv_get(RECORD_NS.into(), RECORD_KEY.into())
            .await
            .map_err(|e| warn!(error = %e, "cluster: reading the applied purge sequence"))
            .ok()??;
        serde_json::from_slice(&raw).ok()
    }

    /// Record the applied sequence with the disk tier (nothing to keep
    /// without one).
    async fn save(&self, cache: &HttpCache) {
        if !cache.store().has_disk() {
            return;
        }
        let record = Record {
            stream: self.config.name.clone(),
            created: self.stream_created.clone(),
            seq: self.applied,
        };
        let Ok(raw) = serde_json::to_vec(&record) else {
            return;
        };
        if let Err(e) = cache
            .store()
            .kv_set(RECORD_NS.into(), RECORD_KEY.into(), raw)
            .await
        {
            warn!(error = %e, "cluster: recording the applied purge sequence");
        }
    }
}

/// A message from the stream, or why it is refused.
pub fn parse(payload: &[u8]) -> Result<Message, String> {
    if payload.len() > MAX_MESSAGE {
        return Err(format!("{} bytes (at most {MAX_MESSAGE})", payload.len()));
    }
    let m: Message = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    if m.id.is_empty() || m.id.len() > MAX_ID {
        return Err("bad id".into());
    }
    match &m.op {
        Op::PurgeUrl { key, .. } if PrimaryKey::from_text(key).is_none() => {
            Err("not a primary key".into())
        }
        Op::PurgeKey { key, .. } if key.is_empty() => Err("empty surrogate key".into()),
        Op::Ban { expression } => inlay_cache::BanExpression::parse(expression)
            .map(|_| m.clone())
            .map_err(|e| e.to_string()),
        _ => Ok(m),
    }
}

/// Why another node's purge or ban was not applied here.
#[derive(Debug)]
enum Unapplied {
    /// A ban past this node's limits ([`BanError::OverBudget`] or
    /// [`BanError::TooMany`]).
    Refused(String),
    /// Anything else (the store failed, a bad key).
    Failed(String),
}

/// Apply `op` on this node only; the objects purged (0 for a ban).
async fn apply(cache: &HttpCache, op: &Op) -> Result<u64, Unapplied> {
    let failed = |e: &dyn std::fmt::Display| Unapplied::Failed(e.to_string());
    match op {
        Op::PurgeUrl { key, soft } => {
            let key =
                PrimaryKey::from_text(key).ok_or(Unapplied::Failed("not a primary key".into()))?;
            cache
                .purge_url_local(&key, *soft)
                .await
                .map_err(|e| failed(&e))
        }
        Op::PurgeKey { key, soft } => cache
            .purge_key_local(key, *soft)
            .await
            .map_err(|e| failed(&e)),
        Op::Ban { expression } => match cache.ban_local(expression).await {
            Ok(_) => Ok(0),
            Err(e @ (BanError::OverBudget { .. } | BanError::TooMany { .. })) => {
                Err(Unapplied::Refused(e.to_string()))
            }
            Err(e) => Err(failed(&e)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        let m = Message {
            id: "edge-1-1-0".into(),
            node: "edge-1".into(),
            op: Op::PurgeUrl {
                key: PrimaryKey::new("example.com", "/a?b", &[]).as_str().into(),
                soft: true,
            },
        };
        let raw = serde_json::to_vec(&m).unwrap();
        assert_eq!(parse(&raw).unwrap(), m);
        for bad in [
            &b"not json"[..],
            br#"{"id":"","node":"n","op":"purge_key","key":"k","soft":false}"#,
            br#"{"id":"1","node":"n","op":"purge_key","key":"","soft":false}"#,
            br#"{"id":"1","node":"n","op":"purge_url","key":"no host part","soft":false}"#,
            br#"{"id":"1","node":"n","op":"ban","expression":"req.url ~"}"#,
            br#"{"id":"1","node":"n","op":"drop_tables"}"#,
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(parse(&vec![b' '; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn recent_ids_are_bounded_and_catch_a_second_delivery() {
        let mut r = RecentIds::default();
        assert!(r.insert("a"));
        assert!(!r.insert("a"));
        for i in 0..RECENT_IDS {
            r.insert(&i.to_string());
        }
        assert_eq!(r.order.len(), RECENT_IDS);
        assert_eq!(r.set.len(), RECENT_IDS);
        assert!(r.insert("a"), "the oldest id was forgotten");
    }
}

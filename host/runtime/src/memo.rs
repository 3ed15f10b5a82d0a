//! Replaying a policy without running it.
//!
//! A request's policy instance starts from the same snapshot every time
//! and imports nothing but the host's interfaces, so what it does is a
//! function of what the host tells it: the hooks it is called with and the
//! replies to its host calls. The first request that takes a path through
//! the policy records it: the hook it entered, each host call it made (as a
//! closure that can make the same call again on another request's heads)
//! with the reply it got, and what the hook returned. Later requests walk
//! the recorded paths instead of instantiating: they make each recorded
//! call on their own heads, and as long as every reply matches one seen
//! before, the policy would have made the same next call, so they go on to
//! it, up to the hook's recorded result. Side effects (a header set, a log
//! line) happen because the calls are really made.
//!
//! When a reply was never seen, or a hook was never entered from this
//! point, the request needs a real instance: it is created, and the hooks
//! the request has passed are called again with the replies already given
//! answered from a tape (nothing is done twice), which brings the instance
//! to the point where the paths parted; from there it runs live, and what
//! it does is recorded as a new branch.
//!
//! Calls whose reply depends on the world rather than on the request
//! (the clock, kv, cache and fetch) end a path: the tree records an
//! `Opaque` step there and requests that reach it always run the policy.
//! Failed hooks are never recorded.
//!
//! Once a shard's tree has filled up (turned over once), a path is
//! recorded the second time a request takes it, not the first: most of the
//! paths of a site with many URLs are taken once, and recording them (a
//! closure per host call, a node per step, the trees turning over sooner)
//! cost more than the walks of the others saved (on a Zipf mix over
//! 100,000 URLs, five times fewer paths are recorded, and as many requests
//! replayed). A small table of the points where requests left the paths
//! (their hash, one per slot, a newer one replacing an older) remembers the
//! first sighting. Before the tree first fills, every path is recorded:
//! there is room, and the second request on each URL replays. Each policy generation has its own
//! trees, bounded in bytes, and keeps the paths requests use: when the
//! current tree is full it becomes the previous one and a new tree starts;
//! a request that walks a path only the previous tree has copies it into
//! the current one as it goes, and what nobody walked goes with the
//! previous tree at the next turn. A path walked at least once per turn
//! (the popular ones) is never lost; a site with more paths than fit
//! keeps its most requested ones rather than starting over.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use inlay_core::{CacheSettings, RequestAction};
use parking_lot::RwLock;

use crate::errors::Hook;

/// A recorded host call, made again on another request's store state.
/// (`S` is the request's store state: the tree does not need to know it.)
pub(crate) type Op<S> = Arc<dyn Fn(&mut S) -> wasmtime::Result<Reply> + Send + Sync>;

/// What a repeatable host call returned to the guest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    Unit,
    Bool(bool),
    U16(u16),
    Str(String),
    OptStr(Option<String>),
    Strs(Vec<String>),
    Pairs(Vec<(String, String)>),
    Checked(Result<(), String>),
}

/// A host call result that can be kept as a [`Reply`] and given back.
pub(crate) trait Recordable: Clone + Sized {
    fn into_reply(self) -> Reply;
    fn from_reply(reply: Reply) -> Option<Self>;
}

macro_rules! recordable {
    ($ty:ty, $variant:ident) => {
        impl Recordable for $ty {
            fn into_reply(self) -> Reply {
                Reply::$variant(self)
            }
            fn from_reply(reply: Reply) -> Option<Self> {
                match reply {
                    Reply::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

recordable!(bool, Bool);
recordable!(u16, U16);
recordable!(String, Str);
recordable!(Option<String>, OptStr);
recordable!(Vec<String>, Strs);
recordable!(Vec<(String, String)>, Pairs);
recordable!(Result<(), String>, Checked);

impl Recordable for () {
    fn into_reply(self) -> Reply {
        Reply::Unit
    }
    fn from_reply(reply: Reply) -> Option<Self> {
        matches!(reply, Reply::Unit).then_some(())
    }
}

/// A hook call as the guest sees it: which hook, and its arguments other
/// than the request and response handles.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Entry {
    pub(crate) hook: Hook,
    /// The host's defaults passed to `on-backend-response` (boxed: every
    /// node's keys are as large as the largest).
    pub(crate) settings: Option<Box<CacheSettings>>,
}

/// A request's hooks so far (each hook at most once in a request's life).
pub(crate) type Entries = smallvec::SmallVec<[Entry; 3]>;

/// The replies a request's guest got, in order; a typical request's fit
/// inline.
pub(crate) type Replies = smallvec::SmallVec<[(&'static str, Reply); 16]>;

/// What a hook returned.
#[derive(Clone, Debug)]
pub(crate) enum Returned {
    Action(RequestAction),
    Settings(CacheSettings),
    Unit,
}

/// How a path goes on from a node.
pub(crate) enum Step<S> {
    /// Nothing has happened yet (the root).
    Start,
    /// The guest makes this host call; children are keyed by its reply.
    Call { name: &'static str, op: Op<S> },
    /// The hook returns this; children are keyed by the next hook entered.
    /// (Boxed: a synthetic response is large, and every node is as large as
    /// its largest step.)
    Return(Box<Returned>),
    /// The guest makes a call that cannot be repeated: run it live.
    Opaque,
}

// Not derived: a derive would ask `S: Clone` of the store state.
impl<S> Clone for Step<S> {
    fn clone(&self) -> Self {
        match self {
            Step::Start => Step::Start,
            Step::Call { name, op } => Step::Call {
                name,
                op: Arc::clone(op),
            },
            Step::Return(returned) => Step::Return(returned.clone()),
            Step::Opaque => Step::Opaque,
        }
    }
}

/// What leads from a node to one of its children.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Entry(Entry),
    Reply(Reply),
}

/// One point on the recorded paths.
pub(crate) struct Node<S> {
    pub(crate) step: Step<S>,
    children: Children<S>,
}

impl<S> Node<S> {
    fn new(step: Step<S>) -> Self {
        Self {
            step,
            children: Children::new(),
        }
    }

    /// The child reached by `key`, if recorded (requests walk with
    /// [`Memo::child`], which also looks in the previous tree).
    #[cfg(test)]
    fn child(&self, key: &Key) -> Option<Arc<Node<S>>> {
        self.children.get(hash(key), key)
    }
}

/// Slots for children in a node itself; most nodes have one child.
const FIRST_TABLE: usize = 2;

/// The hash of a key, seeded at random per process (replies come from
/// requests: a fixed seed would let a client aim for collisions; and a
/// collision costs only a few more probes here). foldhash rather than the
/// standard SipHash: every replayed step hashes a reply.
fn hash(key: &Key) -> u64 {
    use std::hash::BuildHasher;
    static STATE: OnceLock<foldhash::fast::RandomState> = OnceLock::new();
    STATE
        .get_or_init(foldhash::fast::RandomState::default)
        .hash_one(key)
}

/// A node's children: two slots in the node itself (most nodes have one
/// child), then, for a node with more, a hash table beside it.
///
/// Reading is what every replayed request does at every step, so the
/// slots take no lock and write nothing: a set slot is read with a plain
/// acquire load, and since slots are never cleared an empty slot means no
/// other child. (A `RwLock<HashMap>` for every node spent more time on its
/// lock and reference-count atomics than the rest of a replay.) Only the
/// few wide nodes, where requests part ways (the URLs of a site, one child
/// each), have the table, behind a read-write lock: one lookup of a few
/// cache lines, where a chain of ever bigger insert-only tables probed
/// each one in turn (30 cache misses for a key in the fifth).
struct Children<S> {
    first: [Slot<S>; FIRST_TABLE],
    wide: OnceLock<Box<RwLock<Wide<S>>>>,
}

/// A child: its key's hash, the key, the node.
type Child<S> = (u64, Key, Arc<Node<S>>);
type Slot<S> = OnceLock<Child<S>>;
type Wide<S> = hashbrown::HashTable<Child<S>>;

impl<S> Children<S> {
    fn new() -> Self {
        Self {
            first: std::array::from_fn(|_| OnceLock::new()),
            wide: OnceLock::new(),
        }
    }

    fn get(&self, hash: u64, key: &Key) -> Option<Arc<Node<S>>> {
        for slot in &self.first {
            match slot.get() {
                None => return None,
                Some((h, k, node)) if *h == hash && k == key => return Some(Arc::clone(node)),
                Some(_) => {}
            }
        }
        let wide = self.wide.get()?.read();
        wide.find(hash, |(h, k, _)| *h == hash && k == key)
            .map(|(_, _, node)| Arc::clone(node))
    }

    /// Sets `key` to `node` unless the key is there already; returns the
    /// node the key leads to, whether it is the one given, and the bytes
    /// the wide table took for it.
    fn insert(&self, hash: u64, key: Key, node: Arc<Node<S>>) -> (Arc<Node<S>>, bool, usize) {
        let mut entry = (hash, key, node);
        for slot in &self.first {
            match slot.set(entry) {
                Ok(()) => {
                    let (_, _, node) = slot.get().expect("just set");
                    return (Arc::clone(node), true, 0);
                }
                Err(back) => {
                    entry = back;
                    if let Some((h, k, existing)) = slot.get()
                        && *h == hash
                        && *k == entry.1
                    {
                        return (Arc::clone(existing), false, 0);
                    }
                }
            }
        }
        let mut wide = self
            .wide
            .get_or_init(|| Box::new(RwLock::new(Wide::new())))
            .write();
        if let Some((_, _, existing)) = wide.find(hash, |(h, k, _)| *h == hash && *k == entry.1) {
            return (Arc::clone(existing), false, 0);
        }
        let node = Arc::clone(&entry.2);
        wide.insert_unique(hash, entry, |(h, _, _)| *h);
        // The entry and its share of the table's spare room and control
        // bytes (hashbrown keeps it at most 7/8 full).
        (node, true, std::mem::size_of::<Child<S>>() * 8 / 7 + 1)
    }
}

/// A host call made while recording: what it was, how to make it again and
/// what the guest got.
pub(crate) struct Recorded<S> {
    pub(crate) name: &'static str,
    pub(crate) op: Op<S>,
    pub(crate) reply: Reply,
}

/// What a live hook did, for [`Memo::insert`]: its calls after the branch
/// point, and whether it ended in a call that cannot be repeated.
pub(crate) struct Recording<S> {
    pub(crate) calls: Vec<Recorded<S>>,
    pub(crate) opaque: bool,
}

// Not derived: a derive would ask `S: Default` of the store state.
impl<S> Default for Recording<S> {
    fn default() -> Self {
        Self {
            calls: Vec::new(),
            opaque: false,
        }
    }
}

/// Counters of one policy generation's tree, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoStats {
    /// Hooks answered from the tree without an instance.
    pub replayed: u64,
    /// Hooks that needed an instance.
    pub live: u64,
    /// Times a tree reached its size: the previous tree (and the paths
    /// nobody walked since the last time) was dropped and a new one began.
    pub resets: u64,
    /// Requests that left the recorded paths, after the trees had filled,
    /// where none had before (as far as the table of first sightings
    /// remembers): they ran without recording; the next one there records.
    pub first_sightings: u64,
    /// Approximate bytes held now.
    pub bytes: usize,
    /// Requests that ran live from their first hook without walking the
    /// trees, because on their thread that cost less lately (see
    /// [`Memo::start`]); their hooks count as `live`.
    pub unreplayed: u64,
}

/// The recorded paths of one policy generation, two trees per shard (the
/// current one and the previous one, see the module's documentation).
///
/// Walking a tree takes a read lock and a reference count per step; when
/// every core walks the same nodes, those atomic writes bounce the nodes'
/// cache lines between cores (a profile of `headers` at 180 k req/s had a
/// third of the replay cost there). So each worker thread walks and
/// records in a tree of its own, found by a thread-local shard index, and
/// the byte budget is split between them.
pub(crate) struct Memo<S> {
    shards: Box<[Shard<S>]>,
    max_bytes: usize,
    /// Set after a recording contradicted the tree (a guest that does not
    /// repeat itself); nothing more is recorded or replayed.
    disabled: AtomicBool,
    /// Whether a request may run live without walking the trees when that
    /// costs less (see [`Memo::start`]); otherwise every request walks.
    measured: bool,
}

/// One thread's tree and counters. Aligned to two cache lines (what x86
/// prefetches together) so that neighbouring shards, written by other
/// threads on every request, never share one: a profile had the false
/// sharing costing more than the walk itself.
#[repr(align(128))]
struct Shard<S> {
    roots: RwLock<Roots<S>>,
    /// Bytes of the current tree.
    bytes: AtomicUsize,
    /// What the current tree may hold; the previous one holds as much at
    /// most.
    max_bytes: usize,
    replayed: AtomicU64,
    live: AtomicU64,
    resets: AtomicU64,
    /// Where requests left the recorded paths lately: the hash of each
    /// point (see [`Memo::admit`]), by its low bits.
    sighted: Box<[AtomicU64]>,
    /// Paths not recorded because they were seen for the first time.
    first_sightings: AtomicU64,
    /// What a request's policy cost lately on this thread, by the way it
    /// started (see [`Way`]): moving averages in nanoseconds, 0 until
    /// measured.
    cost: [AtomicU64; 2],
    /// How many measurements each average holds so far (up to
    /// 2^[`COST_SHIFT`]): the first ones weigh more, so that one early
    /// request (the first walk, which records its path) does not hold the
    /// average up for long.
    samples: [AtomicU64; 2],
    /// Requests started on this shard: picks the ones measured and the
    /// ones that try the way not chosen.
    started: AtomicU64,
    /// Requests that ran live by choice.
    unreplayed: AtomicU64,
}

/// How a request starts: on the recorded paths, or live in an instance
/// without walking them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    Replay = 0,
    Live = 1,
}

/// The way a request started when the memo chose it (see
/// [`Memo::start`]): its shard, the way, and whether its policy time is
/// measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chosen {
    pub(crate) shard: usize,
    pub(crate) way: Way,
    pub(crate) measured: bool,
}

/// One request in this many tries the way its thread does not prefer now,
/// so that both costs stay measured (a site's traffic changes).
const TRY_OTHER_WAY: u64 = 32;
/// The same when running live costs more than [`FAR_APART`] times walking
/// and walking is preferred (an interpreted policy's live requests on a
/// popular URL: trying them one in 32 cost more than the walks took). Not
/// the other way round: walks that cost far more than running live (they
/// mostly left the paths and recorded new ones) are tried one in 32 still,
/// so that a thread finds out soon when the paths start to answer.
const TRY_OTHER_WAY_FAR: u64 = 256;
const FAR_APART: u64 = 4;
/// One request in this many of the preferred way is measured (two clock
/// reads per hook: not worth paying on every request).
const MEASURE_ONE_IN: u64 = 4;
/// The weight of a new measurement in a moving average: 1/2^this.
const COST_SHIFT: u32 = 4;
/// A measurement counts for at most this many times the average: a
/// request preempted on a busy machine is not what the policy costs.
const COST_OUTLIER: u64 = 8;

/// The roots of a shard's two trees.
struct Roots<S> {
    current: Arc<Node<S>>,
    previous: Option<Arc<Node<S>>>,
}

/// Where a request walks: its shard's number and the roots.
pub(crate) struct Start<S> {
    pub(crate) shard: usize,
    pub(crate) root: Cursor<S>,
}

/// A point on the recorded paths: its node in the current tree, the same
/// point in the previous tree while the path is there too, and the hash of
/// the keys that led there (the same in both trees).
pub(crate) struct Cursor<S> {
    pub(crate) node: Arc<Node<S>>,
    old: Option<Arc<Node<S>>>,
    path: u64,
}

impl<S> Cursor<S> {
    /// A point that exists only in the current tree (a path just recorded),
    /// reached by the keys hashed as `path`.
    pub(crate) fn new(node: Arc<Node<S>>, path: u64) -> Self {
        Self {
            node,
            old: None,
            path,
        }
    }

    /// The hash of the path to this point and on by `key`: what
    /// [`Memo::admit`] is asked about where a request leaves the paths.
    pub(crate) fn sighting(&self, key: &Key) -> u64 {
        follow(self.path, hash(key))
    }
}

/// The hash of a path that goes on by a key whose hash is `key`.
fn follow(path: u64, key: u64) -> u64 {
    // A multiply-rotate mix (as FxHash): cheap, and order-dependent.
    (path.rotate_left(5) ^ key).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

// Not derived: a derive would ask `S: Clone` of the store state.
impl<S> Clone for Cursor<S> {
    fn clone(&self) -> Self {
        Self {
            node: Arc::clone(&self.node),
            old: self.old.clone(),
            path: self.path,
        }
    }
}

/// How many shards per-thread structures have: one per core, up to 64.
pub(crate) fn shard_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(64)
}

/// This thread's shard among `n`.
pub(crate) fn shard_index(n: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i) % n.max(1)
}

/// Rough size of a node: the node (with its first table of children), and
/// its key. (What a recorded call captured, its arguments, is not counted;
/// they are header names and values of the same order as the replies.)
fn node_bytes<S>(key: &Key) -> usize {
    let key_bytes = match key {
        Key::Entry(e) => e.settings.as_ref().map_or(0, |s| {
            std::mem::size_of::<CacheSettings>()
                + s.surrogate_keys.iter().map(|k| k.len() + 24).sum::<usize>()
        }),
        Key::Reply(r) => reply_bytes(r),
    };
    std::mem::size_of::<Node<S>>() + 64 + key_bytes
}

pub(crate) fn reply_bytes(reply: &Reply) -> usize {
    match reply {
        Reply::Unit | Reply::Bool(_) | Reply::U16(_) => 0,
        Reply::Str(s) => s.len(),
        Reply::OptStr(s) => s.as_ref().map_or(0, String::len),
        Reply::Strs(v) => v.iter().map(|s| s.len() + 24).sum(),
        Reply::Pairs(v) => v.iter().map(|(a, b)| a.len() + b.len() + 48).sum(),
        Reply::Checked(r) => r.as_ref().err().map_or(0, String::len),
    }
}

/// Bytes of a tree per slot of its shard's table of first sightings: a
/// path of `headers` takes about 2.5 KB, so the table remembers the last
/// ten times as many first sightings as the tree holds paths.
const TREE_BYTES_PER_SIGHTING: usize = 256;

impl<S> Shard<S> {
    fn new(max_bytes: usize) -> Self {
        let sightings = (max_bytes / TREE_BYTES_PER_SIGHTING)
            .clamp(256, 1 << 16)
            .next_power_of_two();
        Self {
            roots: RwLock::new(Roots {
                current: Arc::new(Node::new(Step::Start)),
                previous: None,
            }),
            bytes: AtomicUsize::new(0),
            max_bytes,
            replayed: AtomicU64::new(0),
            live: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            sighted: (0..sightings).map(|_| AtomicU64::new(0)).collect(),
            first_sightings: AtomicU64::new(0),
            cost: [AtomicU64::new(0), AtomicU64::new(0)],
            samples: [AtomicU64::new(0), AtomicU64::new(0)],
            started: AtomicU64::new(0),
            unreplayed: AtomicU64::new(0),
        }
    }

    /// The child of `parent` at `key`, made with `step` if absent. Returns
    /// `None` if an existing child disagrees with `step` about what the
    /// guest does next.
    fn child_or_insert(&self, parent: &Node<S>, key: Key, step: Step<S>) -> Option<Arc<Node<S>>> {
        let hash = hash(&key);
        let kind = Kind::of(&step);
        if let Some(existing) = parent.children.get(hash, &key) {
            return (Kind::of(&existing.step) == kind).then_some(existing);
        }
        let size = node_bytes::<S>(&key) + step_bytes(&step);
        // Another request may record the same path meanwhile: the first
        // one's node stays.
        let (node, added, grown) = parent.children.insert(hash, key, Arc::new(Node::new(step)));
        let size = size + grown;
        if !added {
            return (Kind::of(&node.step) == kind).then_some(node);
        }
        let total = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        if total > self.max_bytes {
            self.turn();
        }
        Some(node)
    }

    /// The current tree is full: it becomes the previous one, and the
    /// previous one (with every path nobody walked since the last turn)
    /// goes. Requests walking the old trees keep their nodes.
    fn turn(&self) {
        let fresh = Arc::new(Node::new(Step::Start));
        let dropped = {
            let mut roots = self.roots.write();
            let full = std::mem::replace(&mut roots.current, fresh);
            self.bytes.store(0, Ordering::Relaxed);
            roots.previous.replace(full)
        };
        // Freed outside the lock.
        drop(dropped);
        self.resets.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            max_bytes = self.max_bytes,
            "policy memo full; the paths walked since the last turn are kept"
        );
    }
}

impl<S> Memo<S> {
    /// Empty trees that hold about `max_bytes` together (each shard's
    /// current and previous trees half of its share each); with
    /// `measured`, requests walk them only while that costs less than
    /// running live (see [`Memo::start`]).
    pub(crate) fn new(max_bytes: usize, measured: bool) -> Self {
        let n = shard_count();
        Self {
            shards: (0..n).map(|_| Shard::new(max_bytes / n / 2)).collect(),
            max_bytes,
            disabled: AtomicBool::new(false),
            measured,
        }
    }

    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub(crate) fn measured(&self) -> bool {
        self.measured
    }

    /// Where a request on this thread starts: on the recorded paths, or
    /// (`None`) live, when replaying was switched off or when live
    /// requests cost less than replayed ones on this thread lately; and
    /// whether to measure what its policy costs (see [`Memo::spent`]).
    ///
    /// Replay pays where a live hook costs much more than a walk (an
    /// interpreted guest) or where most requests find their path; for a
    /// compiled guest whose live hooks cost a few microseconds, on a site
    /// with a long tail of URLs, the walks that find no path, the
    /// instances brought up to where they left the paths and the
    /// recording cost more than the walks that replay save. Which way is
    /// cheaper is measured, not guessed: every thread keeps a moving
    /// average of each way's cost per request (the time in the policy's
    /// hooks and in starting the request), prefers the cheaper way, and
    /// sends one request in [`TRY_OTHER_WAY`] the other way so both stay
    /// measured (one in [`TRY_OTHER_WAY_FAR`] while running live costs
    /// more than [`FAR_APART`] times as much as walking).
    pub(crate) fn start(&self) -> (Option<Start<S>>, Option<Chosen>) {
        if self.disabled.load(Ordering::Relaxed) {
            return (None, None);
        }
        let index = shard_index(self.shards.len());
        let shard = &self.shards[index];
        if !self.measured {
            return (Some(self.root(index)), None);
        }
        let n = shard.started.fetch_add(1, Ordering::Relaxed);
        let replay = shard.cost[Way::Replay as usize].load(Ordering::Relaxed);
        let live = shard.cost[Way::Live as usize].load(Ordering::Relaxed);
        let preferred = if live != 0 && live < replay {
            Way::Live
        } else {
            Way::Replay
        };
        let measured_both = live != 0 && replay != 0;
        let every =
            if measured_both && preferred == Way::Replay && replay.saturating_mul(FAR_APART) < live
            {
                TRY_OTHER_WAY_FAR
            } else {
                TRY_OTHER_WAY
            };
        let other = n % every == every - 1;
        let way = match (preferred, other) {
            (Way::Replay, true) => Way::Live,
            (Way::Live, true) => Way::Replay,
            (way, false) => way,
        };
        let chosen = Chosen {
            shard: index,
            way,
            measured: other || n.is_multiple_of(MEASURE_ONE_IN),
        };
        if way == Way::Live {
            shard.unreplayed.fetch_add(1, Ordering::Relaxed);
            return (None, Some(chosen));
        }
        (Some(self.root(index)), Some(chosen))
    }

    /// The start of shard `index`'s trees.
    fn root(&self, index: usize) -> Start<S> {
        let roots = self.shards[index].roots.read();
        let root = Cursor {
            node: Arc::clone(&roots.current),
            old: roots.previous.clone(),
            path: 0,
        };
        Start { shard: index, root }
    }

    /// A measured request's policy took `nanos` (see [`Memo::start`]).
    pub(crate) fn spent(&self, chosen: Chosen, nanos: u64) {
        let shard = &self.shards[chosen.shard];
        let cost = &shard.cost[chosen.way as usize];
        let average = cost.load(Ordering::Relaxed);
        // The n-th measurement weighs 1/n until it weighs 1/2^COST_SHIFT.
        let held = shard.samples[chosen.way as usize].load(Ordering::Relaxed);
        let weight = (held + 1).min(1 << COST_SHIFT);
        if held < weight {
            shard.samples[chosen.way as usize].store(held + 1, Ordering::Relaxed);
        }
        let next = if average == 0 {
            nanos.max(1)
        } else {
            let nanos = nanos.min(average.saturating_mul(COST_OUTLIER));
            (average - average / weight + nanos / weight).max(1)
        };
        cost.store(next, Ordering::Relaxed);
    }

    /// Whether a request leaving the recorded paths at `sighting` (see
    /// [`Cursor::sighting`]) should record where it goes: yes while the
    /// shard's tree has never filled up; after, yes if a request left them
    /// there before, as far as the table of first sightings remembers,
    /// otherwise the sighting is remembered and the request runs without
    /// recording.
    pub(crate) fn admit(&self, shard: usize, sighting: u64) -> bool {
        let shard = &self.shards[shard];
        // Until the trees fill up, every path is recorded.
        if shard.resets.load(Ordering::Relaxed) == 0 {
            return true;
        }
        let mask = shard.sighted.len() - 1;
        // The high bits pick the slot: the low ones are the multiply's weakest.
        let slot = &shard.sighted[usize::try_from(sighting >> 40).unwrap_or(0) & mask];
        // 0 marks an empty slot: no sighting is 0 then.
        let sighting = sighting.max(1);
        if slot.load(Ordering::Relaxed) == sighting {
            return true;
        }
        slot.store(sighting, Ordering::Relaxed);
        shard.first_sightings.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The point `key` leads to from `at`, if recorded. A point only the
    /// previous tree has is copied into the current one: a request walks
    /// it again, so it is kept.
    pub(crate) fn child(&self, shard: usize, at: &Cursor<S>, key: &Key) -> Option<Cursor<S>> {
        let hash = hash(key);
        let path = follow(at.path, hash);
        let old = at.old.as_ref().and_then(|old| old.children.get(hash, key));
        if let Some(node) = at.node.children.get(hash, key) {
            return Some(Cursor { node, old, path });
        }
        let old = old?;
        if self.disabled.load(Ordering::Relaxed) {
            return None;
        }
        let node = self.shards[shard].child_or_insert(&at.node, key.clone(), old.step.clone())?;
        Some(Cursor {
            node,
            old: Some(old),
            path,
        })
    }

    /// Stops replaying and recording for this generation: an instance did
    /// not do what a recorded path said it would.
    pub(crate) fn disable(&self) {
        if !self.disabled.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the policy did not repeat itself on the same inputs; \
                 it runs live on every request from now on"
            );
        }
    }

    pub(crate) fn count_replayed(&self, shard: usize) {
        self.shards[shard].replayed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_live(&self, shard: usize) {
        self.shards[shard].live.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> MemoStats {
        let sum = |f: fn(&Shard<S>) -> u64| self.shards.iter().map(f).sum::<u64>();
        MemoStats {
            replayed: sum(|s| s.replayed.load(Ordering::Relaxed)),
            live: sum(|s| s.live.load(Ordering::Relaxed)),
            resets: sum(|s| s.resets.load(Ordering::Relaxed)),
            first_sightings: sum(|s| s.first_sightings.load(Ordering::Relaxed)),
            unreplayed: sum(|s| s.unreplayed.load(Ordering::Relaxed)),
            bytes: self
                .shards
                .iter()
                .map(|s| s.bytes.load(Ordering::Relaxed))
                .sum(),
        }
    }

    /// Adds what a live hook did under `at` in `shard`'s tree: `first`
    /// leads to its first step, each call's reply to the next, and the
    /// hook's end (`returned`, or `Opaque` if the recording is) comes last.
    /// Returns the end, where the request goes on from, unless the path
    /// ended opaque.
    pub(crate) fn insert(
        &self,
        shard: usize,
        at: &Cursor<S>,
        first: Key,
        recording: Recording<S>,
        returned: Returned,
    ) -> Option<Cursor<S>> {
        if self.disabled.load(Ordering::Relaxed) {
            return None;
        }
        let shard = &self.shards[shard];
        let mut parent: Option<Arc<Node<S>>> = None;
        let mut path = at.path;
        let mut key = first;
        for call in recording.calls {
            let step = Step::Call {
                name: call.name,
                op: call.op,
            };
            path = follow(path, hash(&key));
            let node = {
                let at = parent.as_deref().unwrap_or(&at.node);
                shard.child_or_insert(at, key, step)
            };
            let Some(node) = node else {
                self.disable();
                return None;
            };
            parent = Some(node);
            key = Key::Reply(call.reply);
        }
        let end = if recording.opaque {
            Step::Opaque
        } else {
            Step::Return(Box::new(returned))
        };
        let opaque = recording.opaque;
        path = follow(path, hash(&key));
        let at = parent.as_deref().unwrap_or(&at.node);
        let Some(node) = shard.child_or_insert(at, key, end) else {
            self.disable();
            return None;
        };
        (!opaque).then(|| Cursor::new(node, path))
    }
}

fn step_bytes<S>(step: &Step<S>) -> usize {
    match step {
        Step::Start | Step::Opaque | Step::Call { .. } => 0,
        Step::Return(returned) => {
            std::mem::size_of::<Returned>()
                + match &**returned {
                    Returned::Action(RequestAction::Synthetic(s)) => {
                        s.body.len() + s.headers.len() * 64
                    }
                    Returned::Settings(s) => s.surrogate_keys.iter().map(|k| k.len() + 24).sum(),
                    Returned::Action(_) | Returned::Unit => 0,
                }
        }
    }
}

/// What a step is, to check that a new recording of a point agrees with
/// the recorded one: the same call, or both ends. (A hook's results are not
/// compared: the same calls with the same replies give the same result.)
#[derive(PartialEq, Eq)]
enum Kind {
    Start,
    Call(&'static str),
    Return,
    Opaque,
}

impl Kind {
    fn of<S>(step: &Step<S>) -> Self {
        match step {
            Step::Start => Kind::Start,
            Step::Call { name, .. } => Kind::Call(name),
            Step::Return(_) => Kind::Return,
            Step::Opaque => Kind::Opaque,
        }
    }
}

/// Replies given during replay, answered again to an instance that is
/// being brought to the same point.
#[derive(Default)]
pub(crate) struct Tape {
    replies: std::collections::VecDeque<(&'static str, Reply)>,
    /// Set when the guest asked for something other than the tape holds.
    pub(crate) broken: bool,
}

impl Tape {
    pub(crate) fn new(replies: impl IntoIterator<Item = (&'static str, Reply)>) -> Self {
        Self {
            replies: replies.into_iter().collect(),
            broken: false,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// The reply recorded for the guest's next call, which must be `name`.
    /// `None` when the tape has run out (the call is made live).
    pub(crate) fn answer(&mut self, name: &'static str) -> Option<Result<Reply, ()>> {
        let (recorded, reply) = self.replies.pop_front()?;
        if recorded != name {
            self.broken = true;
            return Some(Err(()));
        }
        Some(Ok(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Key {
        Key::Reply(Reply::Str(format!("/page/{i}")))
    }

    #[test]
    fn children_grow_past_their_first_table_and_keep_every_key() {
        let node = Node::<()>::new(Step::Start);
        for i in 0..5000 {
            let (_, added, _) = node.children.insert(
                hash(&key(i)),
                key(i),
                Arc::new(Node::<()>::new(Step::Opaque)),
            );
            assert!(added, "{i}");
        }
        for i in 0..5000 {
            assert!(node.child(&key(i)).is_some(), "{i}");
        }
        assert!(node.child(&key(5000)).is_none());
        // A second insert of a key keeps the first node.
        let first = node.child(&key(7)).expect("present");
        let (kept, added, _) = node.children.insert(
            hash(&key(7)),
            key(7),
            Arc::new(Node::<()>::new(Step::Opaque)),
        );
        assert!(!added);
        assert!(Arc::ptr_eq(&kept, &first));
    }

    /// Starts `n` requests on this thread's shard, each costing what
    /// `cost` says for its way; returns how many started live.
    fn run_requests(memo: &Memo<()>, n: usize, cost: impl Fn(Way) -> u64) -> usize {
        let mut live = 0;
        for _ in 0..n {
            let (start, chosen) = memo.start();
            let chosen = chosen.expect("measured memo chooses");
            assert_eq!(start.is_none(), chosen.way == Way::Live);
            live += usize::from(chosen.way == Way::Live);
            if chosen.measured {
                memo.spent(chosen, cost(chosen.way));
            }
        }
        live
    }

    #[test]
    fn requests_take_the_way_that_costs_less_and_keep_trying_the_other() {
        let memo = Memo::<()>::new(1 << 20, true);
        // Live costs less (a compiled policy on a long tail): nearly every
        // request runs live, one in TRY_OTHER_WAY still walks the trees.
        let first = run_requests(
            &memo,
            1000,
            |way| if way == Way::Live { 2_000 } else { 5_000 },
        );
        assert!(first > 900, "{first}");
        let live = run_requests(
            &memo,
            3200,
            |way| if way == Way::Live { 2_000 } else { 5_000 },
        );
        assert_eq!(live, 3200 - 3200 / TRY_OTHER_WAY as usize);
        assert_eq!(memo.stats().unreplayed as usize, first + live);
        // The traffic changes (one popular URL): walking becomes cheaper,
        // which the requests that still walk measure, and the thread
        // turns back.
        run_requests(
            &memo,
            4000,
            |way| if way == Way::Live { 2_000 } else { 500 },
        );
        let live = run_requests(
            &memo,
            3200,
            |way| if way == Way::Live { 2_000 } else { 500 },
        );
        assert_eq!(live, 3200 / TRY_OTHER_WAY as usize);
        // A preempted request does not swing the average far.
        let before = memo.shards[shard_index(memo.shards.len())].cost[Way::Replay as usize]
            .load(Ordering::Relaxed);
        memo.spent(
            Chosen {
                shard: shard_index(memo.shards.len()),
                way: Way::Replay,
                measured: true,
            },
            50_000_000,
        );
        let after = memo.shards[shard_index(memo.shards.len())].cost[Way::Replay as usize]
            .load(Ordering::Relaxed);
        assert!(
            after <= before + before * COST_OUTLIER / (1 << COST_SHIFT),
            "{before} -> {after}"
        );
    }

    #[test]
    fn a_way_that_costs_far_more_is_tried_less_often() {
        let memo = Memo::<()>::new(1 << 20, true);
        let cost = |way| if way == Way::Live { 80_000 } else { 2_000 };
        run_requests(&memo, 4096, cost);
        let live = run_requests(&memo, 2560, cost);
        assert_eq!(live, 2560 / TRY_OTHER_WAY_FAR as usize);
    }

    #[test]
    fn walks_that_cost_far_more_are_still_tried_one_in_32_and_win_back() {
        let memo = Memo::<()>::new(1 << 20, true);
        let shard = shard_index(memo.shards.len());
        // The first walk recorded its path (an interpreted policy's first
        // request): one dear measurement, then walks at 2 us. The first
        // measurements weigh more, so the average comes down in a few.
        let chosen = |way| Chosen {
            shard,
            way,
            measured: true,
        };
        memo.spent(chosen(Way::Replay), 400_000);
        for _ in 0..9 {
            memo.spent(chosen(Way::Replay), 2_000);
        }
        let average = memo.shards[shard].cost[Way::Replay as usize].load(Ordering::Relaxed);
        assert!(average < 45_000, "{average}");
        // Walking far dearer than live (walks that leave the paths and
        // record): tried one in 32 still, not one in 256.
        let dear = |way| if way == Way::Live { 40_000 } else { 400_000 };
        run_requests(&memo, 32 * 64, dear);
        let live = run_requests(&memo, 320, dear);
        assert_eq!(live, 320 - 320 / TRY_OTHER_WAY as usize);
        // Then the paths answer: the tried walks turn the thread back.
        let cheap = |way| if way == Way::Live { 40_000 } else { 2_000 };
        run_requests(&memo, 32 * 64, cheap);
        let live = run_requests(&memo, 2560, cheap);
        assert!(live <= 2560 / TRY_OTHER_WAY as usize, "{live}");
    }

    #[test]
    fn without_measuring_every_request_walks() {
        let memo = Memo::<()>::new(1 << 20, false);
        for _ in 0..100 {
            let (start, chosen) = memo.start();
            assert!(start.is_some() && chosen.is_none());
        }
        memo.disable();
        let memo_on = Memo::<()>::new(1 << 20, true);
        memo_on.disable();
        assert!(matches!(memo.start(), (None, None)));
        assert!(matches!(memo_on.start(), (None, None)));
    }

    #[test]
    fn concurrent_recordings_of_the_same_keys_leave_one_node_each() {
        let node = Node::<()>::new(Step::Start);
        let winners: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..2000)
                            .filter(|&i| {
                                let n = Arc::new(Node::<()>::new(Step::Opaque));
                                node.children.insert(hash(&key(i)), key(i), n).1
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        let mut all: Vec<usize> = winners.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..2000).collect::<Vec<_>>(),
            "each key added exactly once"
        );
        for i in 0..2000 {
            assert!(node.child(&key(i)).is_some());
        }
    }

    #[test]
    fn a_tape_answers_in_order_and_notices_a_different_call() {
        let mut tape = Tape::new([
            ("request.url", Reply::Str("/a".into())),
            ("log.write", Reply::Unit),
        ]);
        assert_eq!(
            tape.answer("request.url"),
            Some(Ok(Reply::Str("/a".into())))
        );
        assert_eq!(tape.answer("request.header"), Some(Err(())));
        assert!(tape.broken);
        assert!(tape.is_empty());
        assert_eq!(tape.answer("request.url"), None);
    }
}

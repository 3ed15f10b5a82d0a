//! A loaded policy generation (compiled, linked, pre-instantiated), the
//! per-thread handle its requests hold, and in `state` and `instance` what
//! one request runs in: its store's state and its live instance. These
//! types refer to one another (a policy pre-instantiates for the store
//! state, the state holds the request's handle, the handle keeps ready
//! instances), so they are one module; loading lives above them in
//! `load`, the request's calls in `call`.

pub(crate) mod instance;
pub(crate) mod state;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use self::instance::LiveCall;
use self::state::{Memo, StoreState};
use crate::bindings::{Policy, PolicyIndices};
use crate::engine::{EPOCH_TICK, IdleInstances, PolicyEngine};
use crate::errors::{Hook, PolicyError};
use crate::limits::PolicyLimits;
use crate::memo::{MemoStats, shard_count, shard_index};
use crate::services::PolicyServices;

/// Where a policy comes from and what it is given (one `[policy]` section
/// of the host config).
#[derive(Clone, Debug)]
pub struct PolicySource {
    /// The `.wasm` file: a component, or a core module carrying
    /// wit-bindgen's component-type section.
    pub path: PathBuf,
    /// Settings served to the guest by the `config` interface.
    pub config: BTreeMap<String, String>,
    /// Per-request limits.
    pub limits: PolicyLimits,
    /// The policy's name: its kv namespace and its name in logs.
    pub name: String,
    /// Snapshot the policy after one synthetic request at load, so that
    /// requests start from a warm instance (see `runtime::prewarm`).
    pub prewarm: bool,
    /// Bytes of recorded paths kept to answer requests without an
    /// instance (see `runtime::memo`); 0 runs every request live.
    pub memo_bytes: usize,
    /// With recorded paths: a request runs live without walking them when
    /// on its worker thread that cost less lately, as measured (a compiled
    /// policy on a site with a long tail of URLs); `false` walks them for
    /// every request.
    pub replay_measured: bool,
    /// Keep one instance per worker thread made ahead of the request that
    /// will need it, so that a request does not wait for instantiation
    /// (CPython's takes 0.4 ms). Each spare holds a slot of the pool.
    pub pre_instantiate: bool,
    /// Requests one instance serves, one after another on a worker
    /// thread, before a fresh one replaces it; 1 gives every request a
    /// fresh instance of the snapshot (nothing a request leaves in the
    /// guest's memory is seen by another). Above 1 a request may see what
    /// earlier ones left in the guest's globals.
    pub requests_per_instance: u32,
    /// How long one instance serves requests at most, from its
    /// instantiation.
    pub instance_lifetime: Duration,
}

/// How far one instance is reused ([`PolicySource::requests_per_instance`],
/// [`PolicySource::instance_lifetime`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reuse {
    pub(crate) requests: u32,
    pub(crate) lifetime: Duration,
}

impl Reuse {
    fn of(source: &PolicySource) -> Self {
        Self {
            requests: source.requests_per_instance.max(1),
            lifetime: source.instance_lifetime,
        }
    }
}

/// How a policy generation's requests got their instances, for logs,
/// metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceStats {
    /// Requests that started with the policy.
    pub requests: u64,
    /// Requests that ran guest code: at least one hook ran in an instance
    /// (not replayed from recorded paths, nor a hook the policy does not
    /// implement, which the host runs itself).
    pub ran_guest: u64,
    /// Instances created: for requests, ahead of them, and the one that
    /// checks the policy at load.
    pub instantiated: u64,
    /// Times a request took an instance an earlier request had used.
    pub reused: u64,
}

/// One worker thread's counts of [`InstanceStats`]; aligned to two cache
/// lines so that threads counting their requests never share one.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct UseCounts {
    pub(crate) requests: AtomicU64,
    pub(crate) ran_guest: AtomicU64,
    pub(crate) instantiated: AtomicU64,
    pub(crate) reused: AtomicU64,
}

/// The bit of `hook` in [`LoadedInner::builtin`].
fn hook_bit(hook: Hook) -> u8 {
    match hook {
        Hook::Instantiate => 0,
        Hook::OnRequest => 1,
        Hook::OnBackendResponse => 2,
        Hook::OnDeliver => 4,
    }
}

/// What every request of one loaded policy shares.
pub(crate) struct PolicyShared {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) config: BTreeMap<String, String>,
    pub(crate) limits: PolicyLimits,
    pub(crate) generation: u64,
}

/// A compiled, linked and pre-instantiated policy. Cloning is cheap; a
/// request keeps its clone for its whole life, so a reload never pulls a
/// policy from under a request.
#[derive(Clone)]
pub struct LoadedPolicy {
    inner: Arc<LoadedInner>,
}

struct LoadedInner {
    shared: Arc<PolicyShared>,
    /// The linked component and where its exports are.
    pre: InstancePre<StoreState>,
    indices: PolicyIndices,
    engine: PolicyEngine,
    /// Started from a warm snapshot.
    prewarmed: bool,
    /// This generation's recorded paths; `None` when replay is off.
    memo: Option<Arc<Memo>>,
    /// Whether requests keep an instance made ahead (see [`PolicyHandle`]).
    pre_instantiate: bool,
    /// How far an instance is reused.
    reuse: Reuse,
    /// Instances a request found made ahead.
    started_ahead: AtomicU64,
    /// Per worker thread: how requests got their instances.
    counts: Box<[UseCounts]>,
    /// The hooks the policy does not implement (bits of [`hook_bit`]): its
    /// SDK said so when their default ran (`inlay:policy/sdk`). The host
    /// runs the built-in rules for them itself.
    builtin: AtomicU8,
}

fn new_counts() -> Box<[UseCounts]> {
    (0..shard_count()).map(|_| UseCounts::default()).collect()
}

impl std::fmt::Debug for LoadedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPolicy")
            .field("name", &self.inner.shared.name)
            .field("path", &self.inner.shared.path)
            .field("generation", &self.inner.shared.generation)
            .finish_non_exhaustive()
    }
}

/// Numbers loads, so logs can tell an old policy from its replacement.
/// The recorded paths of a new generation, unless `bytes` is 0.
fn new_memo(bytes: usize, measured: bool) -> Option<Arc<Memo>> {
    (bytes > 0).then(|| Arc::new(Memo::new(bytes, measured)))
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The least CPU time the load check's instantiation, and the warm-up
/// request's instantiation and hooks, get.
pub(crate) const LOAD_CHECK_CPU: std::time::Duration = std::time::Duration::from_secs(2);

fn linker(engine: &PolicyEngine) -> Result<Linker<StoreState>, PolicyError> {
    let mut linker = Linker::new(engine.engine());
    Policy::add_to_linker::<StoreState, HasSelf<StoreState>>(&mut linker, |state| state).map_err(
        |e| PolicyError::Instantiate {
            message: format!("cannot link the host's imports: {e:#}"),
        },
    )?;
    Ok(linker)
}

impl LoadedPolicy {
    /// Compiles a component binary, links it and pre-instantiates it.
    /// `prewarmed` says whether the component is a warm snapshot.
    pub(crate) fn compile_component(
        engine: &PolicyEngine,
        source: PolicySource,
        component_bytes: &[u8],
        prewarmed: bool,
        builtin: u8,
    ) -> Result<Self, PolicyError> {
        let path = source.path.clone();
        let _span =
            tracing::debug_span!("policy.compile", policy = %source.name, path = %path.display())
                .entered();
        let component = Component::from_binary(engine.engine(), component_bytes).map_err(|e| {
            PolicyError::Compile {
                path: path.clone(),
                message: format!("{e:#}"),
            }
        })?;
        let mismatch = |e: wasmtime::Error| PolicyError::WorldMismatch {
            path: path.clone(),
            message: format!("{e:#}"),
        };
        let instance_pre = linker(engine)?
            .instantiate_pre(&component)
            .map_err(mismatch)?;
        let indices = PolicyIndices::new(&instance_pre).map_err(mismatch)?;
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(policy = %source.name, generation, "policy compiled");
        let reuse = Reuse::of(&source);
        Ok(Self {
            inner: Arc::new(LoadedInner {
                shared: Arc::new(PolicyShared {
                    name: source.name,
                    path: source.path,
                    config: source.config,
                    limits: source.limits,
                    generation,
                }),
                pre: instance_pre,
                indices,
                engine: engine.clone(),
                prewarmed,
                memo: new_memo(source.memo_bytes, source.replay_measured),
                pre_instantiate: source.pre_instantiate,
                reuse,
                started_ahead: AtomicU64::new(0),
                counts: new_counts(),
                builtin: AtomicU8::new(builtin),
            }),
        })
    }

    /// What an instance is made from.
    pub(crate) fn parts(&self) -> (&wasmtime::Engine, &InstancePre<StoreState>, &PolicyIndices) {
        (
            self.inner.engine.engine(),
            &self.inner.pre,
            &self.inner.indices,
        )
    }

    /// The engine, whose pool every instance of the policy takes a slot of.
    pub fn engine(&self) -> &PolicyEngine {
        &self.inner.engine
    }

    pub(crate) fn shared(&self) -> &PolicyShared {
        &self.inner.shared
    }

    pub(crate) fn memo(&self) -> Option<&Memo> {
        self.inner.memo.as_deref()
    }

    /// How requests were answered: from recorded paths or by instances;
    /// `None` when replay is off.
    pub fn memo_stats(&self) -> Option<MemoStats> {
        self.inner.memo.as_ref().map(|memo| memo.stats())
    }

    /// The same compiled policy with another name, config and limits: a
    /// config-only reload needs no recompilation. A new generation.
    pub fn reconfigured(
        &self,
        name: String,
        config: BTreeMap<String, String>,
        limits: PolicyLimits,
    ) -> Result<Self, PolicyError> {
        limits.validate().map_err(PolicyError::InvalidLimits)?;
        Ok(Self {
            inner: Arc::new(LoadedInner {
                shared: Arc::new(PolicyShared {
                    name,
                    path: self.inner.shared.path.clone(),
                    config,
                    limits,
                    generation: GENERATION.fetch_add(1, Ordering::Relaxed),
                }),
                pre: self.inner.pre.clone(),
                indices: self.inner.indices.clone(),
                engine: self.inner.engine.clone(),
                prewarmed: self.inner.prewarmed,
                // New settings are new inputs: start with no paths.
                memo: self
                    .inner
                    .memo
                    .as_ref()
                    .and_then(|memo| new_memo(memo.max_bytes(), memo.measured())),
                pre_instantiate: self.inner.pre_instantiate,
                reuse: self.inner.reuse,
                started_ahead: AtomicU64::new(0),
                counts: new_counts(),
                // The same component: the same hooks are the SDK's defaults.
                builtin: AtomicU8::new(self.inner.builtin.load(Ordering::Relaxed)),
            }),
        })
    }

    /// The policy's name (its kv namespace).
    pub fn name(&self) -> &str {
        &self.inner.shared.name
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.shared.path
    }

    /// Its per-request limits.
    pub fn limits(&self) -> &PolicyLimits {
        &self.inner.shared.limits
    }

    /// Whether requests start from a warm snapshot.
    pub fn prewarmed(&self) -> bool {
        self.inner.prewarmed
    }

    /// How many requests of this generation found their instance made
    /// ahead (`pre_instantiate`).
    pub fn instances_started_ahead(&self) -> u64 {
        self.inner.started_ahead.load(Ordering::Relaxed)
    }

    /// A number that grows with every load, to tell reloads apart in logs.
    pub fn generation(&self) -> u64 {
        self.inner.shared.generation
    }

    /// How far one instance is reused.
    pub(crate) fn reuse(&self) -> Reuse {
        self.inner.reuse
    }

    /// Requests one instance serves at most (1: a fresh instance for each).
    pub fn requests_per_instance(&self) -> u32 {
        self.inner.reuse.requests
    }

    /// This worker thread's counts.
    pub(crate) fn counts(&self) -> &UseCounts {
        &self.inner.counts[shard_index(self.inner.counts.len())]
    }

    pub(crate) fn count_instantiation(&self) {
        self.counts().instantiated.fetch_add(1, Ordering::Relaxed);
    }

    /// How this generation's requests got their instances so far.
    pub fn instance_stats(&self) -> InstanceStats {
        let sum = |f: fn(&UseCounts) -> &AtomicU64| {
            self.inner
                .counts
                .iter()
                .map(|c| f(c).load(Ordering::Relaxed))
                .sum()
        };
        InstanceStats {
            requests: sum(|c| &c.requests),
            ran_guest: sum(|c| &c.ran_guest),
            instantiated: sum(|c| &c.instantiated),
            reused: sum(|c| &c.reused),
        }
    }

    /// Whether the host runs the built-in rules for `hook` itself: the
    /// policy's SDK said the policy does not implement it.
    pub(crate) fn runs_builtin(&self, hook: Hook) -> bool {
        self.inner.builtin.load(Ordering::Relaxed) & hook_bit(hook) != 0
    }

    /// The hooks whose SDK default ran (see [`LoadedPolicy::runs_builtin`]).
    pub(crate) fn builtin_hooks(&self) -> u8 {
        self.inner.builtin.load(Ordering::Relaxed)
    }

    /// Notes that the policy's SDK ran its default for `hook`: later
    /// requests get the built-in rules from the host, without an instance.
    pub(crate) fn learn_builtin(&self, hook: Hook) {
        let bit = hook_bit(hook);
        if self.inner.builtin.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            tracing::debug!(
                policy = %self.name(),
                hook = %hook,
                "the policy does not implement this hook; the host runs the built-in rules for it"
            );
        }
    }

    /// The hooks the policy implements itself, as the WIT names them
    /// (all three until its SDK says otherwise).
    pub fn implemented_hooks(&self) -> Vec<&'static str> {
        [Hook::OnRequest, Hook::OnBackendResponse, Hook::OnDeliver]
            .into_iter()
            .filter(|h| !self.runs_builtin(*h))
            .map(Hook::as_str)
            .collect()
    }
}

/// A policy generation with the host services its requests call: what a
/// request holds for its whole life (hooks, host calls and the recorded
/// paths all reach the policy through it).
///
/// [`PolicySlot::handle`] keeps one per worker thread and generation, so
/// the reference counts a request takes and drops stay on its own thread.
/// Shared counts (the slot's lock, the policy's, the services') cost 50 to
/// 100 ns per operation on these VMs when two cores take turns with them,
/// and a replayed request took eight of them.
pub struct PolicyHandle {
    policy: LoadedPolicy,
    services: Arc<dyn PolicyServices>,
    /// Instances ready for this handle's next requests, the most recent
    /// last: one made ahead (a spare, `pre_instantiate`) and, when the
    /// policy reuses instances, the ones its requests finished with.
    /// (Boxed: an instance moves between a request and this list as a
    /// pointer, not as the store's kilobytes.)
    #[allow(clippy::vec_box)]
    ready: Mutex<Vec<Box<LiveCall>>>,
    /// Set while a spare is being made.
    refilling: AtomicBool,
    /// Whether this handle keeps instances ready: only the long-lived
    /// handles ([`PolicyHandle::keeping_instances`], one per worker thread
    /// from [`PolicySlot::handle`]) do.
    keeps: bool,
    /// Whether the engine knows to take slots from `ready` when its pool
    /// is full.
    registered: AtomicBool,
    /// The handle the stores of the ready instances hold while they wait:
    /// this one holds them, and a cycle would keep both alive after a
    /// reload.
    idle: OnceLock<Arc<PolicyHandle>>,
}

/// Instances a handle keeps ready at most: a worker thread runs one
/// request's policy at a time, but requests that wait (on the backend, on
/// the cache) interleave, and each that comes back needs one.
const READY_MAX: usize = 4;

impl std::fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHandle")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PolicyHandle {
    /// `policy` with `services`, for requests to share. It keeps no
    /// instance between requests: each request's instance is its own.
    pub fn new(policy: LoadedPolicy, services: Arc<dyn PolicyServices>) -> Arc<Self> {
        Self::build(policy, services, false)
    }

    /// `policy` with `services`, for a caller that starts many requests
    /// with it, one after another (as [`PolicySlot::handle`] does for each
    /// worker thread): the handle keeps the instances its requests
    /// finished with for the next ones, when the policy reuses instances,
    /// and an instance made ahead when it pre-instantiates.
    pub fn keeping_instances(policy: LoadedPolicy, services: Arc<dyn PolicyServices>) -> Arc<Self> {
        Self::build(policy, services, true)
    }

    fn build(policy: LoadedPolicy, services: Arc<dyn PolicyServices>, keeps: bool) -> Arc<Self> {
        Arc::new(Self {
            policy,
            services,
            ready: Mutex::new(Vec::new()),
            refilling: AtomicBool::new(false),
            keeps,
            registered: AtomicBool::new(false),
            idle: OnceLock::new(),
        })
    }

    /// What the stores of this handle's ready instances hold meanwhile.
    fn idle_handle(&self) -> &Arc<PolicyHandle> {
        self.idle
            .get_or_init(|| PolicyHandle::new(self.policy.clone(), Arc::clone(&self.services)))
    }

    /// An instance ready for a request, if this handle keeps one that may
    /// still serve (reuse is bounded by age); the next spare is started in
    /// the background when the policy pre-instantiates and the request
    /// takes the last one without giving it back.
    pub(crate) fn take_ready(self: &Arc<Self>) -> Option<Box<LiveCall>> {
        if !self.keeps {
            return None;
        }
        let reuse = self.policy.reuse();
        let mut ready = self.ready.lock();
        let mut expired = Vec::new();
        let taken = loop {
            match ready.pop() {
                Some(live) if live.age() >= reuse.lifetime => expired.push(live),
                other => break other,
            }
        };
        let empty = ready.is_empty();
        drop(ready);
        drop(expired);
        if let Some(live) = &taken {
            let counts = self.policy.counts();
            if live.served() == 0 {
                self.policy
                    .inner
                    .started_ahead
                    .fetch_add(1, Ordering::Relaxed);
            } else {
                counts.reused.fetch_add(1, Ordering::Relaxed);
            }
        }
        // A reused instance comes back when its request ends; a fresh one
        // does not, nor is one there when nothing was ready.
        let comes_back = taken.as_ref().is_some_and(|_| reuse.requests > 1);
        if self.policy.inner.pre_instantiate && empty && !comes_back {
            self.refill();
        }
        taken
    }

    /// Takes the request's state out of `live` and keeps the instance
    /// ready for this handle's next request when it may serve another
    /// (the policy reuses instances, it is within its bounds, nothing went
    /// wrong in it, and no request is waiting in line for a pool slot);
    /// otherwise it is dropped and its slot returns to the pool. Returns
    /// the request's state.
    pub(crate) fn give_back(self: &Arc<Self>, mut live: Box<LiveCall>) -> StoreState {
        if !self.keeps_instance(&live) {
            return live.into_state();
        }
        let state = live.detach(|| StoreState::new(Arc::clone(self.idle_handle()), EPOCH_TICK));
        let mut ready = self.ready.lock();
        if ready.len() < READY_MAX {
            ready.push(live);
            drop(ready);
            self.register();
        }
        state
    }

    /// Whether `live` may wait here for another of this handle's requests.
    fn keeps_instance(&self, live: &LiveCall) -> bool {
        let reuse = self.policy.reuse();
        self.keeps
            && live.served() < reuse.requests
            && live.age() < reuse.lifetime
            && live.reusable()
            && !self.policy.engine().has_waiters()
    }

    /// Lets the engine take slots from this handle's ready instances.
    fn register(self: &Arc<Self>) {
        if !self.registered.load(Ordering::Relaxed)
            && !self.registered.swap(true, Ordering::Relaxed)
        {
            let weak: Weak<dyn IdleInstances> = Arc::downgrade(self) as Weak<dyn IdleInstances>;
            self.policy.engine().register_idle(weak);
        }
    }

    /// How many instances are ready.
    #[cfg(test)]
    pub(crate) fn ready_count(&self) -> usize {
        self.ready.lock().len()
    }

    /// Whether an instance made ahead is waiting.
    #[cfg(test)]
    pub(crate) fn has_spare(&self) -> bool {
        self.ready.lock().iter().any(|live| live.served() == 0)
    }

    /// Makes the next spare on the runtime, off the request's path. Its
    /// store holds the idle handle, not this one (see `idle`).
    fn refill(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let handle = Arc::clone(self);
        runtime.spawn(async move {
            let own = Arc::clone(handle.idle_handle());
            match LiveCall::start_ahead(StoreState::new(own, EPOCH_TICK)).await {
                Ok(Some(live)) => {
                    let mut ready = handle.ready.lock();
                    if ready.len() < READY_MAX {
                        // Below the ones given back: those are taken first.
                        ready.insert(0, live);
                        drop(ready);
                        handle.register();
                    }
                }
                Ok(None) => tracing::debug!("no instance made ahead: the pool is full"),
                // The pool is full, or the guest failed to start: the next
                // request instantiates (and reports the error) itself.
                Err((e, _)) => tracing::debug!(error = %e, "no instance made ahead"),
            }
            handle.refilling.store(false, Ordering::Release);
        });
    }

    /// The policy generation.
    pub fn policy(&self) -> &LoadedPolicy {
        &self.policy
    }

    pub(crate) fn services(&self) -> &dyn PolicyServices {
        &*self.services
    }

    /// Whether this handle's requests call `services`.
    pub(crate) fn serves_with(&self, services: &Arc<dyn PolicyServices>) -> bool {
        Arc::ptr_eq(&self.services, services)
    }
}

impl IdleInstances for PolicyHandle {
    fn idle_count(&self) -> usize {
        self.ready.lock().len()
    }

    fn drop_one_idle(&self) -> bool {
        // The oldest: the most recent is the likeliest to be taken next.
        let dropped = {
            let mut ready = self.ready.lock();
            (!ready.is_empty()).then(|| ready.remove(0))
        };
        dropped.is_some()
    }
}

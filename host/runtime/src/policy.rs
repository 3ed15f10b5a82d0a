//! Loading a policy: read the file, turn a core module into a component if
//! needed, compile once, link against the host's imports and
//! pre-instantiate; and the hot-swappable slot that holds the current one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::bindings::{Policy, PolicyIndices};
use crate::call::PolicyCall;
use crate::compact::compact_data_segments;
use crate::engine::{EPOCH_TICK, IdleInstances, PolicyEngine};
use crate::errors::{Hook, PolicyError};
use crate::instance::LiveCall;
use crate::limits::{CpuClock, PolicyLimits};
use crate::memo::{MemoStats, shard_count, shard_index};
use crate::prewarm;
use crate::services::{NoServices, PolicyServices};
use crate::state::{Memo, StoreState};

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

/// What the first bytes of a `.wasm` file say it is.
#[derive(Debug, PartialEq, Eq)]
enum WasmKind {
    Component,
    CoreModule,
}

fn wasm_kind(bytes: &[u8]) -> Option<WasmKind> {
    match bytes.get(..8)? {
        [0, b'a', b's', b'm', 1, 0, 0, 0] => Some(WasmKind::CoreModule),
        // Component binaries use version 0x0d and layer 1.
        [0, b'a', b's', b'm', _, _, 1, 0] => Some(WasmKind::Component),
        _ => None,
    }
}

/// Turns a core module with wit-bindgen's component-type section into a
/// component.
fn componentize(module: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(module)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|e| format!("cannot make a component of this core module: {e:#}"))
}

fn linker(engine: &PolicyEngine) -> Result<Linker<StoreState>, PolicyError> {
    let mut linker = Linker::new(engine.engine());
    Policy::add_to_linker::<StoreState, HasSelf<StoreState>>(&mut linker, |state| state).map_err(
        |e| PolicyError::Instantiate {
            message: format!("cannot link the host's imports: {e:#}"),
        },
    )?;
    Ok(linker)
}

/// The component in `bytes`: as it is, or made from a core module.
fn to_component<'a>(
    path: &Path,
    bytes: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>, PolicyError> {
    let compile_err = |message: String| PolicyError::Compile {
        path: path.to_path_buf(),
        message,
    };
    match wasm_kind(bytes) {
        Some(WasmKind::Component) => Ok(std::borrow::Cow::Borrowed(bytes)),
        Some(WasmKind::CoreModule) => Ok(std::borrow::Cow::Owned(
            componentize(bytes).map_err(compile_err)?,
        )),
        None => Err(compile_err(
            "not a WebAssembly file (no `\\0asm` header)".to_string(),
        )),
    }
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

    /// Reads, compiles and links a policy and, if `source.prewarm`,
    /// replaces it with its warm snapshot. Blocking (compilation takes tens
    /// of milliseconds to seconds): prefer [`LoadedPolicy::load`] on an
    /// async runtime.
    pub fn compile(engine: &PolicyEngine, source: PolicySource) -> Result<Self, PolicyError> {
        source
            .limits
            .validate()
            .map_err(PolicyError::InvalidLimits)?;
        let path = source.path.clone();
        let bytes = std::fs::read(&path).map_err(|e| PolicyError::Io {
            path: path.clone(),
            source: e,
        })?;
        let component = to_component(&path, &bytes)?;
        if !source.prewarm {
            let component = compact_data_segments(&component);
            return Self::compile_component(engine, source, &component, false, 0);
        }
        let started = std::time::Instant::now();
        let warm = prewarm::snapshot(engine, &source, &component);
        let fallback = match warm {
            Ok((snapshot, builtin)) => {
                let snapshot = compact_data_segments(&snapshot);
                match Self::compile_component(engine, source.clone(), &snapshot, true, builtin) {
                    Ok(policy) => {
                        tracing::info!(
                            policy = %source.name,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "policy pre-warmed"
                        );
                        return Ok(policy);
                    }
                    Err(e) => e.to_string(),
                }
            }
            Err(e) => e,
        };
        // The policy itself must still load; only then is the lost
        // optimisation worth a warning.
        let component = compact_data_segments(&component);
        let policy = Self::compile_component(engine, source, &component, false, 0)?;
        tracing::warn!(
            policy = %policy.name(),
            reason = %fallback,
            "policy not pre-warmed; every request starts a cold instance"
        );
        Ok(policy)
    }

    /// Compiles the policy on a blocking thread, then instantiates it once
    /// to prove that it starts; only then is it returned.
    pub async fn load(engine: &PolicyEngine, source: PolicySource) -> Result<Self, PolicyError> {
        let engine2 = engine.clone();
        let policy = tokio::task::spawn_blocking(move || Self::compile(&engine2, source))
            .await
            .map_err(|e| PolicyError::Instantiate {
                message: format!("the compile task failed: {e}"),
            })??;
        // Instantiate once now, so that a policy that cannot start is
        // refused at load rather than on its first request. This is not a
        // request: a machine busy building or deploying may deschedule it
        // for longer than a request's budget (CPU time is counted as wall
        // time while the guest runs), so it gets at least LOAD_CHECK_CPU;
        // start code that loops is still refused.
        let handle = PolicyHandle::new(policy.clone(), Arc::new(NoServices));
        let mut state = StoreState::new(handle, EPOCH_TICK);
        let budget = policy.shared().limits.cpu_time().max(LOAD_CHECK_CPU);
        state.clock = CpuClock::new(budget, EPOCH_TICK);
        LiveCall::start_new(state).await.map_err(|(e, _)| e)?;
        tracing::info!(
            policy = %policy.name(),
            path = %policy.path().display(),
            generation = policy.generation(),
            prewarmed = policy.prewarmed(),
            "policy loaded"
        );
        Ok(policy)
    }

    /// Creates one request's instance: a fresh store from the pool, with
    /// its limits, instantiated from the pre-instantiated component.
    pub async fn start(
        &self,
        services: Arc<dyn PolicyServices>,
    ) -> Result<PolicyCall, PolicyError> {
        PolicyHandle::new(self.clone(), services).start().await
    }

    /// Starts a request that runs its own instance from the first hook,
    /// without the recorded paths (for the snapshot tool and tests).
    pub(crate) async fn start_live(
        &self,
        services: Arc<dyn PolicyServices>,
    ) -> Result<PolicyCall, PolicyError> {
        PolicyCall::start(PolicyHandle::new(self.clone(), services), false).await
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

/// The current policy, replaceable while requests run.
///
/// A request takes [`PolicySlot::current`] once and uses that policy for
/// all its hooks; [`PolicySlot::reload`] swaps in a new one only after it
/// compiled and instantiated, so a bad file never replaces a good policy
/// and no request is dropped. The engine (and its instance pool) is the
/// current policy's: a reload to another `max_instances` brings a new one.
pub struct PolicySlot {
    current: RwLock<LoadedPolicy>,
    /// `current`'s generation, read without the lock by [`PolicySlot::handle`].
    generation: AtomicU64,
    /// Tells this slot's handles from other slots' in a thread's cache.
    id: u64,
    /// The worker threads' handles of the current generation. Threads
    /// cache them weakly, so that a replaced generation (its spares, and
    /// its engine when the pool was resized) goes when its last request
    /// ends, not at each thread's next request.
    handles: Mutex<CurrentHandles>,
}

/// The handles [`PolicySlot::handle`] made for one generation.
struct CurrentHandles {
    generation: u64,
    held: Vec<Arc<PolicyHandle>>,
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

    /// Starts one request: hooks may be answered from the policy's
    /// recorded paths; the instance is created when one is needed.
    pub async fn start(self: &Arc<Self>) -> Result<PolicyCall, PolicyError> {
        PolicyCall::start(Arc::clone(self), true).await
    }

    /// The policy generation.
    pub fn policy(&self) -> &LoadedPolicy {
        &self.policy
    }

    pub(crate) fn services(&self) -> &dyn PolicyServices {
        &*self.services
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

// Per worker thread: the handles of the slots it served (slot id,
// generation, handle), held by the slot while their generation is current
// and by their requests.
thread_local! {
    static HANDLES: std::cell::RefCell<Vec<(u64, u64, Weak<PolicyHandle>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl std::fmt::Debug for PolicySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySlot")
            .field("current", &*self.current.read())
            .finish_non_exhaustive()
    }
}

impl PolicySlot {
    /// Loads the first policy.
    pub async fn load(engine: &PolicyEngine, source: PolicySource) -> Result<Self, PolicyError> {
        static SLOTS: AtomicU64 = AtomicU64::new(0);
        let policy = LoadedPolicy::load(engine, source).await?;
        Ok(Self {
            generation: AtomicU64::new(policy.generation()),
            handles: Mutex::new(CurrentHandles {
                generation: policy.generation(),
                held: Vec::new(),
            }),
            current: RwLock::new(policy),
            id: SLOTS.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Loads `source` and, if it compiles and instantiates, makes it the
    /// current policy. On error the old policy stays and the error says why.
    ///
    /// When `source.limits.max_instances` differs from the running pool's
    /// size, the policy is loaded on a new engine of that size
    /// ([`PolicyError::Engine`] if it cannot be made); requests in flight
    /// finish on the old engine, which is freed when the last of them ends.
    pub async fn reload(&self, source: PolicySource) -> Result<LoadedPolicy, PolicyError> {
        let running = self.current().engine().clone();
        let loaded = match source.limits.max_instances {
            n if n == running.max_instances() => LoadedPolicy::load(&running, source).await,
            _ => match PolicyEngine::new(&source.limits) {
                Ok(resized) => LoadedPolicy::load(&resized, source).await,
                Err(e) => Err(e),
            },
        };
        drop(running);
        let policy = match loaded {
            Ok(policy) => policy,
            Err(e) => {
                tracing::warn!(error = %e, "policy reload refused; keeping the current policy");
                return Err(e);
            }
        };
        let old = {
            let mut current = self.current.write();
            self.generation
                .store(policy.generation(), Ordering::Relaxed);
            std::mem::replace(&mut *current, policy.clone())
        };
        // Let the replaced generation's handles go with their requests.
        let replaced = std::mem::replace(
            &mut *self.handles.lock(),
            CurrentHandles {
                generation: policy.generation(),
                held: Vec::new(),
            },
        );
        drop(replaced);
        if !old.engine().same(policy.engine()) {
            tracing::info!(
                policy = %policy.name(),
                max_instances = policy.engine().max_instances(),
                replaced = old.engine().max_instances(),
                "policy instance pool resized; the old pool is freed when its last request ends"
            );
        }
        tracing::info!(
            policy = %policy.name(),
            generation = policy.generation(),
            replaced = old.generation(),
            "policy reloaded"
        );
        Ok(policy)
    }

    /// The policy new requests should use.
    pub fn current(&self) -> LoadedPolicy {
        self.current.read().clone()
    }

    /// The current policy with `services`, as this thread's requests
    /// share it (see [`PolicyHandle`]). A request keeps the handle it got:
    /// a reload affects the requests that start after it.
    pub fn handle(&self, services: &Arc<dyn PolicyServices>) -> Arc<PolicyHandle> {
        let generation = self.generation.load(Ordering::Relaxed);
        self.cached_handle(generation, services, || self.current())
    }

    /// `policy` (one this slot loaded, current or not) with `services`, as
    /// this thread's requests share it: [`PolicySlot::handle`] for a
    /// caller that pinned a policy generation, as the host's config
    /// generations do, so that a request started on one generation keeps
    /// its policy while the slot moves on.
    pub fn handle_of(
        &self,
        policy: &LoadedPolicy,
        services: &Arc<dyn PolicyServices>,
    ) -> Arc<PolicyHandle> {
        self.cached_handle(policy.generation(), services, || policy.clone())
    }

    fn cached_handle(
        &self,
        generation: u64,
        services: &Arc<dyn PolicyServices>,
        policy: impl FnOnce() -> LoadedPolicy,
    ) -> Arc<PolicyHandle> {
        HANDLES.with(|handles| {
            let mut handles = handles.borrow_mut();
            let found = handles
                .iter()
                .filter(|(slot, g, _)| *slot == self.id && *g == generation)
                .filter_map(|(_, _, h)| h.upgrade())
                .find(|h| Arc::ptr_eq(&h.services, services));
            if let Some(h) = found {
                return h;
            }
            let policy = policy();
            // A reload between reading `generation` and `policy()` may have
            // given a newer policy: key the handle by the one it has.
            let generation = policy.generation();
            let handle = {
                let mut current = self.handles.lock();
                if current.generation == generation {
                    let handle = PolicyHandle::keeping_instances(policy, Arc::clone(services));
                    current.held.push(Arc::clone(&handle));
                    handle
                } else {
                    // A replaced generation, pinned by requests in flight:
                    // it lives as long as they do, with no instance kept
                    // for requests that will not come.
                    PolicyHandle::new(policy, Arc::clone(services))
                }
            };
            handles.retain(|(_, _, h)| h.strong_count() > 0);
            handles.push((self.id, generation, Arc::downgrade(&handle)));
            handle
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasm_kind_reads_the_header() {
        assert_eq!(
            wasm_kind(b"\0asm\x01\0\0\0rest"),
            Some(WasmKind::CoreModule)
        );
        assert_eq!(wasm_kind(b"\0asm\x0d\0\x01\0"), Some(WasmKind::Component));
        assert_eq!(wasm_kind(b"\0asm"), None);
        assert_eq!(wasm_kind(b"garbage garbage"), None);
    }
}

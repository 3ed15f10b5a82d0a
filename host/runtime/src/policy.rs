//! Loading a policy: read the file, turn a core module into a component if
//! needed, compile once, link against the host's imports and
//! pre-instantiate; and the hot-swappable slot that holds the current one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::bindings::{Policy, PolicyIndices};
use crate::call::PolicyCall;
use crate::compact::compact_data_segments;
use crate::engine::{EPOCH_TICK, PolicyEngine};
use crate::errors::PolicyError;
use crate::instance::LiveCall;
use crate::limits::{CpuClock, PolicyLimits};
use crate::memo::MemoStats;
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
    /// Keep one instance per worker thread made ahead of the request that
    /// will need it, so that a request does not wait for instantiation
    /// (CPython's takes 0.4 ms). Each spare holds a slot of the pool.
    pub pre_instantiate: bool,
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
    /// Instances a request found made ahead.
    started_ahead: AtomicU64,
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
fn new_memo(bytes: usize) -> Option<Arc<Memo>> {
    (bytes > 0).then(|| Arc::new(Memo::new(bytes)))
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The least CPU time the load check's instantiation gets.
const LOAD_CHECK_CPU: std::time::Duration = std::time::Duration::from_secs(2);

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
                memo: new_memo(source.memo_bytes),
                pre_instantiate: source.pre_instantiate,
                started_ahead: AtomicU64::new(0),
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
            return Self::compile_component(engine, source, &component, false);
        }
        let started = std::time::Instant::now();
        let warm = prewarm::snapshot(engine, &source, &component);
        let fallback = match warm {
            Ok(snapshot) => {
                let snapshot = compact_data_segments(&snapshot);
                match Self::compile_component(engine, source.clone(), &snapshot, true) {
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
        let policy = Self::compile_component(engine, source, &component, false)?;
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
                    .and_then(|memo| new_memo(memo.max_bytes())),
                pre_instantiate: self.inner.pre_instantiate,
                started_ahead: AtomicU64::new(0),
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
    /// An instance made ahead for this thread's next live request.
    spare: Mutex<Option<LiveCall>>,
    /// Set while a spare is being made.
    refilling: AtomicBool,
    /// Whether this handle keeps a spare: only the long-lived handles of
    /// [`PolicySlot::handle`] do, when the policy pre-instantiates.
    keeps_spare: bool,
}

impl std::fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHandle")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PolicyHandle {
    /// `policy` with `services`, for requests to share.
    pub fn new(policy: LoadedPolicy, services: Arc<dyn PolicyServices>) -> Arc<Self> {
        Self::with_spare(policy, services, false)
    }

    /// `policy` with `services`, for a caller that starts many requests
    /// with it (as [`PolicySlot::handle`] does for each worker thread):
    /// when the policy pre-instantiates, the handle keeps an instance made
    /// ahead for its next request.
    pub fn keeping_spare(policy: LoadedPolicy, services: Arc<dyn PolicyServices>) -> Arc<Self> {
        let keeps_spare = policy.inner.pre_instantiate;
        Self::with_spare(policy, services, keeps_spare)
    }

    fn with_spare(
        policy: LoadedPolicy,
        services: Arc<dyn PolicyServices>,
        keeps_spare: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            policy,
            services,
            spare: Mutex::new(None),
            refilling: AtomicBool::new(false),
            keeps_spare,
        })
    }

    /// The instance made ahead, if there is one; the next one is started
    /// in the background either way (when this handle keeps a spare).
    pub(crate) fn take_spare(self: &Arc<Self>) -> Option<LiveCall> {
        if !self.keeps_spare {
            return None;
        }
        let spare = self.spare.lock().take();
        if spare.is_some() {
            self.policy
                .inner
                .started_ahead
                .fetch_add(1, Ordering::Relaxed);
        }
        self.refill();
        spare
    }

    /// Whether an instance made ahead is waiting.
    #[cfg(test)]
    pub(crate) fn has_spare(&self) -> bool {
        self.spare.lock().is_some()
    }

    /// Makes the next spare on the runtime, off the request's path. The
    /// spare's store holds a handle of its own (same policy and services),
    /// not this one: this one holds the spare, and a cycle would keep both
    /// alive after a reload.
    fn refill(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let handle = Arc::clone(self);
        runtime.spawn(async move {
            let own = PolicyHandle::new(handle.policy.clone(), Arc::clone(&handle.services));
            match LiveCall::start_ahead(StoreState::new(own, EPOCH_TICK)).await {
                Ok(Some(live)) => *handle.spare.lock() = Some(live),
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
                    let handle = PolicyHandle::keeping_spare(policy, Arc::clone(services));
                    current.held.push(Arc::clone(&handle));
                    handle
                } else {
                    // A replaced generation, pinned by requests in flight:
                    // it lives as long as they do, with no spare made for
                    // requests that will not come.
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

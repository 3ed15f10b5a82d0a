//! Loading a policy: read the file, turn a core module into a component if
//! needed, snapshot it warm, compile and link it, and prove that it starts;
//! and the hot-swappable slot that holds the current one.

use std::path::Path;
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::compact::compact_data_segments;
use crate::engine::{EPOCH_TICK, PolicyEngine};
use crate::errors::PolicyError;
use crate::limits::CpuClock;
use crate::policy::instance::LiveCall;
use crate::policy::state::StoreState;
use crate::policy::{LOAD_CHECK_CPU, LoadedPolicy, PolicyHandle, PolicySource};
use crate::prewarm;
use crate::services::{NoServices, PolicyServices};

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
                .find(|h| h.serves_with(services));
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

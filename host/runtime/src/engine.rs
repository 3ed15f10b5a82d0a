//! The wasmtime engine shared by every policy generation of one pool size:
//! pooling allocator, copy-on-write memory images, epoch interruption, and
//! the thread that ticks the epoch. A reload to another `max_instances`
//! makes a new engine; the old one goes with its last policy.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::errors::PolicyError;
use crate::limits::PolicyLimits;

/// How often the epoch advances: the granularity of CPU deadlines.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Core instances, memories and tables a policy component may contain.
/// A Rust component made by wit-component has three core instances (the
/// module and two shims), one memory and two tables; componentize-py's
/// dynamically linked CPython has 38 core instances. Core instances are
/// only counted by the pool (no memory is reserved for them), so the
/// total is generous; memories and tables reserve address space per slot.
const CORE_INSTANCES_PER_COMPONENT: u32 = 64;
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 4;

/// The compiled-code engine and its epoch ticker. Cheap to clone; the
/// ticker stops when the last clone is dropped.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: Engine,
    max_instances: u32,
    /// One permit per slot of the pool: a store is only created with one,
    /// so a request that finds the pool full queues here (first come,
    /// first served) instead of failing in the allocator.
    slots: Arc<Semaphore>,
    /// Requests waiting in line for a slot now: an instance a request
    /// finished with goes back to the pool for them rather than being kept
    /// for reuse.
    waiting: AtomicUsize,
    /// Whoever keeps idle instances of this engine (the worker threads'
    /// policy handles): a request that finds the pool full takes a slot
    /// from one of them before it waits in line.
    idle: Mutex<Vec<Weak<dyn IdleInstances>>>,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
    /// Milliseconds since the engine started, as the ticker last read its
    /// clock: a clock for instance ages that costs a load, not a clock
    /// read, per request.
    now_ms: Arc<AtomicU64>,
    /// The compiled-code cache, kept to read its hit count in tests.
    #[cfg_attr(not(test), allow(dead_code))]
    cache: Option<wasmtime::Cache>,
}

/// A holder of idle instances (ready for its next requests) that can give
/// their slots back to the pool when another request needs one.
pub(crate) trait IdleInstances: Send + Sync {
    /// How many it holds now.
    fn idle_count(&self) -> usize;
    /// Drops one of them (its slot returns to the pool); whether it had one.
    fn drop_one_idle(&self) -> bool;
}

/// Counts a request waiting in line for a slot while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

impl std::fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("max_instances", &self.inner.max_instances)
            .finish_non_exhaustive()
    }
}

impl PolicyEngine {
    /// Creates the engine. `limits.max_instances` sizes the instance pool
    /// (concurrent requests running a policy); the other limits are read
    /// per policy, so reloads may change them.
    pub fn new(limits: &PolicyLimits) -> Result<Self, PolicyError> {
        Self::with_async(limits, false)
    }

    /// An engine whose components may use component-model async
    /// (`async` exports, streams and futures: a `wasi:http/service` 0.3
    /// component) when `async_components` is true. Policies never do: their
    /// stores then carry none of the state concurrent execution needs.
    pub(crate) fn with_async(
        limits: &PolicyLimits,
        async_components: bool,
    ) -> Result<Self, PolicyError> {
        limits.validate().map_err(PolicyError::InvalidLimits)?;
        let n = limits.max_instances;
        let engine_err = |message: String| PolicyError::Engine {
            max_instances: n,
            message,
        };
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
            .total_memories(n.saturating_mul(MEMORIES_PER_COMPONENT))
            .total_tables(n.saturating_mul(TABLES_PER_COMPONENT))
            .total_stacks(n)
            .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(MEMORIES_PER_COMPONENT)
            .max_tables_per_component(TABLES_PER_COMPONENT)
            .max_tables_per_module(TABLES_PER_COMPONENT)
            // Slots keep their CoW image mapped for the next request of the
            // same policy; only dirtied pages are reset: PAGEMAP_SCAN finds
            // them (Linux 6.7+) and up to 4 MiB of them are zeroed with
            // memset rather than unmapped and faulted in again (10 us per
            // request against 14 us with either off). JS and Python
            // requests dirty less than 1 MiB (no faster with 64 MiB); the
            // bound keeps what an idle slot holds small, since every slot
            // a burst of requests used keeps its pages (a slot a guest
            // filled to its 64 MiB cap would otherwise keep all of it).
            .pagemap_scan(wasmtime::Enabled::Auto)
            .linear_memory_keep_resident(4 << 20)
            .table_keep_resident(1 << 20);
        let mut config = Config::new();
        config
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            .memory_init_cow(true)
            .epoch_interruption(true)
            .wasm_component_model(true);
        // 0.3 component backends: async exports, streams and futures.
        config.concurrency_support(async_components);
        if async_components {
            config.wasm_component_model_async(true);
        }
        // `INLAY_PERF_MAP=1` writes /tmp/perf-PID.map so `perf report` names
        // the policy's functions.
        if std::env::var_os("INLAY_PERF_MAP").is_some_and(|v| v == "1") {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        // Compiled code is cached on disk (~/.cache/wasmtime), keyed by the
        // wasm's hash and the compiler's settings (not the pool's size): a
        // restart or a reload of an unchanged 15 MB JS or Python component
        // skips the seconds-long compile, on a resized engine too.
        let cache = match wasmtime::Cache::new(wasmtime::CacheConfig::new()) {
            Ok(cache) => Some(cache),
            Err(e) => {
                tracing::warn!(error = %e, "compiled-code cache unavailable; policies compile at every load");
                None
            }
        };
        config.cache(cache.clone());
        let engine = Engine::new(&config)
            .map_err(|e| engine_err(format!("cannot create the wasm engine: {e:#}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let now_ms = Arc::new(AtomicU64::new(0));
        let ticker = spawn_ticker(engine.weak(), Arc::clone(&stop), Arc::clone(&now_ms))
            .map_err(|e| engine_err(format!("cannot start the epoch thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(EngineInner {
                engine,
                max_instances: n,
                slots: Arc::new(Semaphore::new(usize::try_from(n).unwrap_or(usize::MAX))),
                waiting: AtomicUsize::new(0),
                idle: Mutex::new(Vec::new()),
                stop,
                ticker: Some(ticker),
                now_ms,
                cache,
            }),
        })
    }

    /// The wasmtime engine.
    pub(crate) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Time since the engine started, to the last epoch tick (a little
    /// behind when the ticker thread waits for a CPU).
    pub(crate) fn coarse_now(&self) -> Duration {
        Duration::from_millis(self.inner.now_ms.load(Ordering::Relaxed))
    }

    /// The size of the instance pool.
    pub fn max_instances(&self) -> u32 {
        self.inner.max_instances
    }

    /// Whether `self` and `other` are the same engine (and pool).
    pub fn same(&self, other: &PolicyEngine) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A reference that does not keep the engine alive, to see when its
    /// pool and ticker are gone.
    #[cfg(test)]
    pub(crate) fn downgrade(&self) -> WeakEngine {
        WeakEngine {
            inner: Arc::downgrade(&self.inner),
            engine: self.inner.engine.weak(),
        }
    }

    /// Compiled components this engine found in the on-disk cache.
    #[cfg(test)]
    pub(crate) fn cache_hits(&self) -> usize {
        self.inner
            .cache
            .as_ref()
            .map_or(0, wasmtime::Cache::cache_hits)
    }

    /// Instances that could be created now without waiting: free slots,
    /// and slots held by idle instances kept for reuse (a request that
    /// needs one takes it from them).
    pub fn free_instances(&self) -> usize {
        let idle: usize = self
            .inner
            .idle
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .map(|holder| holder.idle_count())
            .sum();
        self.inner.slots.available_permits() + idle
    }

    /// Lets a request that finds the pool full take slots from `holder`'s
    /// idle instances.
    pub(crate) fn register_idle(&self, holder: Weak<dyn IdleInstances>) {
        let mut idle = self.inner.idle.lock();
        idle.retain(|h| h.strong_count() > 0);
        idle.push(holder);
    }

    /// Whether requests are waiting in line for a slot.
    pub(crate) fn has_waiters(&self) -> bool {
        self.inner.waiting.load(Ordering::Relaxed) > 0
    }

    /// Drops one idle instance kept for reuse, so that its slot returns to
    /// the pool; whether there was one.
    fn reclaim_idle(&self) -> bool {
        let holders: Vec<_> = self
            .inner
            .idle
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        holders.iter().any(|holder| holder.drop_one_idle())
    }

    /// A slot of the pool for one store, waiting up to `wait` in line for
    /// one to be returned when all are in use.
    pub(crate) async fn slot(&self, wait: Duration) -> Result<OwnedSemaphorePermit, PolicyError> {
        let exhausted = || PolicyError::PoolExhausted {
            waited: wait,
            max_instances: self.inner.max_instances,
        };
        if let Ok(permit) = Arc::clone(&self.inner.slots).try_acquire_owned() {
            return Ok(permit);
        }
        // Idle instances kept for reuse give way to a request.
        while self.reclaim_idle() {
            if let Ok(permit) = Arc::clone(&self.inner.slots).try_acquire_owned() {
                return Ok(permit);
            }
        }
        if wait.is_zero() {
            return Err(exhausted());
        }
        let _waiting = Waiting::new(&self.inner.waiting);
        tracing::debug!(
            wait_ms = wait.as_millis() as u64,
            "policy pool full; queued"
        );
        match tokio::time::timeout(wait, Arc::clone(&self.inner.slots).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout is the pool staying full.
            _ => Err(exhausted()),
        }
    }

    /// A slot of the pool if one is free now (for instances made ahead,
    /// which must not take a slot a request is waiting for).
    pub(crate) fn slot_now(&self) -> Option<OwnedSemaphorePermit> {
        if self.inner.slots.available_permits() == 0 {
            return None;
        }
        Arc::clone(&self.inner.slots).try_acquire_owned().ok()
    }
}

/// A [`PolicyEngine`] that may be gone (see [`PolicyEngine::downgrade`]).
#[cfg(test)]
pub(crate) struct WeakEngine {
    inner: std::sync::Weak<EngineInner>,
    engine: wasmtime::EngineWeak,
}

#[cfg(test)]
impl WeakEngine {
    /// Whether anything still holds the engine: a policy, a store, an
    /// instance or a compiled component (its pool and ticker live on).
    pub(crate) fn is_alive(&self) -> bool {
        self.inner.strong_count() > 0 || self.engine.upgrade().is_some()
    }
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until told to stop,
/// and keeps `now_ms` (see [`PolicyEngine::coarse_now`]).
fn spawn_ticker(
    engine: wasmtime::EngineWeak,
    stop: Arc<AtomicBool>,
    now_ms: Arc<AtomicU64>,
) -> std::io::Result<JoinHandle<()>> {
    let started = std::time::Instant::now();
    std::thread::Builder::new()
        .name("inlay-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                now_ms.store(ms, Ordering::Relaxed);
                match engine.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minor page faults taken by this thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage writes one `rusage` into the zeroed value.
        #[allow(unsafe_code)]
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
            usage
        };
        usage.ru_minflt
    }

    /// A guest that writes to many pages far apart (as CPython's allocator
    /// does) must find its memory resident again in the next request's
    /// instance: the slot is reset by copying, not unmapped and faulted back
    /// in. wasmtime 48 stopped its dirty-page scan after 32 regions and
    /// decommitted the rest; `vendor/wasmtime` resumes the scan.
    #[test]
    fn a_reused_slot_keeps_memory_dirtied_in_many_places_resident() {
        const PAGES: u32 = 200;
        let engine = PolicyEngine::new(&PolicyLimits::default()).expect("engine");
        // 200 writes, one every other 64 KiB wasm page: 200 disjoint regions.
        let wat = format!(
            r#"(module
                (memory {pages})
                (data (i32.const 0) "an image, so the memory is copy-on-write")
                (func (export "dirty")
                    (local $i i32)
                    (loop $next
                        (i32.store (i32.mul (local.get $i) (i32.const 131072)) (local.get $i))
                        (local.set $i (i32.add (local.get $i) (i32.const 1)))
                        (br_if $next (i32.lt_u (local.get $i) (i32.const {PAGES}))))))"#,
            pages = PAGES * 2,
        );
        let module = wasmtime::Module::new(engine.engine(), wat).expect("module");
        let run = || {
            let mut store = wasmtime::Store::new(engine.engine(), ());
            store.set_epoch_deadline(1_000_000);
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
            instance
                .get_typed_func::<(), ()>(&mut store, "dirty")
                .expect("dirty")
                .call(&mut store, ())
                .expect("runs");
        };
        run();
        let before = minor_faults();
        for _ in 0..10 {
            run();
        }
        let per_run = (minor_faults() - before) / 10;
        assert!(
            per_run < i64::from(PAGES / 4),
            "{per_run} page faults per instance for {PAGES} dirtied pages"
        );
    }

    /// A request must never see what an earlier request wrote in the same
    /// pool slot. The first instance dirties 96 disjoint 64 KiB regions,
    /// 6 MiB in all: more regions than `vendor/wasmtime`'s PAGEMAP_SCAN
    /// buffer holds and more bytes than `linear_memory_keep_resident`, so
    /// the reset copies the first 32 regions back, resumes the scan for the
    /// next 32 (the patched path) and decommits the rest. Each region also
    /// holds some of the data image, which must come back. (Without
    /// PAGEMAP_SCAN, before Linux 6.7, it checks wasmtime's plain reset.)
    #[test]
    fn a_reused_slot_reads_only_its_image_where_a_previous_request_wrote() {
        /// Regions one scan reports (`MAX_REGIONS` in the patched pagemap.rs).
        const SCAN_REGIONS: usize = 32;
        /// `linear_memory_keep_resident` in `PolicyEngine::new`.
        const KEEP_RESIDENT: usize = 4 << 20;
        const DIRTIED: usize = 64 << 10;
        const STRIDE: usize = 2 * DIRTIED;
        const RESIDENT_REGIONS: usize = KEEP_RESIDENT / DIRTIED;
        const REGIONS: usize = RESIDENT_REGIONS + SCAN_REGIONS;
        const IMAGE_AT: usize = 1000;
        const _: () = assert!(RESIDENT_REGIONS > SCAN_REGIONS && REGIONS > RESIDENT_REGIONS);
        let engine = PolicyEngine::new(&PolicyLimits::default()).expect("engine");
        let image = |region: usize| format!("image of region {region:02}");
        let data: String = (0..REGIONS)
            .map(|k| {
                format!(
                    "(data (i32.const {}) \"{}\")\n",
                    k * STRIDE + IMAGE_AT,
                    image(k)
                )
            })
            .collect();
        let wat = format!(
            r#"(module
                (memory (export "memory") {pages})
                {data}
                (func (export "dirty")
                    (local $at i32)
                    (loop $next
                        (memory.fill (local.get $at) (i32.const 0xa5) (i32.const {DIRTIED}))
                        (local.set $at (i32.add (local.get $at) (i32.const {STRIDE})))
                        (br_if $next (i32.lt_u (local.get $at) (i32.const {end}))))))"#,
            pages = REGIONS * STRIDE / (64 << 10),
            end = REGIONS * STRIDE,
        );
        let module = wasmtime::Module::new(engine.engine(), wat).expect("module");
        let mut expected = vec![0u8; REGIONS * STRIDE];
        for k in 0..REGIONS {
            let at = k * STRIDE + IMAGE_AT;
            expected[at..at + image(k).len()].copy_from_slice(image(k).as_bytes());
        }

        let mut slot = None;
        // The first round checks `expected` against a fresh slot.
        for round in 0..3 {
            let mut store = wasmtime::Store::new(engine.engine(), ());
            store.set_epoch_deadline(1_000_000);
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
            let memory = instance.get_memory(&mut store, "memory").expect("memory");
            let base = memory.data_ptr(&store).addr();
            assert_eq!(
                *slot.get_or_insert(base),
                base,
                "round {round} got another slot"
            );
            if let Some(at) = memory
                .data(&store)
                .iter()
                .zip(&expected)
                .position(|(got, want)| got != want)
            {
                let region = at / STRIDE;
                let reset_by = match region {
                    ..SCAN_REGIONS => "the first scan",
                    SCAN_REGIONS..RESIDENT_REGIONS => "the resumed scan",
                    _ => "decommit",
                };
                panic!(
                    "round {round}: byte {at} (region {region}, reset by {reset_by}) reads {:#04x}, not {:#04x}",
                    memory.data(&store)[at],
                    expected[at]
                );
            }
            instance
                .get_typed_func::<(), ()>(&mut store, "dirty")
                .expect("dirty")
                .call(&mut store, ())
                .expect("runs");
        }
    }

    /// Funcrefs made while element segments are applied to an imported
    /// table (as in CPython's dynamically linked component) come from
    /// `vendor/wasmtime`'s per-module table of code offsets rather than
    /// upstream's lookups: each table entry must call its own function, of
    /// its own instance, and functions that never escape must be skipped.
    #[test]
    fn funcrefs_placed_in_a_shared_table_call_their_own_function_and_instance() {
        const FUNCS: usize = 300;
        let engine = PolicyEngine::new(&PolicyLimits::default()).expect("engine");
        let mut funcs = String::new();
        let mut elems = String::new();
        for i in 0..FUNCS {
            // A function that is never placed in the table between each
            // pair that are: it has no array-call trampoline.
            funcs.push_str(&format!(
                "(func $hidden{i} (result i32) (i32.const -1))
                 (func $f{i} (result i32) (i32.add (global.get $mine) (i32.const {i})))\n"
            ));
            elems.push_str(&format!(" $f{i}"));
        }
        let wat = format!(
            r#"(module
                (import "env" "table" (table {size} funcref))
                (import "env" "base" (global $base i32))
                (import "env" "tag" (global $tag i32))
                (global $mine i32 (global.get $tag))
                {funcs}
                (elem (global.get $base) func{elems})
                (func (export "call") (param i32) (result i32)
                    (call_indirect (result i32) (local.get 0)))
                (export "last" (func $f{last})))"#,
            size = 2 * FUNCS,
            last = FUNCS - 1,
        );
        let module = wasmtime::Module::new(engine.engine(), wat).expect("module");
        for _ in 0..2 {
            let mut store = wasmtime::Store::new(engine.engine(), ());
            store.set_epoch_deadline(1_000_000);
            let table_ty =
                wasmtime::TableType::new(wasmtime::RefType::FUNCREF, 2 * FUNCS as u32, None);
            let table = wasmtime::Table::new(&mut store, table_ty, wasmtime::Ref::Func(None))
                .expect("table");
            let global = |store: &mut wasmtime::Store<()>, value: i32| {
                let ty =
                    wasmtime::GlobalType::new(wasmtime::ValType::I32, wasmtime::Mutability::Const);
                wasmtime::Global::new(store, ty, wasmtime::Val::I32(value)).expect("global")
            };
            let mut instances = Vec::new();
            for (tag, base) in [(1000, 0), (2000, FUNCS as i32)] {
                let imports = [
                    table.into(),
                    global(&mut store, base).into(),
                    global(&mut store, tag).into(),
                ];
                instances.push(
                    wasmtime::Instance::new(&mut store, &module, &imports).expect("instantiates"),
                );
            }
            let call = instances[0]
                .get_typed_func::<i32, i32>(&mut store, "call")
                .expect("call");
            for slot in 0..2 * FUNCS {
                let expected = if slot < FUNCS {
                    1000 + slot
                } else {
                    2000 + slot - FUNCS
                };
                let got = call.call(&mut store, slot as i32).expect("calls");
                assert_eq!(got, expected as i32, "table slot {slot}");
            }
            for (instance, tag) in instances.iter().zip([1000, 2000]) {
                let last = instance
                    .get_typed_func::<(), i32>(&mut store, "last")
                    .expect("last");
                assert_eq!(
                    last.call(&mut store, ()).expect("calls"),
                    tag + FUNCS as i32 - 1
                );
            }
        }
    }
}

//! What one request may cost a policy: CPU time, memory, host calls and
//! subrequests; and the two store hooks that enforce the first two (the
//! epoch-deadline clock and the memory limiter).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// Per-request limits for a policy (`[policy.limits]` in the host config).
///
/// Every field has a default, so an empty table is valid. Durations are in
/// milliseconds and sizes in bytes so that the config stays plain TOML.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyLimits {
    /// CPU time one hook call (and instantiation) may use, in milliseconds.
    /// Time spent waiting for the host (cache, fetch) does not count.
    pub cpu_time_ms: u64,
    /// Linear memory one request's instance may use, in bytes (all memories
    /// of the component together).
    pub memory: u64,
    /// Host calls one request may make across all hooks.
    pub max_host_calls: u32,
    /// Subrequests (`fetch.send` / `fetch.send-many` entries) per request.
    pub max_subrequests: u32,
    /// Concurrent policy instances (stores) in the pooling allocator. Read
    /// when the engine is created: a reload to another value loads the
    /// policy on a new engine ([`crate::PolicySlot::reload`]).
    pub max_instances: u32,
    /// How long a request waits, in milliseconds, for a free instance when
    /// all `max_instances` are in use before it fails with a 503; 0 fails
    /// at once. Waiters are served first come, first served.
    pub instance_wait_ms: u64,
    /// How long one hook may wait in all on the host's I/O (cache, kv,
    /// fetch), in milliseconds; calls still waiting then fail as timed
    /// out. The instance is held while a hook waits, so this bounds how
    /// long a slow backend or store can keep it.
    pub host_wait_ms: u64,
    /// Largest kv key, in bytes.
    pub kv_max_key: usize,
    /// Largest kv value, in bytes.
    pub kv_max_value: usize,
    /// Longest log line a policy may write, in bytes; longer ones are cut.
    pub log_max_line: usize,
    /// Log lines one request's policy may write; later ones are dropped
    /// (with one warning saying so).
    pub log_max_lines: u32,
    /// Bytes of subrequest response bodies one request may buffer, all its
    /// subrequests together (`send-many` runs them in parallel, so each
    /// one's own cap is not enough); past it a fetch fails with
    /// `body-too-large`.
    pub max_subrequest_bytes: u64,
}

impl Default for PolicyLimits {
    fn default() -> Self {
        Self {
            cpu_time_ms: 50,
            memory: 64 << 20,
            max_host_calls: 10_000,
            max_subrequests: 32,
            max_instances: 1000,
            instance_wait_ms: 1000,
            host_wait_ms: 10_000,
            kv_max_key: 1024,
            kv_max_value: 1 << 20,
            log_max_line: 8 << 10,
            log_max_lines: 1000,
            max_subrequest_bytes: 16 << 20,
        }
    }
}

/// The longest [`PolicyLimits::host_wait_ms`] may be (an hour).
pub const MAX_HOST_WAIT_MS: u64 = 3_600_000;

impl PolicyLimits {
    /// The CPU budget of one hook call.
    pub fn cpu_time(&self) -> Duration {
        Duration::from_millis(self.cpu_time_ms)
    }

    /// How long a request waits for a free instance of a full pool.
    pub fn instance_wait(&self) -> Duration {
        Duration::from_millis(self.instance_wait_ms)
    }

    /// How long one hook may wait on the host's I/O in all.
    pub fn host_wait(&self) -> Duration {
        Duration::from_millis(self.host_wait_ms)
    }

    /// Checks the values a config could get wrong; returns every problem.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.cpu_time_ms == 0 {
            problems.push("cpu_time_ms must be at least 1".to_string());
        }
        if self.memory < 64 << 10 {
            problems.push("memory must be at least 65536 bytes (one wasm page)".to_string());
        }
        if self.host_wait_ms == 0 || self.host_wait_ms > MAX_HOST_WAIT_MS {
            problems.push(format!(
                "host_wait_ms must be between 1 and {MAX_HOST_WAIT_MS}"
            ));
        }
        if self.max_instances == 0 {
            problems.push("max_instances must be at least 1".to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// Caps linear memory and table growth of one store, and remembers whether
/// it refused a growth so that the trap that follows (a Rust guest aborts
/// when `alloc` fails) is reported as out-of-memory rather than a bug.
pub(crate) struct MemoryLimiter {
    pub(crate) cap: usize,
    pub(crate) used: usize,
    /// Set when a memory growth was refused.
    pub(crate) denied: bool,
}

/// Table elements a policy may have; generous for any real toolchain.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl MemoryLimiter {
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            used: 0,
            denied: false,
        }
    }
}

impl MemoryLimiter {
    /// Whether the memory counted is over half the cap: an instance that
    /// holds that much is not kept for another request, which could need
    /// as much again (and a guest that leaks a little per request would
    /// reach the cap with reuse and never without).
    pub(crate) fn over_half(&self) -> bool {
        self.used > self.cap / 2
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Count every memory of the store together: a component may have more
        // than one, and the cap is for the request, not per memory.
        let grow = desired.saturating_sub(current);
        let total = self.used.saturating_add(grow);
        if total > self.cap {
            self.denied = true;
            tracing::debug!(
                current,
                desired,
                cap = self.cap,
                "policy memory growth refused"
            );
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// Measures the guest's CPU time for one hook call with the epoch ticker.
///
/// The engine's epoch counts wall time, so time the guest spends waiting
/// for an async host call (a fetch, a cache lookup) or yielded to the
/// executor is recorded here and subtracted: a policy that waits 200 ms on
/// a subrequest has not used 200 ms of CPU.
///
/// Wall time also runs while the kernel has the thread off its CPU (other
/// threads, other processes: a config reload compiling a policy, a busy
/// neighbour), which is not the guest's either. So from the first yield
/// point on (after [`YIELD_EVERY_TICKS`] ticks), a hook that still runs is
/// measured with the thread's own CPU clock, segment by segment (each
/// segment ends at a deadline, a host call or a yield, and the next starts
/// where the guest resumes, on whatever thread that is). Hooks shorter than
/// the first yield, nearly all, never read that clock (a system call), nor
/// allocate what a yield shares with its future.
/// The first segment is charged at wall time, and a hook is also stopped
/// after [`WALL_BACKSTOP_FACTOR`] times its budget of wall time.
pub(crate) struct CpuClock {
    started: Instant,
    budget: Duration,
    tick: Duration,
    /// Nanoseconds spent awaiting the host (not running guest code).
    excluded: u64,
    /// What the yields of a hook past its first deadline share with their
    /// futures, which have no access to the store; made at the first one.
    shared: Option<Arc<YieldShared>>,
    /// Set when the budget ran out (the trap that follows is a timeout).
    pub(crate) expired: bool,
}

/// The part of a [`CpuClock`] its yield futures update.
#[derive(Default)]
pub(crate) struct YieldShared {
    /// Nanoseconds yielded to the executor (not running guest code).
    yielded: AtomicU64,
    /// CPU time measured per segment, once past the first yield.
    segments: Segments,
}

/// The guest's CPU time once it is measured with the thread clock.
#[derive(Default)]
pub(crate) struct Segments {
    /// Whether measuring has begun (at the first deadline of a hook call).
    on: AtomicBool,
    /// CPU nanoseconds charged so far.
    used: AtomicU64,
    /// The thread CPU clock where the running segment began; 0: none runs.
    start: AtomicU64,
}

impl Segments {
    /// Ends the running segment, charging it.
    fn close(&self) {
        let start = self.start.swap(0, Ordering::Relaxed);
        if start != 0 {
            let spent = thread_cpu_nanos().saturating_sub(start);
            self.used.fetch_add(spent, Ordering::Relaxed);
        }
    }

    /// The guest resumes on this thread.
    fn open(&self) {
        if self.on.load(Ordering::Relaxed) {
            self.start
                .store(thread_cpu_nanos().max(1), Ordering::Relaxed);
        }
    }
}

/// The calling thread's CPU time in nanoseconds (0 if unavailable).
#[allow(unsafe_code)]
fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives on our stack.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
    if !ok {
        return 0;
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// How often a running guest yields to the executor, in epoch ticks, so that
/// a busy policy shares its tokio worker with other tasks.
const YIELD_EVERY_TICKS: u64 = 5;

/// A hook is stopped after this many times its CPU budget in wall time
/// (host waits excluded), whatever its thread's CPU clock says: a backstop
/// for a thread that cannot run.
pub(crate) const WALL_BACKSTOP_FACTOR: u32 = 10;

/// An instant to start clocks from before their first hook: each hook
/// call restarts its clock from its own start.
pub(crate) fn clock_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl CpuClock {
    pub(crate) fn new(budget: Duration, tick: Duration) -> Self {
        Self {
            started: clock_origin(),
            budget,
            tick,
            excluded: 0,
            shared: None,
            expired: false,
        }
    }

    /// Starts a new budget (one per hook call) at `now`; returns the first
    /// deadline in ticks: the first yield point, or the budget if that
    /// comes first.
    pub(crate) fn restart(&mut self, now: Instant) -> u64 {
        self.started = now;
        self.excluded = 0;
        if let Some(shared) = &self.shared {
            shared.yielded.store(0, Ordering::Relaxed);
            let s = &shared.segments;
            s.on.store(false, Ordering::Relaxed);
            s.used.store(0, Ordering::Relaxed);
            s.start.store(0, Ordering::Relaxed);
        }
        self.expired = false;
        self.next_deadline(self.budget).min(YIELD_EVERY_TICKS)
    }

    /// A new budget at `now`: `more` beyond what the guest was charged so
    /// far, `pending` (time in the host not yet excluded) not counted as
    /// charged. An instance that serves several requests gets its budget
    /// this way at each one.
    pub(crate) fn extend(&mut self, more: Duration, pending: Duration, now: Instant) {
        let measured = self
            .shared
            .as_ref()
            .is_some_and(|s| s.segments.on.load(Ordering::Relaxed));
        let charged = if measured {
            self.charged()
        } else {
            self.used_at(now).saturating_sub(pending)
        };
        self.budget = charged.saturating_add(more);
        self.expired = false;
    }

    /// The epoch deadline, in ticks from now, for a guest that enters at
    /// `now` after it was idle (a component instance between its
    /// requests' guest code; `now` is the caller's clock read, which it
    /// also times the idle gap with): what is left of the budget, or the
    /// next yield point if that comes first. `None` once the thread clock
    /// measures it: its deadline stands. Without it, the deadline set at
    /// the last entry passes while the instance is idle, and the guest's
    /// next entry would take it for a long run (and read the thread clock
    /// at every host call from then on).
    pub(crate) fn resumed_at(&self, now: Instant) -> Option<u64> {
        let measured = self
            .shared
            .as_ref()
            .is_some_and(|s| s.segments.on.load(Ordering::Relaxed));
        if measured {
            return None;
        }
        let left = self.budget.saturating_sub(self.used_at(now));
        Some(self.next_deadline(left).min(YIELD_EVERY_TICKS))
    }

    /// The guest calls the host: the running CPU segment ends.
    pub(crate) fn host_call_starts(&self) {
        if let Some(shared) = &self.shared {
            shared.segments.close();
        }
    }

    /// Records time spent outside guest code (awaiting the host); the
    /// guest resumes.
    pub(crate) fn exclude(&mut self, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.excluded = self.excluded.saturating_add(nanos);
        if let Some(shared) = &self.shared {
            shared.segments.open();
        }
    }

    /// Guest time used in this hook call so far, at wall time (host waits
    /// and yields excluded).
    pub(crate) fn used(&self) -> Duration {
        self.used_at(Instant::now())
    }

    /// [`used`](Self::used) at `now`.
    fn used_at(&self, now: Instant) -> Duration {
        let yielded = self
            .shared
            .as_ref()
            .map_or(0, |s| s.yielded.load(Ordering::Relaxed));
        let excluded = Duration::from_nanos(self.excluded.saturating_add(yielded));
        now.saturating_duration_since(self.started)
            .saturating_sub(excluded)
    }

    /// Guest CPU time charged so far: wall time until the first yield,
    /// the thread's CPU clock after.
    fn charged(&self) -> Duration {
        match &self.shared {
            Some(shared) if shared.segments.on.load(Ordering::Relaxed) => {
                shared.segments.close();
                Duration::from_nanos(shared.segments.used.load(Ordering::Relaxed))
            }
            _ => self.used(),
        }
    }

    fn next_deadline(&self, remaining: Duration) -> u64 {
        // In 64 bits (584 years of nanoseconds): a 128-bit division is a
        // library call, and this runs at every entry into the guest.
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let tick_nanos = nanos(self.tick).max(1);
        // Round up, plus one: the current tick may be almost over already.
        nanos(remaining)
            .div_ceil(tick_nanos)
            .saturating_add(1)
            .max(1)
    }

    /// Called by the store when the epoch deadline is reached: trap if the
    /// budget is spent, otherwise yield to the executor and set the next
    /// deadline for what is left.
    pub(crate) fn on_deadline(&mut self) -> wasmtime::UpdateDeadline {
        let used = self.charged();
        let shared = Arc::clone(self.shared.get_or_insert_with(Arc::default));
        let s = &shared.segments;
        if !s.on.swap(true, Ordering::Relaxed) {
            // The first segment, at wall time; the thread clock from here on.
            s.used.store(
                u64::try_from(used.as_nanos()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        if used >= self.budget || self.used() >= self.budget * WALL_BACKSTOP_FACTOR {
            self.expired = true;
            return wasmtime::UpdateDeadline::Interrupt;
        }
        let next = self
            .next_deadline(self.budget - used)
            .min(YIELD_EVERY_TICKS);
        wasmtime::UpdateDeadline::YieldCustom(
            next,
            Box::pin(async move {
                // Time queued behind other tasks is not the guest's CPU time.
                let start = Instant::now();
                tokio::task::yield_now().await;
                let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                shared.yielded.fetch_add(nanos, Ordering::Relaxed);
                // The guest goes on from here, on this thread.
                shared.segments.open();
            }),
        )
    }
}

/// How many log lines one request's policy may still write.
pub(crate) struct LogQuota {
    written: u32,
    max: u32,
}

/// What to do with the next line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Write it.
    Write,
    /// Drop it, saying once that lines are being dropped.
    DropFirst,
    /// Drop it silently.
    Drop,
}

impl LogQuota {
    pub(crate) fn new(max: u32) -> Self {
        Self { written: 0, max }
    }

    pub(crate) fn admit(&mut self) -> Admit {
        let n = self.written;
        self.written = self.written.saturating_add(1);
        match n {
            n if n < self.max => Admit::Write,
            n if n == self.max => Admit::DropFirst,
            _ => Admit::Drop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn lines_past_the_quota_are_dropped_with_one_warning() {
        let mut q = LogQuota::new(3);
        for _ in 0..3 {
            assert_eq!(q.admit(), Admit::Write);
        }
        assert_eq!(q.admit(), Admit::DropFirst);
        for _ in 0..10_000 {
            assert_eq!(q.admit(), Admit::Drop);
        }
    }

    #[test]
    fn limits_parse_with_defaults_and_reject_unknown_fields() {
        let limits: PolicyLimits = toml::from_str("cpu_time_ms = 10").expect("parses");
        assert_eq!(limits.cpu_time(), Duration::from_millis(10));
        assert_eq!(limits.memory, 64 << 20);
        assert_eq!(limits.max_host_calls, 10_000);
        assert!(toml::from_str::<PolicyLimits>("cpu_time = 10").is_err());
        let bad = PolicyLimits {
            cpu_time_ms: 0,
            max_instances: 0,
            ..PolicyLimits::default()
        };
        let err = bad.validate().expect_err("two problems");
        assert!(
            err.contains("cpu_time_ms") && err.contains("max_instances"),
            "{err}"
        );
    }

    #[test]
    fn limiter_counts_all_memories_together() {
        let mut limiter = MemoryLimiter::new(10 << 20);
        assert!(limiter.memory_growing(0, 6 << 20, None).expect("no error"));
        assert!(!limiter.denied);
        // A second memory of 6 MiB would bring the store to 12 MiB.
        assert!(!limiter.memory_growing(0, 6 << 20, None).expect("no error"));
        assert!(limiter.denied);
        assert!(
            limiter
                .memory_growing(6 << 20, 10 << 20, None)
                .expect("no error")
        );
    }

    /// Runs the yield of a deadline, as the executor does before the guest
    /// resumes.
    fn resume(deadline: wasmtime::UpdateDeadline) {
        let wasmtime::UpdateDeadline::YieldCustom(_, yielding) = deadline else {
            panic!("expected a yield");
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(yielding);
    }

    /// Uses `cpu` of this thread's CPU time.
    fn spin(cpu: Duration) {
        let start = thread_cpu_nanos();
        let nanos = u64::try_from(cpu.as_nanos()).expect("fits");
        while thread_cpu_nanos() - start < nanos {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn clock_charges_guest_cpu_not_host_waits_nor_time_off_the_cpu() {
        let mut clock = CpuClock::new(Duration::from_millis(20), Duration::from_millis(1));
        // The first deadline is the first yield point.
        assert_eq!(clock.restart(Instant::now()), YIELD_EVERY_TICKS);
        let mut short = CpuClock::new(Duration::from_millis(2), Duration::from_millis(1));
        assert_eq!(short.restart(Instant::now()), 3);
        let started = Instant::now();
        clock.host_call_starts();
        std::thread::sleep(Duration::from_millis(30));
        // All of that was spent in the host: nothing is charged.
        clock.exclude(started.elapsed());
        assert!(clock.used() < Duration::from_millis(20));
        resume(clock.on_deadline());
        assert!(!clock.expired);
        // Off the CPU (another thread or process had it, as while a reload
        // compiles a policy on a busy machine): not the guest's time.
        std::thread::sleep(Duration::from_millis(40));
        resume(clock.on_deadline());
        assert!(!clock.expired, "time off the CPU was charged");
        // On the CPU past the budget: stopped.
        spin(Duration::from_millis(25));
        assert!(matches!(
            clock.on_deadline(),
            wasmtime::UpdateDeadline::Interrupt
        ));
        assert!(clock.expired);
    }

    #[test]
    fn a_hook_whose_thread_cannot_run_is_stopped_at_the_wall_backstop() {
        let budget = Duration::from_millis(2);
        let mut clock = CpuClock::new(budget, Duration::from_millis(1));
        clock.restart(Instant::now());
        resume(clock.on_deadline());
        std::thread::sleep(budget * WALL_BACKSTOP_FACTOR + Duration::from_millis(5));
        assert!(matches!(
            clock.on_deadline(),
            wasmtime::UpdateDeadline::Interrupt
        ));
        assert!(clock.expired);
    }

    #[test]
    fn a_guest_resuming_after_idle_gets_a_deadline_for_what_is_left() {
        let tick = Duration::from_millis(1);
        let mut clock = CpuClock::new(Duration::from_millis(20), tick);
        clock.restart(Instant::now());
        // Idle for longer than the first yield point: time out of guest
        // code is excluded, so the deadline is the next yield point again.
        std::thread::sleep(Duration::from_millis(8));
        clock.exclude(Duration::from_millis(8));
        assert_eq!(clock.resumed_at(Instant::now()), Some(YIELD_EVERY_TICKS));
        // Its budget spent: the deadline is the next tick.
        std::thread::sleep(Duration::from_millis(21));
        assert_eq!(clock.resumed_at(Instant::now()), Some(1));
        // Measured by the thread clock from its first deadline on: its
        // deadline stands.
        assert!(matches!(
            clock.on_deadline(),
            wasmtime::UpdateDeadline::Interrupt
        ));
        assert_eq!(clock.resumed_at(Instant::now()), None);
    }
}

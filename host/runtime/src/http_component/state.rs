//! One request's store data for a component backend: the WASI context
//! (environment, an optional read-only directory; no sockets, no
//! stdin), the `wasi:http` context with the outgoing hooks, the memory
//! cap and the CPU clock.
//!
//! The CPU clock runs while the guest runs, its calls into the host
//! included, and stops while it runs no code: between the host's calls
//! into it (a 0.3 instance waiting in its event loop, timed at each
//! entry and return), and while the task that runs the store is parked
//! during a call into the host (a blocking wait: an outgoing request, a
//! body write waiting on the client, a timer; [`Parks`]). The host's
//! other calls are short and on the guest's behalf: timing each of them
//! would read the clock twice per call, tens of times per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inlay_core::ComponentSettings;
use parking_lot::Mutex;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::outbound::OutboundHooks;
use super::p3::FailureCell;
use crate::limits::{CpuClock, MemoryLimiter, clock_origin};

/// The `T` of `Store<T>` for a component backend's instance: one request
/// (0.2), or the requests a 0.3 instance serves.
pub(crate) struct AppState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: OutboundHooks,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) clock: CpuClock,
    /// When the guest last returned to the host with no call into it left
    /// under way: it runs no code until the host calls it again.
    idle_since: Option<Instant>,
    /// Calls into the guest under way (1: the host called it; more: the
    /// host calls it back within a call of its own, as for `realloc`, or
    /// another of a 0.3 instance's tasks runs while one waits in a call).
    guest_depth: u32,
    /// Where the task that runs the store says it parked.
    pub(crate) parks: Arc<Parks>,
    /// What it wrote to stdout and stderr.
    pub(crate) output: GuestOutput,
    /// Where the failure of a 0.3 instance is told to its requests.
    pub(crate) failures: Vec<Arc<FailureCell>>,
}

impl AppState {
    pub(crate) fn new(
        settings: &ComponentSettings,
        hooks: OutboundHooks,
        tick: std::time::Duration,
    ) -> Result<Self, String> {
        let mut wasi = WasiCtx::builder();
        for (k, v) in &settings.env {
            wasi.env(k, v);
        }
        let output = GuestOutput::default();
        wasi.stdout(output.clone()).stderr(output.clone());
        if let Some(dir) = &settings.read_only_dir {
            wasi.preopened_dir(dir, "/", FsPerms::ReadOnly)
                .map_err(|e| format!("cannot open read_only_dir {}: {e:#}", dir.display()))?;
        }
        Ok(Self {
            table: ResourceTable::new(),
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            hooks,
            limiter: MemoryLimiter::new(settings.memory),
            clock: CpuClock::new(settings.cpu_time, tick),
            idle_since: None,
            guest_depth: 0,
            parks: Arc::default(),
            output,
            failures: Vec::new(),
        })
    }

    /// The outgoing hooks: the routes of its requests.
    pub(crate) fn hooks_mut(&mut self) -> &mut OutboundHooks {
        &mut self.hooks
    }

    /// The guest may run `more` from `now` (a 0.3 instance's new request,
    /// `more` its share for the requests it runs): the time it has been
    /// idle is not counted as the guest's.
    pub(crate) fn extend_cpu(&mut self, more: Duration, now: Instant) {
        let pending = self
            .idle_since
            .map_or_else(Default::default, |s| now.saturating_duration_since(s));
        self.clock.extend(more, pending, now);
    }

    /// The guest calls into the host.
    pub(crate) fn host_call_starts(&mut self) {
        // A park before this was an epoch yield, which the clock counts.
        self.parks.resumed();
        self.clock.host_call_starts();
    }

    /// The host returns to the guest: the time its task was parked in
    /// the call was not the guest's.
    pub(crate) fn host_call_ends(&mut self) {
        let parked = self.parks.resumed().unwrap_or_default();
        self.clock.exclude(parked);
    }

    /// The host calls into the guest: `Some(ticks)`, the epoch deadline to
    /// set, when the guest was idle (no call into it under way).
    pub(crate) fn guest_enters(&mut self) -> Option<u64> {
        self.guest_depth += 1;
        if self.guest_depth > 1 {
            self.host_call_ends();
            return None;
        }
        self.parks.busy.store(true, Ordering::Relaxed);
        // One clock read for the idle time and the deadline.
        let now = Instant::now();
        let idle = self
            .idle_since
            .take()
            .map(|s| now.saturating_duration_since(s));
        self.clock.exclude(idle.unwrap_or_default());
        self.clock.resumed_at(now)
    }

    /// A call into the guest returns.
    pub(crate) fn guest_returns(&mut self) {
        self.guest_depth = self.guest_depth.saturating_sub(1);
        self.host_call_starts();
        if self.guest_depth == 0 {
            self.parks.busy.store(false, Ordering::Relaxed);
            self.idle_since = Some(Instant::now());
        }
    }
}

/// When the task that runs a store last parked (its future was pending,
/// so no guest code ran) since the guest last ran: told by the task
/// ([`Parked`], or a 0.3 instance's worker), read by the store's hooks.
#[derive(Default)]
pub(crate) struct Parks {
    /// A call into the guest is under way: a park while none is falls in
    /// the guest's idle time, which its hooks time (and needs no clock
    /// read here).
    busy: AtomicBool,
    /// Nanoseconds from [`clock_origin`] to the first park since the
    /// guest last ran; 0: none.
    since: AtomicU64,
}

impl Parks {
    /// The task parks.
    pub(crate) fn parked(&self) {
        if self.busy.load(Ordering::Relaxed) && self.since.load(Ordering::Relaxed) == 0 {
            let nanos = u64::try_from(clock_origin().elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.since.store(nanos.max(1), Ordering::Relaxed);
        }
    }

    /// The guest runs again: how long ago the task first parked since it
    /// last ran, if it did.
    fn resumed(&self) -> Option<Duration> {
        // Read before it is cleared: a read is a plain load, a swap a
        // locked instruction, and most calls find no park.
        if self.since.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let since = self.since.swap(0, Ordering::Relaxed);
        (since != 0).then(|| {
            clock_origin()
                .elapsed()
                .saturating_sub(Duration::from_nanos(since))
        })
    }
}

/// A future that runs a store, telling its [`Parks`] each time it is
/// pending.
pub(crate) struct Parked<F> {
    inner: F,
    parks: Arc<Parks>,
}

impl<F> Parked<F> {
    pub(crate) fn new(inner: F, parks: Arc<Parks>) -> Self {
        Self { inner, parks }
    }
}

impl<F: Future + Unpin> Future for Parked<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let poll = std::pin::Pin::new(&mut self.inner).poll(cx);
        if poll.is_pending() {
            self.parks.parked();
        }
        poll
    }
}

impl WasiView for AppState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for AppState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// The most of a request's stdout and stderr kept for the log.
const OUTPUT_KEPT: usize = 8 << 10;

/// What a request's guest writes to stdout and stderr, together: the
/// first [`OUTPUT_KEPT`] bytes are kept for the log (a Python traceback, a
/// panic message), the rest dropped. Writes never fail nor wait.
#[derive(Clone, Default)]
pub(crate) struct GuestOutput(Arc<Mutex<Vec<u8>>>);

impl GuestOutput {
    /// What was kept, as text; empty when the guest wrote nothing.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock())
            .trim_end()
            .to_owned()
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl GuestOutput {
    fn keep(&self, bytes: &[u8]) {
        let mut kept = self.0.lock();
        let room = OUTPUT_KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.keep(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.keep(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

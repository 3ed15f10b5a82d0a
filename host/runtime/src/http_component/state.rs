//! One request's store data for a component backend: the WASI context
//! (environment, an optional read-only directory; no sockets, no
//! stdin), the `wasi:http` context with the outgoing hooks, the memory
//! cap and the CPU clock.

use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::outbound::OutboundHooks;
use super::settings::ComponentSettings;
use crate::limits::{CpuClock, MemoryLimiter};

/// The `T` of `Store<T>` for one request to a component backend.
pub(crate) struct AppState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: OutboundHooks,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) clock: CpuClock,
    /// When the guest's current call into the host began.
    host_since: Option<Instant>,
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
            host_since: None,
        })
    }

    /// The guest calls into the host: its CPU time stops.
    pub(crate) fn host_call_starts(&mut self) {
        self.clock.host_call_starts();
        self.host_since = Some(Instant::now());
    }

    /// The host returns to the guest: the time in between was not the
    /// guest's (an outgoing request, a body write waiting on the client,
    /// a timer).
    pub(crate) fn host_call_ends(&mut self) {
        if let Some(since) = self.host_since.take() {
            self.clock.exclude(since.elapsed());
        }
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

//! What a component backend (`[backends.NAME]` with `component =
//! "app.wasm"`) may do and use per request: its limits, its environment
//! and its files. Plain data: `inlay-config` reads and validates it from
//! the config file, the runtime (`inlay_runtime::http_component`) runs
//! requests with it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The settings of one component backend, read by every request. Each
/// field is the `[backends.NAME]` key of its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentSettings {
    /// CPU time one request may use (instantiation and `handle`
    /// together); time waiting on the host (outgoing requests, a slow
    /// client, timers) does not count.
    pub cpu_time: Duration,
    /// Linear memory one request's instance may use, all memories of the
    /// component together, in bytes.
    pub memory: u64,
    /// Instances running at once (the pool's size); read when the
    /// component is loaded.
    pub max_instances: u32,
    /// How long a request waits for an instance when all are in use.
    pub instance_wait: Duration,
    /// The longest one request may keep its instance, waits included (a
    /// guest waiting on a timer or a stalled stream is stopped then).
    pub request_timeout: Duration,
    /// Outgoing requests one request may make.
    pub max_subrequests: u32,
    /// Bytes of outgoing requests' response bodies one request may read,
    /// all together.
    pub max_subrequest_bytes: u64,
    /// The environment the guest sees (`wasi:cli/environment`;
    /// `[backends.NAME.env]`).
    pub env: BTreeMap<String, String>,
    /// A directory the guest may read, as `/`; none: no files at all.
    pub read_only_dir: Option<PathBuf>,
    /// Requests one instance of a 0.3 component serves before a new one
    /// replaces it; `None`: [`P3_REQUESTS_PER_INSTANCE`]. A 0.2
    /// component serves one (more is refused at load).
    pub requests_per_instance: Option<u32>,
    /// Requests one instance of a 0.3 component serves at once; `None`:
    /// [`P3_CONCURRENT_REQUESTS_PER_INSTANCE`].
    pub concurrent_requests_per_instance: Option<u32>,
    /// How long one instance of a 0.3 component accepts requests, from
    /// its instantiation.
    pub instance_lifetime: Duration,
}

/// Requests one 0.3 instance serves by default (`wasmtime serve`'s
/// default for 0.3 components).
pub const P3_REQUESTS_PER_INSTANCE: u32 = 128;

/// Requests one 0.3 instance serves at once by default (`wasmtime
/// serve`'s default).
pub const P3_CONCURRENT_REQUESTS_PER_INSTANCE: u32 = 16;

impl Default for ComponentSettings {
    fn default() -> Self {
        Self {
            cpu_time: Duration::from_secs(1),
            memory: 128 << 20,
            max_instances: 100,
            instance_wait: Duration::from_secs(1),
            request_timeout: Duration::from_secs(60),
            max_subrequests: 32,
            max_subrequest_bytes: 16 << 20,
            env: BTreeMap::new(),
            read_only_dir: None,
            requests_per_instance: None,
            concurrent_requests_per_instance: None,
            instance_lifetime: Duration::from_secs(60),
        }
    }
}

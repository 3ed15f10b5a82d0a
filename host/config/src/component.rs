//! `[backends.NAME]` with `component = "app.wasm"`: a backend that is a
//! `wasi:http` component served in-process, its limits, environment and
//! files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::read::{Reader, Table, Value, join};

/// What a component backend runs and may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentConfig {
    /// `component`: the `.wasm` file (a `wasi:http/proxy` 0.2 component).
    pub path: PathBuf,
    /// `cpu_time`: CPU time one request may use (host waits excluded).
    pub cpu_time: Duration,
    /// `memory`: linear memory one request's instance may use.
    pub memory: u64,
    /// `max_instances`: requests it serves at once (the instance pool).
    pub max_instances: u32,
    /// `instance_wait`: how long a request waits for a free instance.
    pub instance_wait: Duration,
    /// `request_timeout`: the longest one request may run, waits included.
    pub request_timeout: Duration,
    /// `max_subrequests`: outgoing requests one request may make.
    pub max_subrequests: u32,
    /// `max_subrequest_bytes`: response bytes one request's outgoing
    /// requests may read, together.
    pub max_subrequest_bytes: u64,
    /// `[backends.NAME.env]`: the guest's environment variables.
    pub env: BTreeMap<String, String>,
    /// `read_only_dir`: a directory the guest may read, as `/`.
    pub read_only_dir: Option<PathBuf>,
}

/// The longest a request may wait for an instance.
const MAX_INSTANCE_WAIT: Duration = Duration::from_secs(60);

/// Keys of an origin backend that mean nothing for a component.
const ORIGIN_ONLY: [&str; 9] = [
    "connect_timeout",
    "keepalive_timeout",
    "max_idle_connections",
    "http2",
    "probe",
    "ca_file",
    "client_cert",
    "client_key",
    "address",
];

impl ComponentConfig {
    /// `path` with every default.
    pub fn with_defaults(path: PathBuf) -> Self {
        Self {
            path,
            cpu_time: Duration::from_secs(1),
            memory: 128 << 20,
            max_instances: 100,
            instance_wait: Duration::from_secs(1),
            request_timeout: Duration::from_secs(60),
            max_subrequests: 32,
            max_subrequest_bytes: 16 << 20,
            env: BTreeMap::new(),
            read_only_dir: None,
        }
    }
}

impl Reader {
    /// The component settings of backend table `t` (at `p`), when it has a
    /// `component` key; the keys only an origin has are errors then.
    pub(super) fn component(&mut self, t: &Table, p: &str) -> Option<ComponentConfig> {
        let path = self.string(t, p, "component")?;
        for key in ORIGIN_ONLY {
            if self.get(t, p, key).is_some() {
                self.err(
                    join(p, key),
                    "not for a component backend (it has no address to connect to)",
                );
            }
        }
        if path.is_empty() {
            self.err(join(p, "component"), "expected the path of a .wasm file");
        }
        let d = ComponentConfig::with_defaults(PathBuf::from(&path));
        let instance_wait = self.duration(t, p, "instance_wait", d.instance_wait);
        if instance_wait > MAX_INSTANCE_WAIT {
            self.err(
                join(p, "instance_wait"),
                format!("{instance_wait:?} is above the limit of {MAX_INSTANCE_WAIT:?}"),
            );
        }
        let memory = self.size(t, p, "memory", d.memory);
        if memory < 64 << 10 {
            self.err(join(p, "memory"), "at least 64KiB (one WebAssembly page)");
        }
        let mut env = BTreeMap::new();
        if let Some(et) = self.table(t, p, "env") {
            for (k, v) in et {
                match v {
                    Value::String(s) => {
                        env.insert(k.clone(), s.clone());
                    }
                    Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => {
                        env.insert(k.clone(), v.to_string());
                    }
                    v => self.err(
                        format!("{}.{k}", join(p, "env")),
                        format!("expected a string, number or boolean, got {v}"),
                    ),
                }
            }
        }
        Some(ComponentConfig {
            path: d.path.clone(),
            cpu_time: self.positive_duration(t, p, "cpu_time", d.cpu_time),
            memory,
            max_instances: self.uint(t, p, "max_instances", d.max_instances.into(), 1, 100_000)
                as u32,
            instance_wait: instance_wait.min(MAX_INSTANCE_WAIT),
            request_timeout: self.positive_duration(t, p, "request_timeout", d.request_timeout),
            max_subrequests: self.uint(t, p, "max_subrequests", d.max_subrequests.into(), 0, 10_000)
                as u32,
            max_subrequest_bytes: self.size(t, p, "max_subrequest_bytes", d.max_subrequest_bytes),
            env,
            read_only_dir: self.string(t, p, "read_only_dir").map(PathBuf::from),
        })
    }
}

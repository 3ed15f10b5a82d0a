//! `[policy]`: the WebAssembly policy and its limits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::read::{Reader, Table, Value};

/// `[policy]`.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// Path of the policy `.wasm` (component or core module with a component-type section).
    pub path: PathBuf,
    /// The policy's own settings, read through the `config` interface.
    pub config: BTreeMap<String, String>,
    /// CPU time allowed per hook call.
    pub cpu_time: Duration,
    /// Linear memory cap per request, bytes.
    pub memory: u64,
    /// Host calls allowed per request.
    pub max_host_calls: u32,
    /// Subrequests allowed per request.
    pub max_subrequests: u32,
    /// Bytes of subrequest response bodies one request may buffer.
    pub max_subrequest_bytes: u64,
    /// Concurrent policy instances (requests running a policy at once).
    pub max_instances: u32,
    /// How long a request waits for a free instance of a full pool.
    pub instance_wait: Duration,
    /// How long one hook may wait in all on the host's I/O (cache, kv, fetch).
    pub host_wait: Duration,
    /// Start requests from a snapshot taken after one synthetic request.
    pub prewarm: bool,
    /// Keep one instance per worker thread made ahead of the request that
    /// needs it, so that requests do not wait for instantiation.
    pub pre_instantiate: bool,
    /// Bytes of recorded policy paths kept to answer repeated requests
    /// without an instance; 0 runs every request's policy live.
    pub memo_size: u64,
    /// Walk the recorded paths for every request; by default a worker
    /// thread runs its requests live, without walking them, while that
    /// costs less than walking (as measured: a compiled policy on a site
    /// with many URLs).
    pub replay_always: bool,
    /// Requests one policy instance serves, one after another on a worker
    /// thread; 1 gives every request a fresh instance.
    pub requests_per_instance: u32,
    /// How long one policy instance serves requests at most.
    pub instance_lifetime: Duration,
}

/// The longest a request may be told to wait for a policy instance: a
/// client waiting longer has usually given up.
const MAX_INSTANCE_WAIT: Duration = Duration::from_secs(60);

/// The longest a policy hook may be told to wait on the host's I/O.
const MAX_HOST_WAIT: Duration = Duration::from_secs(600);

impl PolicyConfig {
    pub(super) fn with_defaults(path: PathBuf) -> Self {
        Self {
            path,
            config: BTreeMap::new(),
            cpu_time: Duration::from_millis(50),
            memory: 64 << 20,
            max_host_calls: 10_000,
            max_subrequests: 32,
            max_subrequest_bytes: 16 << 20,
            max_instances: 1000,
            instance_wait: Duration::from_secs(1),
            host_wait: Duration::from_secs(10),
            prewarm: true,
            pre_instantiate: true,
            memo_size: 16 << 20,
            replay_always: false,
            requests_per_instance: 1000,
            instance_lifetime: Duration::from_secs(60),
        }
    }
}

impl Reader {
    pub(super) fn policy(&mut self, t: &Table) -> Option<PolicyConfig> {
        let p = "policy";
        let path = self.string(t, p, "path");
        if path.is_none() {
            self.err("policy.path", "missing: the policy's .wasm file");
        }
        let d = PolicyConfig::with_defaults(PathBuf::new());
        let mut config = BTreeMap::new();
        if let Some(ct) = self.table(t, p, "config") {
            for (k, v) in ct {
                let val = match v {
                    Value::String(s) => s.clone(),
                    Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => v.to_string(),
                    v => {
                        self.err(
                            format!("policy.config.{k}"),
                            format!("expected a string, number or boolean, got {v}"),
                        );
                        continue;
                    }
                };
                config.insert(k.clone(), val);
            }
        }
        let instance_wait = self.duration(t, p, "instance_wait", d.instance_wait);
        if instance_wait > MAX_INSTANCE_WAIT {
            self.err(
                "policy.instance_wait",
                format!("{instance_wait:?} is above the limit of {MAX_INSTANCE_WAIT:?}"),
            );
        }
        let host_wait = self.duration(t, p, "host_wait", d.host_wait);
        if host_wait < Duration::from_millis(1) || host_wait > MAX_HOST_WAIT {
            self.err(
                "policy.host_wait",
                format!("{host_wait:?} is not between 1ms and {MAX_HOST_WAIT:?}"),
            );
        }
        let pc = PolicyConfig {
            path: PathBuf::from(path.clone().unwrap_or_default()),
            config,
            cpu_time: self.duration(t, p, "cpu_time", d.cpu_time),
            memory: self.size(t, p, "memory", d.memory),
            max_host_calls: self.uint(
                t,
                p,
                "max_host_calls",
                d.max_host_calls.into(),
                1,
                u32::MAX.into(),
            ) as u32,
            max_subrequests: self.uint(t, p, "max_subrequests", d.max_subrequests.into(), 0, 10_000)
                as u32,
            max_subrequest_bytes: self.size(t, p, "max_subrequest_bytes", d.max_subrequest_bytes),
            max_instances: self.uint(t, p, "max_instances", d.max_instances.into(), 1, 100_000)
                as u32,
            instance_wait: instance_wait.min(MAX_INSTANCE_WAIT),
            host_wait: host_wait.clamp(Duration::from_millis(1), MAX_HOST_WAIT),
            prewarm: self.boolean(t, p, "prewarm", d.prewarm),
            pre_instantiate: self.boolean(t, p, "pre_instantiate", d.pre_instantiate),
            memo_size: self.size(t, p, "memo_size", d.memo_size),
            replay_always: self.boolean(t, p, "replay_always", d.replay_always),
            requests_per_instance: self.uint(
                t,
                p,
                "requests_per_instance",
                d.requests_per_instance.into(),
                1,
                u32::MAX.into(),
            ) as u32,
            instance_lifetime: self.duration(t, p, "instance_lifetime", d.instance_lifetime),
        };
        self.unknown_keys(t, p);
        path.map(|_| pc)
    }
}

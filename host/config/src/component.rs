//! `[backends.NAME]` with `component = "app.wasm"`: a backend that is a
//! `wasi:http` component served in-process, its limits, environment and
//! files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use inlay_core::ComponentSettings;

use super::read::{Reader, Table, Value, join};

/// What a component backend runs and may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentConfig {
    /// `component`: the `.wasm` file (a `wasi:http/proxy` 0.2 or
    /// `wasi:http/service` 0.3 component).
    pub path: PathBuf,
    /// The other keys: its limits, environment and files, as the runtime
    /// runs its requests with them.
    pub settings: ComponentSettings,
}

/// The longest a request may wait for an instance.
const MAX_INSTANCE_WAIT: Duration = Duration::from_secs(60);

/// Keys of an origin backend that mean nothing for a component.
const ORIGIN_ONLY: [&str; 8] = [
    "connect_timeout",
    "keepalive_timeout",
    "max_idle_connections",
    "http2",
    "ca_file",
    "client_cert",
    "client_key",
    "address",
];

/// Keys only a component backend has.
const COMPONENT_ONLY: [&str; 12] = [
    "cpu_time",
    "memory",
    "max_instances",
    "instance_wait",
    "request_timeout",
    "max_subrequests",
    "max_subrequest_bytes",
    "env",
    "read_only_dir",
    "requests_per_instance",
    "concurrent_requests_per_instance",
    "instance_lifetime",
];

impl ComponentConfig {
    /// `path` with every default.
    pub fn with_defaults(path: PathBuf) -> Self {
        Self {
            path,
            settings: ComponentSettings::default(),
        }
    }
}

impl Reader {
    /// On an origin backend (at `p`), the keys only a component has are
    /// errors that say so.
    pub(super) fn no_component_keys(&mut self, t: &Table, p: &str) {
        for key in COMPONENT_ONLY {
            if self.get(t, p, key).is_some() {
                self.err(
                    join(p, key),
                    "only for a component backend (component = \"app.wasm\")",
                );
            }
        }
    }

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
        let d = ComponentSettings::default();
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
        let settings = ComponentSettings {
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
            requests_per_instance: self
                .get(t, p, "requests_per_instance")
                .is_some()
                .then(|| self.uint(t, p, "requests_per_instance", 1, 1, 1_000_000) as u32),
            concurrent_requests_per_instance: self
                .get(t, p, "concurrent_requests_per_instance")
                .is_some()
                .then(|| self.uint(t, p, "concurrent_requests_per_instance", 1, 1, 1000) as u32),
            instance_lifetime: self.positive_duration(
                t,
                p,
                "instance_lifetime",
                d.instance_lifetime,
            ),
        };
        Some(ComponentConfig {
            path: PathBuf::from(path),
            settings,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Config, ConfigError, Overrides};

    fn issue_paths(text: &str) -> Vec<String> {
        match Config::from_toml(text) {
            Err(ConfigError::Invalid(issues)) => {
                let mut paths: Vec<_> = issues.into_iter().map(|i| i.path).collect();
                paths.sort();
                paths
            }
            other => panic!("expected issues, got {other:?}"),
        }
    }

    #[test]
    fn a_component_backend_reads_its_settings_and_is_named_by_its_name() {
        let c = Config::from_toml(
            "[backends.app]\ncomponent = \"app.wasm\"\ncpu_time = \"200ms\"\n\
             memory = \"32MiB\"\nmax_instances = 8\nfirst_byte_timeout = \"5s\"\n\
             read_only_dir = \"static\"\n[backends.app.env]\nMODE = \"edge\"\nLIMIT = 3\n",
        )
        .expect("valid");
        let b = &c.backends["app"];
        assert_eq!(b.authority(), "app", "what an ESI include or a fetch names");
        assert_eq!(b.first_byte_timeout, Duration::from_secs(5));
        let app = b.component.as_ref().expect("a component");
        assert_eq!(app.path.to_str(), Some("app.wasm"));
        let app = &app.settings;
        assert_eq!(app.cpu_time, Duration::from_millis(200));
        assert_eq!((app.memory, app.max_instances), (32 << 20, 8));
        assert_eq!(app.env["MODE"], "edge");
        assert_eq!(app.env["LIMIT"], "3");
        assert_eq!(
            app.read_only_dir.as_deref().and_then(|p| p.to_str()),
            Some("static")
        );
        assert_eq!(app.max_subrequests, 32, "the policy's default");
        let probed = Config::from_toml(
            "[backends.app]\ncomponent = \"app.wasm\"\n[backends.app.probe]\nurl = \"/health\"\n",
        )
        .expect("a component backend may be probed");
        let probe = probed.backends["app"].probe.as_ref().expect("a probe");
        assert_eq!(probe.url, "/health");
        let named = Config::from_toml("[backends.my_app-2]\ncomponent = \"a.wasm\"\n").unwrap();
        assert_eq!(named.backends["my_app-2"].authority(), "my_app-2");
    }

    #[test]
    fn instance_reuse_keys_are_read_and_bounded() {
        let c = Config::from_toml(
            "[backends.app]\ncomponent = \"app.wasm\"\nrequests_per_instance = 8\n\
             concurrent_requests_per_instance = 2\ninstance_lifetime = \"5s\"\n",
        )
        .expect("valid");
        let app = &c.backends["app"]
            .component
            .as_ref()
            .expect("a component")
            .settings;
        assert_eq!(app.requests_per_instance, Some(8));
        assert_eq!(app.concurrent_requests_per_instance, Some(2));
        assert_eq!(app.instance_lifetime, Duration::from_secs(5));
        let d = Config::from_toml("[backends.app]\ncomponent = \"app.wasm\"\n").unwrap();
        let app = &d.backends["app"]
            .component
            .as_ref()
            .expect("a component")
            .settings;
        assert_eq!(
            (
                app.requests_per_instance,
                app.concurrent_requests_per_instance
            ),
            (None, None),
            "the runtime's default for the component's world"
        );
        let paths = issue_paths(
            "[backends.app]\ncomponent = \"app.wasm\"\nrequests_per_instance = 0\n\
             concurrent_requests_per_instance = 1001\ninstance_lifetime = \"0s\"\n",
        );
        assert_eq!(
            paths,
            [
                "backends.app.concurrent_requests_per_instance",
                "backends.app.instance_lifetime",
                "backends.app.requests_per_instance",
            ]
        );
    }

    #[test]
    fn origin_keys_on_a_component_and_component_keys_on_an_origin_are_errors() {
        let paths = issue_paths(
            "[backends.app]\ncomponent = \"app.wasm\"\naddress = \"http://127.0.0.1:1\"\n\
             http2 = true\nmemory = \"1KiB\"\ncpu_time = \"0s\"\n",
        );
        assert_eq!(
            paths,
            [
                "backends.app.address",
                "backends.app.cpu_time",
                "backends.app.http2",
                "backends.app.memory",
            ]
        );
        let paths =
            issue_paths("[backends.origin]\naddress = \"http://127.0.0.1:1\"\ncpu_time = \"1s\"\n");
        assert_eq!(paths, ["backends.origin.cpu_time"]);
    }

    #[test]
    fn the_component_flag_makes_the_default_backend_a_component() {
        let mut c = Config::embedded_default();
        let flag = |b: Option<&str>| Overrides {
            component: Some("app.wasm".into()),
            backend: b.map(str::to_owned),
            ..Overrides::default()
        };
        c.apply_overrides(&flag(None)).expect("applies");
        let app = c.default_backend().component.as_ref().expect("a component");
        assert_eq!(app.path.to_str(), Some("app.wasm"));
        let err = Config::embedded_default()
            .apply_overrides(&flag(Some("http://127.0.0.1:1")))
            .expect_err("one or the other");
        assert!(err.to_string().contains("--component"), "{err}");
    }
}

//! What the test files share: a builder for "inlay with this config", run
//! in the test process ([`Harness`], for behaviour) or as the real binary
//! ([`Inlay`], for process-level behaviour); the test origin in the test
//! process ([`Origin`]); and a small HTTP client.
//!
//! The layout rule these serve is in `docs/ARCHITECTURE.md` ("Tests: one
//! layout rule").

#![allow(dead_code, unused_imports, missing_docs)]

mod client;
mod harness;
mod nats;
mod origin;
mod process;
mod tls_origin;

use std::path::{Path, PathBuf};

pub use client::{
    Reply, ask, echo_headers, echoed, esi_page, get, get_resp_from, get_site, h2_websocket, raw,
    request, urlencode,
};
pub use harness::{AccessLog, Harness};
pub use nats::{NatsServer, nats_server_binary};
pub use origin::Origin;
pub use process::{Inlay, Lines, spawn_without_config};
pub use tls_origin::{Issued, TestCa, TlsOrigin, self_signed_ca};

/// Whether the Go policy `name` can be tested: `policies/build-lang.sh`
/// builds the Go ports only where a Go toolchain is installed, and says
/// so where it is not; their tests then say so too, and pass.
pub fn go_policy_built(name: &str) -> bool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = root
        .join("target/policies")
        .join(format!("{name}.wasm"))
        .exists();
    let go = std::process::Command::new("go").arg("version").output();
    if !built && !go.is_ok_and(|o| o.status.success()) {
        eprintln!("{name}: not built, and no Go toolchain to build it: not tested");
        return false;
    }
    true
}

/// Path of a built policy component (`make policies` builds them).
pub fn policy(name: &str) -> PathBuf {
    built("policies", name)
}

/// Path of a built example `wasi:http` component (`make components`
/// builds them).
pub fn component(name: &str) -> PathBuf {
    built("components", name)
}

/// `target/<dir>/<name>.wasm`, which `make <dir>` builds.
fn built(dir: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("target").join(dir).join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run `make {dir}` first (make test does)",
        p.display()
    );
    p
}

/// A token the `auth` policy accepts for `path` until `expiry` (Unix
/// seconds), signed with `key`: `<expiry>.<hex HMAC-SHA256 of "expiry:path">`.
pub fn auth_token(key: &str, path: &str, expiry: u64) -> String {
    use hmac::{Mac, SimpleHmac};
    let mut mac = SimpleHmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(format!("{expiry}:{path}").as_bytes());
    format!("{expiry}.{}", hex::encode(mac.finalize().into_bytes()))
}

/// A loopback port nobody listens on: bound, noted, closed.
pub fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What to run: a config file, command-line flags, environment. The same
/// settings start the server in the test process
/// ([`start_in_process`](Self::start_in_process)) or as the real binary
/// ([`spawn_process`](Self::spawn_process)).
#[derive(Default, Clone)]
pub struct InlayBuilder {
    toml: String,
    server: String,
    backend: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Soft and hard `RLIMIT_NOFILE` of a spawned process (`prlimit`).
    open_files: Option<(u64, u64)>,
}

impl InlayBuilder {
    /// Default backend at this origin.
    pub fn backend(mut self, origin: &Origin) -> Self {
        self.backend = Some(origin.url());
        self
    }

    /// Extra TOML appended to the config file (after `[backends.default]`).
    pub fn toml(mut self, t: &str) -> Self {
        self.toml.push_str(t);
        self.toml.push('\n');
        self
    }

    /// Extra lines for the `[server]` table.
    pub fn server(mut self, line: &str) -> Self {
        self.server.push_str(line);
        self.server.push('\n');
        self
    }

    /// A flag of `inlay serve`, e.g. `--policy` then its value.
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    /// An environment variable for the process (e.g. `TOKIO_WORKER_THREADS`);
    /// the real binary only.
    /// Spawned processes start with this soft and hard open-file limit.
    pub fn open_files(mut self, soft: u64, hard: u64) -> Self {
        self.open_files = Some((soft, hard));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// With `INLAY_TEST_REQUESTS_PER_INSTANCE=N` in the test's
    /// environment, every policy is configured with
    /// `requests_per_instance = N` unless the test sets it: the policy
    /// tests run in both modes (`1`: a fresh instance per request; the
    /// default reuses instances). A `--policy` flag becomes a `[policy]`
    /// table for that.
    fn set_policy_mode(&mut self) {
        let Ok(n) = std::env::var("INLAY_TEST_REQUESTS_PER_INSTANCE") else {
            return;
        };
        if self.toml.contains("requests_per_instance") {
            return;
        }
        let line = format!("requests_per_instance = {n}\n");
        if let Some(at) = self.toml.find("[policy]\n") {
            self.toml.insert_str(at + "[policy]\n".len(), &line);
        } else if let Some(i) = self.args.iter().position(|a| a == "--policy")
            && i + 1 < self.args.len()
        {
            let path = self.args.remove(i + 1);
            self.args.remove(i);
            self.toml
                .push_str(&format!("[policy]\npath = {path:?}\n{line}"));
        }
    }

    /// Write the config file into `dir`; its path.
    fn write_config(&self, dir: &Path) -> PathBuf {
        let path = dir.join("inlay.toml");
        let mut text = String::from("[server]\nlisten = [\"127.0.0.1:0\"]\n");
        if !self.server.contains("shutdown_timeout") {
            text.push_str("shutdown_timeout = \"10s\"\n");
        }
        text.push_str(&self.server);
        if let Some(b) = &self.backend {
            text.push_str(&format!(
                "[backends.default]\naddress = \"{b}\"\nfirst_byte_timeout = \"3s\"\n"
            ));
        }
        text.push_str(&self.toml);
        std::fs::write(&path, text).unwrap();
        path
    }
}

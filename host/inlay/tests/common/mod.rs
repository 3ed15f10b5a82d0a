//! Test harness: the real `inlay` binary in front of the real `inlay-origin`,
//! both on `127.0.0.1:0`, and a small HTTP client.
//!
//! `make test` builds `inlay-origin` before running the tests; running a test
//! alone needs `cargo build -p inlay-origin` first.

#![allow(dead_code, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Where cargo put the binaries (`target/debug` or `target/release`).
pub fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_inlay"))
        .parent()
        .expect("binary has a directory")
        .to_owned()
}

/// Path of a built policy component (`make policies` builds them).
pub fn policy(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("target/policies").join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run `make policies` first (make test does)",
        p.display()
    );
    p
}

/// Lines a child wrote, collected by a thread.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn collect(self, r: impl Read + Send + 'static, tx: Option<std::sync::mpsc::Sender<String>>) {
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                if let Some(tx) = &tx {
                    let _ = tx.send(line.clone());
                }
                self.0.lock().unwrap().push(line);
            }
        });
    }

    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn text(&self) -> String {
        self.all().join("\n")
    }

    /// Wait until a line containing `needle` appears.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.all().iter().any(|l| l.contains(needle)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

#[allow(clippy::zombie_processes)] // the caller owns the child and waits for it in Drop
fn spawn_and_wait_listening(
    mut cmd: Command,
    from_stderr: bool,
) -> (Child, SocketAddr, Lines, Lines) {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let (tx, rx) = std::sync::mpsc::channel();
    let out = Lines::default();
    let err = Lines::default();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    if from_stderr {
        out.clone().collect(stdout, None);
        err.clone().collect(stderr, Some(tx));
    } else {
        out.clone().collect(stdout, Some(tx));
        err.clone().collect(stderr, None);
    }
    // Generous: a first start compiles large (JS, Python) policies; later starts hit
    // wasmtime's compiled-code cache.
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
                    return (child, addr, out, err);
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "{cmd:?} did not report its address.\nstdout:\n{}\nstderr:\n{}",
                    out.text(),
                    err.text()
                );
            }
        }
    }
}

/// The test origin, `inlay-origin`, on a free loopback port.
pub struct Origin {
    child: Child,
    pub addr: SocketAddr,
}

impl Origin {
    pub fn start() -> Self {
        let bin = bin_dir().join("inlay-origin");
        assert!(
            bin.exists(),
            "{} is missing: run `cargo build -p inlay-origin` (make test does)",
            bin.display()
        );
        let mut cmd = Command::new(bin);
        cmd.args(["--listen", "127.0.0.1:0"]);
        let (child, addr, _, _) = spawn_and_wait_listening(cmd, false);
        Self { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests the origin saw for `path` (without query).
    pub async fn count(&self, path: &str) -> u64 {
        let r = get(&format!("{}/__count?path={}", self.url(), path)).await;
        r.text()
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad count {:?}", r.text()))
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds an `inlay serve` invocation.
#[derive(Default, Clone)]
pub struct InlayBuilder {
    toml: String,
    server: String,
    backend: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
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

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    /// An environment variable for the process (e.g. `TOKIO_WORKER_THREADS`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn start(self) -> Inlay {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("inlay.toml");
        let mut text =
            String::from("[server]\nlisten = [\"127.0.0.1:0\"]\nshutdown_timeout = \"10s\"\n");
        text.push_str(&self.server);
        if let Some(b) = &self.backend {
            text.push_str(&format!(
                "[backends.default]\naddress = \"{b}\"\nfirst_byte_timeout = \"3s\"\n"
            ));
        }
        text.push_str(&self.toml);
        std::fs::write(&cfg, text).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_inlay"));
        cmd.arg("serve").arg("--config").arg(&cfg).args(&self.args);
        cmd.env("INLAY_LOG", "info");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let (child, addr, out, err) = spawn_and_wait_listening(cmd, true);
        Inlay {
            child: Some(child),
            addr,
            access: out,
            log: err,
            _dir: dir,
            builder: self,
        }
    }
}

/// A running `inlay serve`.
pub struct Inlay {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// Access-log lines (stdout).
    pub access: Lines,
    /// Diagnostic log lines (stderr).
    pub log: Lines,
    _dir: tempfile::TempDir,
    pub builder: InlayBuilder,
}

impl Inlay {
    pub fn builder() -> InlayBuilder {
        InlayBuilder::default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Wait for the process to exit; its exit status.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        let child = self.child.as_mut().unwrap();
        while Instant::now() < end {
            if let Some(st) = child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Resident memory of the process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Inlay {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub version: http::Version,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn get(url: &str) -> Reply {
    request("GET", url, &[], Bytes::new()).await
}

pub async fn request(method: &str, url: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {url} timed out"))
        .unwrap_or_else(|e| panic!("{method} {url} failed: {e}"));
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
        version: parts.version,
    }
}

/// The header fields `inlay-origin`'s `/echo` says it received (lower-case names).
pub fn echo_headers(r: &Reply) -> Vec<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_lowercase(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// One header `/echo` received, if any.
pub fn echoed(r: &Reply, name: &str) -> Option<String> {
    echo_headers(r)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// Send raw bytes on a fresh connection and read until the server closes or `timeout`.
pub fn raw(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> (String, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

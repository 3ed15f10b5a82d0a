//! The real `inlay` binary, for what only a process shows: signals, kill -9,
//! exit codes, resident memory, what it writes on stderr.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::InlayBuilder;

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

    /// Wait until at least `n` lines have come; whether they did.
    pub fn wait_for_count(&self, n: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.0.lock().unwrap().len() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Wait until a line containing `needle` appears. Blocks the calling
    /// thread: the test's own thread, not a runtime worker (the test origin
    /// runs on those).
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

impl InlayBuilder {
    /// Start `inlay serve --config FILE ARGS` and wait for its "listening on"
    /// line. The access log goes to its stdout ([`Inlay::access`]).
    pub fn spawn_process(mut self) -> Inlay {
        self.set_policy_mode();
        let dir = tempfile::tempdir().unwrap();
        let config = self.write_config(dir.path());
        let mut cmd = match self.open_files {
            // prlimit sets its own limits, then execs inlay (same pid).
            Some((soft, hard)) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={soft}:{hard}"))
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_inlay"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_inlay")),
        };
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .args(&self.args);
        cmd.env("INLAY_LOG", "info");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        Inlay::running(cmd, config, dir)
    }
}

/// Start `inlay serve ARGS` with no config file (the embedded default)
/// and wait for its "listening on" line.
pub fn spawn_without_config(args: &[&str]) -> Inlay {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inlay"));
    cmd.arg("serve").args(args).env("INLAY_LOG", "info");
    let config = dir.path().join("none.toml");
    Inlay::running(cmd, config, dir)
}

#[allow(clippy::zombie_processes)] // the caller owns the child and waits for it in Drop
fn spawn_and_wait_listening(mut cmd: Command) -> (Child, SocketAddr, Lines, Lines) {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let (tx, rx) = std::sync::mpsc::channel();
    let out = Lines::default();
    let err = Lines::default();
    out.clone().collect(child.stdout.take().unwrap(), None);
    err.clone().collect(child.stderr.take().unwrap(), Some(tx));
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

/// A running `inlay serve` process; killed on drop.
pub struct Inlay {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// Access-log lines (stdout).
    pub access: Lines,
    /// Diagnostic log lines (stderr).
    pub log: Lines,
    /// The config file it was started with (a reload reads it again).
    pub config: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Inlay {
    /// Start `cmd` and wait until it listens; `dir` holds its files.
    fn running(cmd: Command, config: std::path::PathBuf, dir: tempfile::TempDir) -> Inlay {
        let (child, addr, out, err) = spawn_and_wait_listening(cmd);
        Inlay {
            child: Some(child),
            addr,
            access: out,
            log: err,
            config,
            _dir: dir,
        }
    }

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

    /// Wait until the diagnostic log (stderr) has a line containing
    /// `needle`; panic with the whole log if it does not come in `timeout`.
    pub fn expect_log(&self, needle: &str, timeout: Duration) {
        assert!(
            self.log.wait_for(needle, timeout),
            "no {needle:?} on stderr within {timeout:?}:\n{}",
            self.log.text()
        );
    }

    /// Write `text` as the config, SIGHUP, and wait for generation `n`.
    pub fn reload_to(&self, text: &str, n: u64) {
        std::fs::write(&self.config, text).unwrap();
        self.signal("HUP");
        self.expect_log(
            &format!("config reloaded: generation {n} serves"),
            Duration::from_secs(60),
        );
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

//! A real `nats-server` with JetStream on a loopback port, for the cluster
//! tests. Where the binary is missing the tests say so and skip (make test
//! installs it through `loadtests/scripts/ensure-deps.sh`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `nats-server` binary: `$NATS_SERVER`, `PATH`, or Debian's `/usr/sbin`.
pub fn nats_server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// Skip the calling test, loudly, when `nats-server` is not installed.
#[macro_export]
macro_rules! require_nats {
    () => {
        if $crate::common::nats_server_binary().is_none() {
            eprintln!(
                "SKIPPED: nats-server is not installed (apt-get install nats-server); this cluster test did not run"
            );
            return;
        }
    };
}

/// A `nats-server -js` process; killed on drop.
pub struct NatsServer {
    child: Option<Child>,
    /// The client port on 127.0.0.1.
    pub addr: SocketAddr,
    dir: PathBuf,
    args: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// Start on a free port with its JetStream store in a new temporary directory.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with more command-line `args` (`--auth
    /// TOKEN`, `--tlscert FILE`, `-c FILE`, ...).
    pub fn start_with(args: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut s = Self::launch(&dir, crate::common::unused_port(), args);
        s._tmp = Some(tmp);
        s
    }

    /// Start on `port` with its JetStream store in `dir` (a restart keeps both).
    pub fn start_in(dir: &Path, port: u16) -> Self {
        Self::launch(dir, port, Vec::new())
    }

    fn launch(dir: &Path, port: u16, args: Vec<String>) -> Self {
        let bin = nats_server_binary().expect("nats-server is installed (require_nats!)");
        let log = std::fs::File::create(dir.join(format!("nats-{port}.log"))).unwrap();
        let child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.join("js"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting nats-server");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let server = Self {
            child: Some(child),
            addr,
            dir: dir.to_owned(),
            args,
            _tmp: None,
        };
        server.wait_ready();
        server
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Stop the server (SIGKILL) and start it again on the same port and
    /// store: streams and buckets survive, connections do not.
    pub fn restart(&mut self) {
        self.stop();
        let again = Self::launch(&self.dir, self.addr.port(), self.args.clone());
        self.child = again.child_taken();
    }

    /// Stop the server now (SIGKILL).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn child_taken(mut self) -> Option<Child> {
        self.child.take()
    }

    /// Wait until the server answers with its INFO line and JetStream is up
    /// (it logs "Server is ready"); at most 20 s.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let log = self.dir.join(format!("nats-{}.log", self.addr.port()));
        loop {
            let ready = std::fs::read_to_string(&log)
                .map(|l| l.contains("Server is ready"))
                .unwrap_or(false);
            if ready && std::net::TcpStream::connect(self.addr).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start within 20 s: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

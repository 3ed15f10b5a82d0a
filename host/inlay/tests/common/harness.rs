//! The in-process harness: the real config loading, policy runtime,
//! pipeline and server (`inlay::startup::Proxy`) on `127.0.0.1:0`, in the
//! test's tokio runtime. No process is started and no output is parsed:
//! the test knows the address because it bound the listener, and reads the
//! access log from a file of its own.
//!
//! The diagnostic log is a process-global `tracing` subscriber, so no test
//! may assert on it; to read it while debugging, set a filter:
//! `INLAY_TEST_LOG=debug cargo test -p inlay --test server -- cache::purge`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser as _;
use inlay::admin::AdminServer;
use inlay::cli::{Cli, Command};
use inlay::config::AccessLogTarget;
use inlay::listeners::{Listener, QuicListener};
use inlay::metrics::Metrics;
use inlay::startup::Proxy;
use inlay_runtime::{LoadedPolicy, PolicySlot};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::InlayBuilder;

impl InlayBuilder {
    /// Serve in the test's runtime, as `inlay serve --config FILE ARGS` would
    /// after binding: the same config file and flags, a fresh port, and the
    /// access log in a file the test reads ([`Harness::access`]).
    pub async fn start_in_process(mut self) -> Harness {
        self.set_policy_mode();
        assert!(
            self.env.is_empty(),
            "environment settings apply to a process: use spawn_process, or the test's runtime flavor"
        );
        show_diagnostics_if_asked();
        let dir = tempfile::tempdir().unwrap();
        let config = self.write_config(dir.path());
        let argv = ["inlay", "serve", "--config"]
            .into_iter()
            .map(String::from)
            .chain([config.display().to_string()])
            .chain(self.args.iter().cloned());
        let Command::Serve(serve) = Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("bad flags {:?}: {e}", self.args))
            .command
        else {
            unreachable!("the argv says serve")
        };
        let mut cfg = serve
            .load_config()
            .unwrap_or_else(|e| panic!("bad config: {e:#}"));
        let access = dir.path().join("access.log");
        cfg.log.access_log = AccessLogTarget::File(access.clone());
        let proxy = Proxy::load(cfg)
            .await
            .unwrap_or_else(|e| panic!("inlay did not start: {e:#}"));
        let policy = proxy.policy().cloned();
        // With `[admin] listen`, the admin API on a port of its own.
        let admin = match proxy.config().admin {
            Some(_) => {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                Some(AdminServer::start(l, proxy.admin().clone()).unwrap())
            }
            None => None,
        };
        let metrics = proxy.metrics().clone();
        let cluster = proxy.cluster().map(|c| Arc::clone(c.metrics()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut listeners = vec![Listener::plain(listener)];
        // With `https://` listeners, one TLS listener on a port of its own.
        let mut tls_addr = None;
        if !proxy.config().server.listen_tls.is_empty() {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tls_addr = Some(l.local_addr().unwrap());
            listeners.push(Listener::tls(l, proxy.tls().clone()));
        }
        // With `quic://` listeners, one QUIC listener on a UDP port of its own.
        let mut quic_addr = None;
        let proxy = if proxy.config().server.listen_quic.is_empty() {
            proxy
        } else {
            let l = QuicListener::bind("127.0.0.1:0".parse().unwrap(), proxy.tls()).unwrap();
            quic_addr = Some(l.local_addr());
            proxy.with_quic(vec![l])
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let readiness = proxy.admin().readiness().clone();
        let served = tokio::spawn(async move {
            let result = proxy
                .run(listeners, async {
                    let _ = stopped.await;
                })
                .await;
            // Shown with the test's output when it fails: a server that
            // stopped before serving leaves only refused connections.
            if let Err(e) = &result {
                eprintln!("inlay stopped with an error: {e:#}");
            }
            result
        });
        // Serving: the cache open and the admin API wired (as `/readyz`
        // says), or stopped with an error the test will see.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !readiness.is_ready() && !served.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "inlay not ready within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Harness {
            addr,
            tls_addr,
            quic_addr,
            admin_addr: admin.as_ref().map(AdminServer::local_addr),
            admin,
            access: AccessLog(access),
            metrics,
            cluster_metrics: cluster,
            policy,
            stop: Some(stop),
            served: Some(served),
            _dir: dir,
        }
    }
}

/// With `INLAY_TEST_LOG` set, the diagnostic log of every server in this
/// test process goes to stderr, filtered by it.
fn show_diagnostics_if_asked() {
    if let Ok(filter) = std::env::var("INLAY_TEST_LOG") {
        // The first test to start a server installs it; the others find it there.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// Inlay serving in the test process; stopped (drained, flushed) by
/// [`stop`](Self::stop) or on drop.
pub struct Harness {
    pub addr: SocketAddr,
    /// The TLS listener's address, when the config has `https://` listeners.
    pub tls_addr: Option<SocketAddr>,
    /// The QUIC (HTTP/3) listener's UDP address, when the config has
    /// `quic://` listeners.
    pub quic_addr: Option<SocketAddr>,
    /// The admin API's address, when the config has `[admin] listen`.
    pub admin_addr: Option<SocketAddr>,
    admin: Option<AdminServer>,
    /// The access log (written by the server's own writer thread).
    pub access: AccessLog,
    /// The server's metrics (`render` is what `GET /metrics` serves).
    pub metrics: Arc<Metrics>,
    /// What the node's cluster counts, with `[cluster]`.
    cluster_metrics: Option<Arc<inlay_cluster::ClusterMetrics>>,
    policy: Option<Arc<PolicySlot>>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub fn builder() -> InlayBuilder {
        InlayBuilder::default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A URL of the admin API (the config must have `[admin] listen`).
    pub fn admin_url(&self, path: &str) -> String {
        let addr = self.admin_addr.expect("this harness has no [admin] listen");
        format!("http://{addr}{path}")
    }

    /// The count of one kind of the cluster's purge fan-out
    /// (`inlay_cluster::fanout::kind`; 0 without `[cluster]`).
    pub fn cluster_invalidations(&self, kind: &'static str) -> u64 {
        self.cluster_metrics
            .as_ref()
            .map_or(0, |m| m.invalidations(kind))
    }

    /// The policy new requests get (a harness started without one panics).
    pub fn policy(&self) -> LoadedPolicy {
        self.policy
            .as_ref()
            .expect("this harness runs no policy")
            .current()
    }

    /// Stop as SIGTERM stops the binary: no new connections, in-flight
    /// requests drained, the access log written out, the cache flushed.
    /// The access log and the policy stay readable.
    pub async fn stop(&mut self) {
        self.stopped()
            .await
            .expect("inlay stopped within 30 s")
            .expect("the server task did not panic")
            .expect("inlay stopped cleanly");
    }

    /// Send the stop signal and wait for the server's task, once.
    async fn stopped(
        &mut self,
    ) -> Result<Result<anyhow::Result<()>, tokio::task::JoinError>, tokio::time::error::Elapsed>
    {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = self.served.take().expect("stopped once");
        let result = tokio::time::timeout(Duration::from_secs(30), served).await;
        if let Some(admin) = self.admin.take() {
            admin.shutdown().await;
        }
        result
    }
}

impl Drop for Harness {
    /// Stops as [`stop`](Harness::stop) does, so that the shutdown does not
    /// race the end of the test's runtime; a test that failed only sends
    /// the signal.
    fn drop(&mut self) {
        if self.served.is_none() {
            return;
        }
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if std::thread::panicking() || !multi_thread {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            return;
        }
        let handle = tokio::runtime::Handle::current();
        let _ = tokio::task::block_in_place(|| handle.block_on(self.stopped()));
    }
}

/// The access log file of a [`Harness`].
pub struct AccessLog(PathBuf);

impl AccessLog {
    /// Every line written so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.0)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn text(&self) -> String {
        self.lines().join("\n")
    }

    /// The first line containing every one of `needles`, waiting up to
    /// `timeout` for it: a line is written when its response body ends.
    pub async fn wait_for(&self, needles: &[&str], timeout: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let found = self
                .lines()
                .into_iter()
                .find(|l| needles.iter().all(|n| l.contains(n)));
            if found.is_some() || tokio::time::Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The JSON line (`access_log_format = "json"`) of the request for
    /// `url` (path and query as sent), waiting up to `timeout` for it.
    pub async fn json_for(&self, url: &str, timeout: Duration) -> serde_json::Value {
        let needle = format!("\"url\":{}", serde_json::Value::from(url));
        let line = self
            .wait_for(&[&needle], timeout)
            .await
            .unwrap_or_else(|| panic!("no access log line for {url}:\n{}", self.text()));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

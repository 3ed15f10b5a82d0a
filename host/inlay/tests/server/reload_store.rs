//! A reload applies the cache store's settings: new sizes change the
//! running store's bounds in place, a new `cache.dir` moves new requests
//! to a store opened there (carrying the bans), and a directory that cannot
//! be opened changes nothing. The real proxy in the test process, reloaded
//! through the admin API's `POST /reload` after the test rewrote its file.
//!
//! Run: `cargo test -p inlay --test server -- reload_store::`

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser as _;
use inlay::admin::AdminServer;
use inlay::cli::{Cli, Command};
use inlay::startup::Proxy;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use common::{Origin, get_site, request};

/// The proxy, started with `reloading`, as `inlay serve --config FILE`
/// does, and its admin API.
struct Reloadable {
    config: PathBuf,
    addr: SocketAddr,
    admin: Option<AdminServer>,
    admin_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<anyhow::Result<()>>>,
}

/// A whole config: the origin, a one-hour TTL, the admin API, the access
/// log in `dir`, then the `[cache]` lines of `cache`.
fn config(origin: &Origin, dir: &Path, cache: &str) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\nshutdown_timeout = \"10s\"\n\
         [backends.default]\naddress = \"{}\"\nfirst_byte_timeout = \"3s\"\n\
         [log]\naccess_log = \"{}\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [cache]\ndefault_ttl = \"1h\"\n{cache}\n",
        origin.url(),
        dir.join("access.log").display()
    )
}

/// `cache.dir = "<dir>"`.
fn dir_line(dir: &Path) -> String {
    format!("dir = \"{}\"", dir.display())
}

impl Reloadable {
    async fn start(config_file: &Path, text: &str) -> Reloadable {
        std::fs::write(config_file, text).unwrap();
        let argv = ["inlay", "serve", "--config"]
            .into_iter()
            .map(String::from)
            .chain([config_file.display().to_string()]);
        let Command::Serve(serve) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!("the argv says serve")
        };
        let cfg = serve.load_config().unwrap();
        let proxy = Proxy::load(cfg)
            .await
            .unwrap()
            .reloading(serve.source())
            .unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = AdminServer::start(l, proxy.admin().clone()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(proxy.run(vec![listener], async {
            let _ = stopped.await;
        }));
        Reloadable {
            config: config_file.to_path_buf(),
            addr,
            admin_addr: admin.local_addr(),
            admin: Some(admin),
            stop: Some(stop),
            served: Some(served),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn admin(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let (body, headers) = match body {
            Value::Null => (Bytes::new(), &[][..]),
            b => (
                Bytes::from(b.to_string()),
                &[("content-type", "application/json")][..],
            ),
        };
        let url = format!("http://{}{path}", self.admin_addr);
        let r = request(method, &url, headers, body).await;
        let text = r.text();
        match serde_json::from_str(&text) {
            Ok(v) => (r.status, v),
            // `/metrics` is text.
            Err(_) => (r.status, Value::String(text)),
        }
    }

    /// Write `text` as the config file and reload: the report, or the errors.
    async fn reload(&self, text: &str) -> Result<Value, Vec<String>> {
        std::fs::write(&self.config, text).unwrap();
        let (status, v) = self.admin("POST", "/reload", Value::Null).await;
        match status {
            200 => Ok(v),
            _ => Err(serde_json::from_value(v["errors"].clone())
                .unwrap_or_else(|_| panic!("reload answered {status}: {v}"))),
        }
    }

    /// [`reload`](Self::reload) to a config that moves the cache back to a
    /// directory an older generation's store held: it opens once that
    /// store is closed (its last request done, then within a poll).
    async fn reload_once_free(&self, text: &str) -> Value {
        let mut last = Vec::new();
        for _ in 0..100 {
            match self.reload(text).await {
                Ok(report) => return report,
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the old store was never closed: {last:?}");
    }

    async fn store_stats(&self) -> Value {
        let (status, v) = self.admin("GET", "/stats", Value::Null).await;
        assert_eq!(status, 200, "{v}");
        v["store"].clone()
    }

    /// The store's stats once `held` says the last fills are stored (a
    /// fill stores its object as the client gets the last bytes, not before).
    async fn store_stats_once(&self, held: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..100 {
            let st = self.store_stats().await;
            if held(&st) {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never held: {}", self.store_stats().await);
    }

    /// Stop as SIGTERM does: drain, then flush the cache.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = self.served.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), served)
            .await
            .expect("stopped within 30 s")
            .unwrap()
            .unwrap();
        if let Some(admin) = self.admin.take() {
            admin.shutdown().await;
        }
    }
}

/// GET `path` (a `/static/{n}` object, cached for an hour) through `inlay`
/// (with one `Host`, so that keys match across restarts) and say whether the origin saw it (a miss) or not (a hit).
async fn fetched(inlay: &Reloadable, origin: &Origin, path: &str) -> bool {
    let before = origin.count(path).await;
    assert_eq!(get_site(&inlay.url(path)).await.status, 200);
    origin.count(path).await > before
}

/// The value of the metric line that starts with `name` in `GET /metrics`.
async fn metric(inlay: &Reloadable, name: &str) -> u64 {
    let (_, text) = inlay.admin("GET", "/metrics", Value::Null).await;
    let text = text.as_str().expect("metrics text").to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in {text}"))
}

/// Objects of 40 KB each: `/static/{40000 + i}` (the path is the size).
fn object(i: u64) -> String {
    format!("/static/{}", 40_000 + i)
}

/// Objects of 300 KB each, too large for a memory tier of 1 MiB: hits come
/// from the disk tier.
fn large_object(i: u64) -> String {
    format!("/static/{}", 300_000 + i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_memory_size_on_reload_evicts_and_stats_show_it() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inlay.toml");
    let inlay = Reloadable::start(
        &file,
        &config(&origin, dir.path(), "memory_size = \"8MiB\""),
    )
    .await;
    for i in 0..100 {
        assert!(fetched(&inlay, &origin, &object(i)).await);
    }
    inlay
        .store_stats_once(|st| st["memory"]["objects"] == 100)
        .await;

    let report = inlay
        .reload(&config(&origin, dir.path(), "memory_size = \"1MiB\""))
        .await
        .expect("reloaded");
    assert_eq!(report["changed"], json!(["cache"]), "{report}");
    assert_eq!(report["warnings"], json!([]), "applied, not kept back");
    let after = inlay.store_stats().await;
    assert_eq!(after["memory"]["capacity"], 1 << 20, "{after}");
    assert!(
        after["memory"]["bytes"].as_u64().unwrap() <= 1 << 20,
        "{after}"
    );
    let held = after["memory"]["objects"].as_u64().unwrap();
    assert!(held < 30, "{after}");
    assert_eq!(after["memory"]["evicted"], 100 - held, "{after}");
    assert_eq!(
        metric(&inlay, "inlay_store_capacity_bytes{tier=\"memory\"}").await,
        1 << 20
    );
    // The newest objects stayed; the oldest are misses again.
    assert!(!fetched(&inlay, &origin, &object(99)).await);
    assert!(fetched(&inlay, &origin, &object(0)).await);
    inlay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_size_change_on_reload_applies_to_the_running_store() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let (file, cache_dir) = (dir.path().join("inlay.toml"), dir.path().join("cache"));
    let sized = |disk: &str| {
        config(
            &origin,
            dir.path(),
            &format!(
                "{}\nmemory_size = \"1MiB\"\ndisk_size = \"{disk}\"",
                dir_line(&cache_dir)
            ),
        )
    };
    let inlay = Reloadable::start(&file, &sized("8MiB")).await;
    for i in 0..20 {
        assert!(fetched(&inlay, &origin, &large_object(i)).await);
    }
    let st = inlay
        .store_stats_once(|st| st["disk"]["objects"] == 20)
        .await;
    assert_eq!(st["memory"]["objects"], 0, "{st}");

    // A bound the store refuses is refused, naming the key; nothing changes.
    let errors = inlay.reload(&sized("100KiB")).await.expect_err("refused");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("cache.disk_size: "), "{errors:?}");
    let st = inlay.store_stats().await;
    assert_eq!(
        (
            st["disk"]["capacity"].as_u64(),
            st["disk"]["objects"].as_u64()
        ),
        (Some(8 << 20), Some(20))
    );

    let report = inlay.reload(&sized("2MiB")).await.expect("reloaded");
    assert_eq!(report["warnings"], json!([]), "{report}");
    let st = inlay.store_stats().await;
    assert_eq!(st["disk"]["capacity"], 2 << 20, "{st}");
    assert!(st["disk"]["bytes"].as_u64().unwrap() <= 2 << 20, "{st}");
    assert!(st["disk"]["objects"].as_u64().unwrap() <= 6, "{st}");
    assert_eq!(
        metric(&inlay, "inlay_store_capacity_bytes{tier=\"disk\"}").await,
        2 << 20
    );
    assert!(
        !fetched(&inlay, &origin, &large_object(19)).await,
        "newest kept"
    );
    assert!(
        fetched(&inlay, &origin, &large_object(0)).await,
        "oldest evicted"
    );
    inlay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cache_dir_on_reload_serves_from_the_new_dir() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inlay.toml");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let on = |d: &Path| config(&origin, dir.path(), &dir_line(d));
    let inlay = Reloadable::start(&file, &on(&a)).await;
    assert!(fetched(&inlay, &origin, &object(1)).await);
    assert!(!fetched(&inlay, &origin, &object(1)).await);

    let report = inlay.reload(&on(&b)).await.expect("reloaded");
    assert_eq!(report["warnings"], json!([]), "{report}");
    assert_eq!(report["changed"], json!(["cache"]), "{report}");
    // The new directory does not hold what the old one does.
    assert!(fetched(&inlay, &origin, &object(1)).await);
    assert!(fetched(&inlay, &origin, &object(2)).await);
    assert!(!fetched(&inlay, &origin, &object(2)).await);
    let (_, config_now) = inlay.admin("GET", "/config", Value::Null).await;
    assert_eq!(config_now["cache"]["dir"], b.display().to_string());
    inlay
        .store_stats_once(|st| st["disk"]["objects"] == 2)
        .await;

    // Back to the first directory, once its store is closed: what it held
    // is there (it was flushed and closed, then opened again).
    inlay.reload_once_free(&on(&a)).await;
    assert!(!fetched(&inlay, &origin, &object(1)).await);
    assert!(fetched(&inlay, &origin, &object(2)).await);
    assert_eq!(
        metric(&inlay, "inlay_store_capacity_bytes{tier=\"disk\"}").await,
        1 << 30
    );
    // And to none: a memory-only cache.
    inlay
        .reload(&config(&origin, dir.path(), ""))
        .await
        .expect("reloaded");
    assert!(fetched(&inlay, &origin, &object(1)).await);
    assert_eq!(inlay.store_stats().await["disk"]["enabled"], false);
    let (_, metrics) = inlay.admin("GET", "/metrics", Value::Null).await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(metrics.contains("inlay_store_capacity_bytes{tier=\"memory\"}"));
    assert!(
        !metrics.contains("tier=\"disk\""),
        "the disk figures of the store it left: {metrics}"
    );
    // A restart on the second directory finds what was cached there
    // after the switch: the last generation's store was flushed too.
    inlay.reload_once_free(&on(&b)).await;
    inlay.stop().await;
    let again = Reloadable::start(&file, &on(&b)).await;
    assert!(!fetched(&again, &origin, &object(2)).await);
    assert!(!fetched(&again, &origin, &object(1)).await);
    again.stop().await;
}

/// A GET whose response head has come and whose body stalls for seconds:
/// a fill in progress. The connection, to hold until the test is done.
async fn slow_fill_started(inlay: &Reloadable) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    conn.write_all(
        b"GET /slow-body?n=4096&first=16&after_ms=5000 HTTP/1.1\r\nHost: example.com\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before the head: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_before_a_dir_switch_still_bans_objects_found_in_the_new_dir() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inlay.toml");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let on = |d: &Path| config(&origin, dir.path(), &dir_line(d));
    // The second directory holds two objects from before the ban.
    let inlay = Reloadable::start(&file, &on(&b)).await;
    assert!(fetched(&inlay, &origin, &object(7)).await);
    assert!(fetched(&inlay, &origin, &object(8)).await);
    inlay.reload(&on(&a)).await.expect("reloaded");
    // A fill in progress from before the ban keeps the ban in effect (the
    // lurker may not drop it until that fill is stored): the ban is still
    // there when the cache moves.
    let _slow = slow_fill_started(&inlay).await;
    let (status, v) = inlay
        .admin(
            "POST",
            "/ban",
            json!({ "expression": format!("req.url == {}", object(7)) }),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (_, bans) = inlay.admin("GET", "/bans", Value::Null).await;
    assert_eq!(bans["bans"].as_array().unwrap().len(), 1, "{bans}");
    inlay.reload_once_free(&on(&b)).await;
    // (The new cache's lurker may already have removed it and dropped the ban.)
    let (_, bans) = inlay.admin("GET", "/bans", Value::Null).await;
    assert_eq!(bans["counts"]["added"], 1, "{bans}");
    assert!(fetched(&inlay, &origin, &object(7)).await, "banned");
    assert!(!fetched(&inlay, &origin, &object(8)).await, "not banned");
    assert!(!fetched(&inlay, &origin, &object(7)).await, "cached after");
    inlay.stop().await;
}

/// BAN requests sent while a reload moves the cache to another directory
/// (and loads a policy, which keeps it busy for a while) all survive it:
/// none lands on the cache being left after its bans were carried over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_sent_while_a_reload_moves_the_cache_survive_it() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inlay.toml");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let on = |d: &Path| {
        format!(
            "{}[policy]\npath = \"{}\"\n",
            config(&origin, dir.path(), &dir_line(d)),
            common::policy("default").display()
        )
    };
    let inlay = Reloadable::start(&file, &on(&a)).await;
    // Serving (the cache open, the admin API's reload wired).
    while inlay.admin("GET", "/readyz", Value::Null).await.0 != 200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::write(&file, on(&b)).unwrap();
    let admin = format!("http://{}/reload", inlay.admin_addr);
    let reload = tokio::spawn(async move { request("POST", &admin, &[], Bytes::new()).await });
    // A BAN every few milliseconds for as long as the reload runs, each
    // sent without waiting for the one before.
    let mut bans = Vec::new();
    while !reload.is_finished() || bans.is_empty() {
        let expression = format!("req.url == /banned/{}", bans.len());
        let url = inlay.url("/");
        bans.push(tokio::spawn(async move {
            request("BAN", &url, &[("ban", &expression)], Bytes::new()).await
        }));
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let reloaded = reload.await.unwrap();
    assert_eq!(reloaded.status, 200, "{}", reloaded.text());
    let sent = bans.len() as u64;
    for ban in bans {
        let r = ban.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (_, v) = inlay.admin("GET", "/config", Value::Null).await;
    assert_eq!(v["cache"]["dir"], b.display().to_string(), "moved");
    // Every ban is in the cache that serves now: carried over, or added
    // to it after the move (the lurker may have dropped some since, so
    // the count of those added, not the list).
    let (_, v) = inlay.admin("GET", "/bans", Value::Null).await;
    assert_eq!(v["counts"]["added"], sent, "{sent} sent: {v}");
    inlay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_a_dir_that_cannot_be_opened_changes_nothing() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inlay.toml");
    let a = dir.path().join("a");
    let in_the_way = dir.path().join("a-file");
    std::fs::write(&in_the_way, "not a directory").unwrap();
    let inlay = Reloadable::start(&file, &config(&origin, dir.path(), &dir_line(&a))).await;
    assert!(fetched(&inlay, &origin, &object(3)).await);

    let errors = inlay
        .reload(&config(&origin, dir.path(), &dir_line(&in_the_way)))
        .await
        .expect_err("refused");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&format!(
            "cache.dir: cannot open {}: ",
            in_the_way.display()
        )),
        "{errors:?}"
    );
    // The old store still serves its hits, and the config is the old one.
    assert!(!fetched(&inlay, &origin, &object(3)).await);
    let (_, config_now) = inlay.admin("GET", "/config", Value::Null).await;
    assert_eq!(config_now["cache"]["dir"], a.display().to_string());
    assert_eq!(
        std::fs::read_to_string(&in_the_way).unwrap(),
        "not a directory"
    );
    inlay.stop().await;
}

/// With a policy, the runtime keeps a policy handle (and the host services
/// it was made with) per worker thread until that thread serves the next
/// generation: those must not keep the old store open, even when no
/// request comes after the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_policy_the_old_store_closes_though_no_request_follows() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inlay.toml");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let on = |d: &Path| {
        format!(
            "{}[policy]\npath = \"{}\"\n",
            config(&origin, dir.path(), &dir_line(d)),
            common::policy("default").display()
        )
    };
    let inlay = Reloadable::start(&file, &on(&a)).await;
    for i in 0..20 {
        assert!(fetched(&inlay, &origin, &object(i)).await);
    }
    inlay.reload(&on(&b)).await.expect("reloaded");
    inlay.reload_once_free(&on(&a)).await;
    assert!(!fetched(&inlay, &origin, &object(0)).await);
    inlay.stop().await;
}

//! Full reload: SIGHUP reads the config file again and applies it as a new
//! generation; a bad file changes nothing; requests in flight finish on
//! the generation they started on; listener addresses need a restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::{Inlay, Origin, get, policy, unused_port};

/// A whole config: the default backend at `origin`, `default_ttl`, the
/// named policy (at the default `cpu_time`: a hook is charged the CPU its
/// thread used, so one descheduled while a reload compiles a policy is not
/// stopped), then `extra` TOML.
fn config(origin: &Origin, ttl: &str, policy_name: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\nshutdown_timeout = \"10s\"\n\
         [backends.default]\naddress = \"{}\"\nfirst_byte_timeout = \"3s\"\n\
         [cache]\ndefault_ttl = \"{ttl}\"\ndefault_grace = \"0s\"\n\
         [policy]\npath = \"{}\"\n{extra}",
        origin.url(),
        policy(policy_name).display()
    )
}

/// Start inlay (on `origin`), then reload it to `text`, the config file
/// the test rewrites for its reloads.
fn spawn(origin: &Origin, text: &str) -> Inlay {
    let inlay = Inlay::builder().backend(origin).spawn_process();
    std::fs::write(&inlay.config, text).unwrap();
    // The builder's own file served until now: make `text` generation 2.
    inlay.reload_to(text, 2);
    inlay
}

/// The cached URL `path` answers from the cache after a first miss (a
/// long TTL), or goes to the origin every time (TTL 0): the origin's
/// count of `path` after two GETs.
async fn origin_sees_after_two_gets(inlay: &Inlay, origin: &Origin, path: &str) -> u64 {
    for _ in 0..2 {
        assert_eq!(get(&inlay.url(path)).await.status, 200);
    }
    origin.count(path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_fail_no_request_and_each_applies() {
    let (a, b) = (Origin::start(), Origin::start());
    // Two valid configs that differ in the backend, the TTL and the policy.
    // The hooks' CPU time is an epoch deadline, wall time: on a loaded
    // machine a debug build's hook may be off its core for 50 ms, which is
    // not what this test is about.
    let roomy = "cpu_time = \"2s\"\n";
    let config_a = config(&a, "1h", "headers", roomy);
    let config_b = config(&b, "0s", "default", roomy);
    let inlay = tokio::task::block_in_place(|| spawn(&a, &config_a));

    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU32::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut load = Vec::new();
    for w in 0..6u32 {
        let stop = stop.clone();
        let failed = failed.clone();
        let failures = failures.clone();
        let base = inlay.url("");
        load.push(tokio::spawn(async move {
            // Half the workers keep their connections alive, half open one
            // per request; hits (a small set of cached URLs) and misses.
            let kept = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let mut ok = 0u32;
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let path = if i.is_multiple_of(2) {
                    format!("/bytes/{}?cc=max-age=600", 1 + i % 8)
                } else {
                    format!("/bytes/{}?cc=no-store", 1 + i % 50)
                };
                let fresh;
                let client = if w.is_multiple_of(2) {
                    &kept
                } else {
                    fresh = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
                    &fresh
                };
                let req = http::Request::get(format!("{base}{path}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let why = match tokio::time::timeout(Duration::from_secs(10), client.request(req))
                    .await
                {
                    Ok(Ok(resp)) if resp.status() == 200 => {
                        match resp.into_body().collect().await {
                            Ok(_) => None,
                            Err(e) => Some(format!("body: {e:?}")),
                        }
                    }
                    Ok(Ok(resp)) => Some(format!("status {}", resp.status())),
                    Ok(Err(e)) => Some(format!("{e:?}")),
                    Err(_) => Some("timed out".into()),
                };
                match why {
                    None => ok += 1,
                    Some(why) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{path} (worker {w}): {why}"));
                    }
                }
            }
            ok
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for n in 0..20u64 {
        let text = if n.is_multiple_of(2) {
            &config_b
        } else {
            &config_a
        };
        tokio::task::block_in_place(|| inlay.reload_to(text, n + 3));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut ok = 0;
    for l in load {
        ok += l.await.unwrap();
    }
    let failed = failed.load(Ordering::Relaxed);
    assert_eq!(
        failed,
        0,
        "{failed} requests failed across 20 reloads ({ok} ok): {:?}\n{:#?}",
        failures.lock().unwrap(),
        inlay
            .log
            .all()
            .iter()
            .chain(inlay.access.all().iter())
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("\" 503 "))
            .collect::<Vec<_>>()
    );
    assert!(ok > 200, "only {ok} requests in the run");

    // The last reload applied config A: its backend, TTL and policy.
    let r = get(&inlay.url("/resp?after=a")).await;
    assert_eq!(r.header("x-inlay-policy"), Some("headers"));
    assert_eq!(
        origin_sees_after_two_gets(&inlay, &a, "/bytes/333").await,
        1
    );
    assert_eq!(b.count("/bytes/333").await, 0);
    // One more applies config B.
    tokio::task::block_in_place(|| inlay.reload_to(&config_b, 23));
    let r = get(&inlay.url("/resp?after=b")).await;
    assert_eq!(r.header("x-inlay-policy"), None);
    assert_eq!(
        origin_sees_after_two_gets(&inlay, &b, "/bytes/334").await,
        2
    );
    assert_eq!(a.count("/bytes/334").await, 0);
    // Each good reload said what changed.
    assert!(
        inlay
            .log
            .all()
            .iter()
            .any(|l| l.contains("generation 23 serves") && l.contains("backends,cache,policy")),
        "{}",
        inlay.log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_changes_nothing_and_every_error_is_logged() {
    let origin = Origin::start();
    let good = config(&origin, "1h", "headers", "");
    let inlay = tokio::task::block_in_place(|| spawn(&origin, &good));
    let bad = format!(
        "{}\n[esi]\nmax_depth = \"deep\"\n[log]\nlevel = \"=nope=\"\n",
        config(&origin, "soon", "default", "")
            .replace("first_byte_timeout = \"3s\"", "first_byte_timeout = \"-1\"")
    );
    std::fs::write(&inlay.config, &bad).unwrap();
    inlay.signal("HUP");
    inlay.expect_log(
        "config reload refused: nothing changed",
        Duration::from_secs(30),
    );
    let log = inlay.log.text();
    for key in [
        "cache.default_ttl: ",
        "backends.default.first_byte_timeout: ",
        "esi.max_depth: ",
        "log.level: ",
    ] {
        assert!(
            log.contains(&format!("config reload refused: {key}")),
            "no error for {key}:\n{log}"
        );
    }
    // Generation 2 (the good file) still serves, with its policy.
    assert_eq!(
        get(&inlay.url("/resp")).await.header("x-inlay-policy"),
        Some("headers")
    );
    // A policy that does not load is refused too.
    let broken = config(&origin, "1h", "default", "").replace(
        &policy("default").display().to_string(),
        "/nonexistent/policy.wasm",
    );
    std::fs::write(&inlay.config, &broken).unwrap();
    inlay.signal("HUP");
    inlay.expect_log(
        "config reload refused: policy.path",
        Duration::from_secs(30),
    );
    assert_eq!(
        get(&inlay.url("/resp")).await.header("x-inlay-policy"),
        Some("headers")
    );
    // And the next good file is generation 3.
    tokio::task::block_in_place(|| inlay.reload_to(&config(&origin, "1h", "default", ""), 3));
    assert_eq!(
        get(&inlay.url("/resp")).await.header("x-inlay-policy"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_listen_address_needs_a_restart_and_the_rest_applies() {
    let origin = Origin::start();
    let inlay =
        tokio::task::block_in_place(|| spawn(&origin, &config(&origin, "1h", "headers", "")));
    let port = unused_port();
    let moved =
        config(&origin, "1h", "default", "").replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    tokio::task::block_in_place(|| inlay.reload_to(&moved, 3));
    inlay.expect_log(
        "server.listen changed: needs a restart",
        Duration::from_secs(5),
    );
    // Still on the old address only; the policy change applied.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert_eq!(
        get(&inlay.url("/resp")).await.header("x-inlay-policy"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_on_the_backend_it_started_with() {
    let (a, b) = (Origin::start(), Origin::start());
    let inlay = tokio::task::block_in_place(|| spawn(&a, &config(&a, "1h", "headers", "")));
    let url = inlay.url("/bytes/100?delay_ms=1500&cc=no-store");
    let slow = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| inlay.reload_to(&config(&b, "1h", "default", ""), 3));
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100);
    // Its policy was the old generation's too.
    assert_eq!(r.header("x-inlay-policy"), Some("headers"));
    assert_eq!(a.count("/bytes/100").await, 1);
    assert_eq!(b.count("/bytes/100").await, 0);
    // New requests go to the new backend.
    assert_eq!(get(&inlay.url("/bytes/100?cc=no-store")).await.status, 200);
    assert_eq!(b.count("/bytes/100").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_level_applies_on_reload() {
    let origin = Origin::start();
    // An INLAY_LOG that does not parse leaves the filter to `log.level`.
    let inlay = Inlay::builder()
        .backend(&origin)
        .env("INLAY_LOG", "=not a filter=")
        .spawn_process();
    let base = config(&origin, "1h", "default", "");
    // Generation 2 at `warn`: its own "config reloaded" line (info) is not
    // written; the warning about the listener is.
    let quiet = format!(
        "{}\n[log]\nlevel = \"warn\"\n",
        base.replace("127.0.0.1:0", "127.0.0.1:1")
    );
    std::fs::write(&inlay.config, &quiet).unwrap();
    inlay.signal("HUP");
    inlay.expect_log("server.listen changed", Duration::from_secs(60));
    // Generation 3 back at `info`: its line is written.
    tokio::task::block_in_place(|| inlay.reload_to(&base, 3));
    assert!(
        !inlay.log.text().contains("generation 2 serves"),
        "{}",
        inlay.log.text()
    );
}

/// Wait until the file at `path` has a line containing `needle`.
fn file_has(path: &std::path::Path, needle: &str) -> bool {
    for _ in 0..250 {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reopens_a_rotated_access_log() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!("[log]\naccess_log = \"{}\"", log.display()))
        .spawn_process();
    assert_eq!(get(&inlay.url("/resp?before")).await.status, 200);
    assert!(tokio::task::block_in_place(|| file_has(
        &log,
        "/resp?before"
    )));
    // What logrotate does: move the file, then SIGHUP.
    std::fs::rename(&log, &rotated).unwrap();
    let text = std::fs::read_to_string(&inlay.config).unwrap();
    tokio::task::block_in_place(|| inlay.reload_to(&text, 2));
    assert_eq!(get(&inlay.url("/resp?after")).await.status, 200);
    assert!(tokio::task::block_in_place(|| file_has(
        &log,
        "/resp?after"
    )));
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(
        old.contains("/resp?before") && !old.contains("/resp?after"),
        "{old}"
    );
}

/// A keep-alive connection that has had one answer.
async fn open_connection(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(ask(&mut s, Duration::from_secs(10)).await, Some(200));
    s
}

/// One GET on `s`: the status of the whole answer, or `None` when the
/// server closed the connection or did not answer within `within`.
async fn ask(s: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /bytes/10 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            // The answer's head, then its 10 bytes of body.
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n")
                && got.len() >= end + 4 + 10
            {
                let status = std::str::from_utf8(&got[9..12]).ok()?.parse().ok();
                return status;
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limits_apply_to_the_open_listeners() {
    let origin = Origin::start();
    let limits = |total: usize, per_client: usize| {
        config(&origin, "1h", "default", "").replace(
            "shutdown_timeout = \"10s\"\n",
            &format!(
                "shutdown_timeout = \"10s\"\nmax_connections = {total}\n\
                 max_connections_per_client = {per_client}\n\
                 idle_timeout = \"60s\"\nbusy_idle_timeout = \"60s\"\n"
            ),
        )
    };
    let inlay = tokio::task::block_in_place(|| spawn(&origin, &limits(100, 100)));
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(open_connection(inlay.addr).await);
    }
    // A lower share per address: the three open ones go on, a fourth is
    // refused (held unanswered, then closed).
    tokio::task::block_in_place(|| inlay.reload_to(&limits(100, 2), 3));
    assert!(
        !inlay.log.text().contains("needs a restart"),
        "{}",
        inlay.log.text()
    );
    let mut fourth = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    assert_eq!(ask(&mut fourth, Duration::from_secs(2)).await, None);
    assert_eq!(ask(&mut held[0], Duration::from_secs(10)).await, Some(200));
    // Raised again: a fourth is served.
    tokio::task::block_in_place(|| inlay.reload_to(&limits(100, 4), 4));
    held.push(open_connection(inlay.addr).await);
    // Two slots in all while four are open: the next connection waits in
    // the backlog until three of the four have closed (the first two slots
    // given back go with the limit lowered below what was open).
    tokio::task::block_in_place(|| inlay.reload_to(&limits(2, 100), 5));
    inlay.expect_log("server.max_connections applied", Duration::from_secs(10));
    held.truncate(2);
    let mut waiting = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    assert_eq!(ask(&mut waiting, Duration::from_secs(1)).await, None);
    held.truncate(1);
    // Answered once a third one has closed (the request waits in the socket).
    let mut answer = [0u8; 12];
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_exact(&mut waiting, &mut answer),
    )
    .await
    .expect("answered once three connections closed")
    .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
}

/// Threads of `inlay` named `name` (each policy engine has one epoch
/// ticker, `inlay-epoch`, that stops when the engine is dropped).
fn threads_named(inlay: &Inlay, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", inlay.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Waits (a bounded while) until `inlay` has `n` engines.
fn engines_become(inlay: &Inlay, n: usize) -> bool {
    for _ in 0..250 {
        if threads_named(inlay, "inlay-epoch") == n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `inlay_policy_pool_size` in a scrape of the admin listener's `/metrics`.
async fn pool_size(admin: &str) -> u64 {
    let text = get(&format!("http://{admin}/metrics")).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix("inlay_policy_pool_size ")?.parse().ok())
        .unwrap_or_else(|| panic!("no inlay_policy_pool_size in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_instances_applies_on_reload_and_the_old_pool_goes() {
    let origin = Origin::start();
    let sized = |n: u32| config(&origin, "1h", "headers", &format!("max_instances = {n}\n"));
    let inlay = tokio::task::block_in_place(|| {
        let inlay = Inlay::builder()
            .backend(&origin)
            .arg("--admin")
            .arg("127.0.0.1:0")
            .spawn_process();
        std::fs::write(&inlay.config, sized(3)).unwrap();
        inlay.reload_to(&sized(3), 2);
        inlay
    });
    let admin = {
        const LINE: &str = "admin API listening on http://";
        let log = inlay.log.text();
        let rest = log.split(LINE).nth(1).expect("an admin listener");
        rest.split_whitespace().next().unwrap().to_owned()
    };
    assert_eq!(pool_size(&admin).await, 3);
    // Twenty resizes, each with requests on the new pool.
    for n in 0..20u64 {
        let size = if n.is_multiple_of(2) { 5 } else { 3 };
        tokio::task::block_in_place(|| inlay.reload_to(&sized(size), n + 3));
        assert_eq!(pool_size(&admin).await, u64::from(size));
        for i in 0..4 {
            let r = get(&inlay.url(&format!("/resp?n={n}&i={i}"))).await;
            assert_eq!(r.header("x-inlay-policy"), Some("headers"));
        }
    }
    // One more, with no request after it: the worker threads that served
    // the last generation must not keep its pool.
    tokio::task::block_in_place(|| inlay.reload_to(&sized(5), 23));
    assert!(
        !inlay.log.text().contains("policy.max_instances changed"),
        "{}",
        inlay.log.text()
    );
    // Only the last pool is left: the others went with their requests.
    assert!(
        tokio::task::block_in_place(|| engines_become(&inlay, 1)),
        "{} epoch threads after 21 resizes",
        threads_named(&inlay, "inlay-epoch")
    );

    // A pool the address space cannot hold is refused; nothing changes.
    std::fs::write(&inlay.config, sized(100_000)).unwrap();
    inlay.signal("HUP");
    inlay.expect_log(
        "config reload refused: policy.max_instances: cannot make a pool of 100000",
        Duration::from_secs(60),
    );
    assert_eq!(pool_size(&admin).await, 5);
    let r = get(&inlay.url("/resp?after")).await;
    assert_eq!(r.header("x-inlay-policy"), Some("headers"));
    assert_eq!(threads_named(&inlay, "inlay-epoch"), 1);

    // No policy, then a policy again with another pool size.
    let none = sized(5);
    let none = &none[..none.find("[policy]").unwrap()];
    tokio::task::block_in_place(|| inlay.reload_to(none, 24));
    assert_eq!(
        get(&inlay.url("/resp?none")).await.header("x-inlay-policy"),
        None
    );
    tokio::task::block_in_place(|| inlay.reload_to(&sized(4), 25));
    let r = get(&inlay.url("/resp?again")).await;
    assert_eq!(r.header("x-inlay-policy"), Some("headers"));
    assert_eq!(pool_size(&admin).await, 4);
    assert!(tokio::task::block_in_place(|| engines_become(&inlay, 1)));
}

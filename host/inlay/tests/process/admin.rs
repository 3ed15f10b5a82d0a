//! The admin API with the real binary: `inlay admin` against `inlay
//! serve`, readiness across SIGTERM, and the refusal of a public admin
//! address without a token.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::{Inlay, Origin, get, unused_port};

fn inlay() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inlay"))
}

/// The admin API's address, from its "admin API listening on" line.
pub(crate) fn admin_addr(inlay: &Inlay) -> SocketAddr {
    const LINE: &str = "admin API listening on http://";
    inlay.expect_log(LINE, Duration::from_secs(10));
    let log = inlay.log.text();
    let rest = log.split(LINE).nth(1).unwrap();
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

/// `inlay admin --address ADDR ARGS`, run off the runtime's threads.
pub(crate) fn admin_cli(addr: SocketAddr, args: &[&str]) -> Output {
    tokio::task::block_in_place(|| {
        inlay()
            .args(["admin", "--address", &addr.to_string()])
            .args(args)
            .output()
            .unwrap()
    })
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inlay_admin_purge_makes_the_next_request_a_miss() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "s3cret-admin-token\n").unwrap();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!("[admin]\ntoken_file = \"{}\"", token.display()))
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let addr = admin_addr(&inlay);
    let token_file = token.display().to_string();
    let with_token = |args: &[&str]| {
        let mut all = vec!["--token-file", token_file.as_str()];
        all.extend_from_slice(args);
        admin_cli(addr, &all)
    };
    let path = "/bytes/100?cc=max-age%3D60";
    get(&inlay.url(path)).await;
    get(&inlay.url(path)).await;
    assert_eq!(origin.count("/bytes/100").await, 1, "cached");
    let out = with_token(&["purge", &inlay.url(path)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["purged"], 1, "{answer}");
    get(&inlay.url(path)).await;
    assert_eq!(
        origin.count("/bytes/100").await,
        2,
        "a miss after the purge"
    );
    // Stats, and the probes, which need no token.
    let out = with_token(&["stats"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["state"], "ready", "{stats}");
    assert!(admin_cli(addr, &["ready"]).status.success());
    // An error answer: exit 1, the message on stderr.
    let out = admin_cli(addr, &["stats"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no token: {}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let out = with_token(&["purge", "/no-host"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("host"), "{}", text(&out.stderr));
    // The other subcommands reach their routes.
    let out = with_token(&["purge-key", "k1", "k2", "--soft"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("keys k1 k2"),
        "{}",
        text(&out.stdout)
    );
    let out = with_token(&["config"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["admin"]["token_file"], "<redacted>", "{config}");
    for args in [
        &["metrics"][..],
        &["ban", "req.url", "~", "^/products/"],
        &["bans"],
        &["reload"],
    ] {
        // Answered by the route (501 while the part is not wired in),
        // never a wrong path or method.
        let out = with_token(args);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            !err.contains("404") && !err.contains("405"),
            "{args:?}: {err}"
        );
    }
    // Nobody there, or no such subcommand: exit 2.
    let nobody: SocketAddr = format!("127.0.0.1:{}", unused_port()).parse().unwrap();
    let out = admin_cli(nobody, &["health"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot connect"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(admin_cli(addr, &["frobnicate"]).status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_on_sigterm_while_a_slow_request_drains() {
    let origin = Origin::start();
    let mut inlay = Inlay::builder()
        .backend(&origin)
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let addr = admin_addr(&inlay);
    let readyz = format!("http://{addr}/readyz");
    // The admin API listens before the cache has opened: ready soon after.
    let start = Instant::now();
    while get(&readyz).await.status != 200 {
        assert!(start.elapsed() < Duration::from_secs(10), "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let url = inlay.url("/bytes/100?delay_ms=2000");
    let slow = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    inlay.signal("TERM");
    // The answer changes at the signal, not at the end of the drain.
    let start = Instant::now();
    let mut status = 200;
    while start.elapsed() < Duration::from_secs(2) && status == 200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = get(&readyz).await.status;
    }
    assert_eq!(status, 503, "readyz after SIGTERM");
    assert!(!slow.is_finished(), "the slow request is still draining");
    assert_eq!(get(&format!("http://{addr}/healthz")).await.status, 200);
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200, "the drained request finished");
    let st =
        tokio::task::block_in_place(|| inlay.wait(Duration::from_secs(10))).expect("inlay exited");
    assert!(st.success(), "exit status {st:?}\n{}", inlay.log.text());
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the admin listener closed with the proxy"
    );
}

#[test]
fn a_public_admin_address_without_a_token_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let public = dir.path().join("public.toml");
    std::fs::write(
        &public,
        "[backends.web]\naddress = \"http://127.0.0.1:1\"\n[admin]\nlisten = \"0.0.0.0:6082\"\n",
    )
    .unwrap();
    let out = inlay()
        .args(["check", "--config"])
        .arg(&public)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("admin.listen"),
        "{}",
        text(&out.stderr)
    );
    let out = inlay()
        .args(["serve", "--config"])
        .arg(&public)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("admin.listen"),
        "{}",
        text(&out.stderr)
    );
    let out = inlay()
        .args(["serve", "-b", "http://127.0.0.1:1", "--admin", ":6082"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--admin"),
        "{}",
        text(&out.stderr)
    );
    // An empty token file stops start-up with its name.
    let empty = dir.path().join("empty.token");
    std::fs::write(&empty, "\n").unwrap();
    let guarded = dir.path().join("guarded.toml");
    std::fs::write(
        &guarded,
        format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n[backends.web]\naddress = \"http://127.0.0.1:1\"\n[admin]\nlisten = \"0.0.0.0:0\"\ntoken_file = \"{}\"\n",
            empty.display()
        ),
    )
    .unwrap();
    for command in ["serve", "check"] {
        let out = inlay()
            .args([command, "--config"])
            .arg(&guarded)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{command}");
        assert!(
            text(&out.stderr).contains("admin.token_file") && text(&out.stderr).contains("empty"),
            "{command}: {}",
            text(&out.stderr)
        );
    }
    std::fs::write(&empty, "tok\n").unwrap();
    let out = inlay()
        .args(["check", "--config"])
        .arg(&guarded)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The operator's day through `inlay admin`: a ban that the next start
/// still honours after kill -9, and reloads of the config file, a bad one
/// refused with its errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_and_reloads_through_inlay_admin() {
    use crate::common::get_site;
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache").display().to_string();
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let addr = admin_addr(&inlay);
    let json = "/bytes/121?cc=max-age%3D600&ct=application%2Fjson";
    let html = "/bytes/122?cc=max-age%3D600&ct=text%2Fhtml";
    get_site(&inlay.url(json)).await;
    get_site(&inlay.url(html)).await;

    // A reload of the same file is the next generation; a bad file is
    // refused with each error, and the running generation stays.
    let out = admin_cli(addr, &["reload"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        inlay.log.text()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["generation"], 2, "{report}");
    let good = std::fs::read_to_string(&inlay.config).unwrap();
    std::fs::write(
        &inlay.config,
        format!("{good}\n[esi]\nmax_depth = \"deep\"\n[nonsense]\nx = 1\n"),
    )
    .unwrap();
    let out = admin_cli(addr, &["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let why = text(&out.stderr);
    assert!(
        why.contains("esi.max_depth") && why.contains("nonsense"),
        "{why}"
    );
    std::fs::write(&inlay.config, good).unwrap();
    assert_eq!(get_site(&inlay.url(html)).await.status, 200);

    // sled fsyncs every 500 ms: let the objects reach the disk.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let expression = "req.url ~ ^/bytes/12 && obj.http.content-type ~ json";
    let out = admin_cli(addr, &["ban", expression]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Listed until the lurker has tested every older object (then dropped).
    let out = admin_cli(addr, &["bans"]);
    let bans: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(bans["counts"]["added"], 1, "{bans}");
    let out = admin_cli(addr, &["ban", "req.url ~ ("]);
    assert_eq!(out.status.code(), Some(1));
    // Killed as soon as the ban is acknowledged.
    inlay.signal("KILL");
    drop(inlay);
    let restarted = Inlay::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://127.0.0.1:{}\"",
            unused_port()
        ))
        .arg("--cache-dir")
        .arg(&cache)
        .spawn_process();
    assert_eq!(
        get_site(&restarted.url(html)).await.status,
        200,
        "not banned: kept"
    );
    assert_eq!(
        get_site(&restarted.url(json)).await.status,
        503,
        "a banned object must not come back"
    );
}

/// The value of one sample (`name` with its labels, as printed) in an
/// OpenMetrics text, 0 when absent.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A Prometheus scrape of the real binary after a load run agrees with the
/// access log it wrote for the same requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_a_load_run_agrees_with_the_access_log() {
    use crate::common::request;
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml("[log]\naccess_log_format = \"json\"")
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let admin = admin_addr(&inlay);
    // 8 clients, 40 requests each: 20 cacheable URLs (misses, then hits),
    // passes (POST) and uncacheable answers.
    let mut tasks = Vec::new();
    for c in 0..8 {
        let base = inlay.url("");
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let r = match i % 4 {
                    3 => request("POST", &format!("{base}/resp?c={c}"), &[], "body".into()).await,
                    2 => get(&format!("{base}/resp?cc=no-store&i={i}")).await,
                    _ => get(&format!("{base}/resp?cc=max-age%3D600&u={}", i % 20)).await,
                };
                assert_eq!(r.status, 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = 8 * 40;
    assert!(
        inlay.access.wait_for_count(total, Duration::from_secs(10)),
        "{} access-log lines of {total}",
        inlay.access.all().len()
    );
    let lines: Vec<serde_json::Value> = inlay
        .access
        .all()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |cache: &str| lines.iter().filter(|l| l["cache"] == cache).count() as u64;

    // The scrape, over HTTP as Prometheus does it.
    let scrape = get(&format!("http://{admin}/metrics")).await;
    assert_eq!(scrape.status, 200);
    assert!(
        scrape
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        scrape.headers
    );
    let text = scrape.text();
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    assert_eq!(
        sample(&text, "inlay_client_requests_total{protocol=\"http/1.1\"}"),
        total as u64
    );
    for (series, cache) in [
        ("inlay_cache_hits_total", "hit"),
        ("inlay_cache_misses_total", "miss"),
        ("inlay_cache_passes_total", "pass"),
    ] {
        assert_eq!(sample(&text, series), count(cache), "{series}\n{text}");
    }
    assert!(count("hit") > 0 && count("miss") > 0 && count("pass") > 0);
    let bytes: u64 = lines.iter().map(|l| l["bytes"].as_u64().unwrap()).sum();
    assert_eq!(
        sample(&text, "inlay_client_response_body_bytes_total"),
        bytes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_rotates_the_admin_token_and_switches_metrics() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (dir.path().join("old.token"), dir.path().join("new.token"));
    std::fs::write(&old, "old-token\n").unwrap();
    std::fs::write(&new, "new-token\n").unwrap();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!("[admin]\ntoken_file = \"{}\"", old.display()))
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let addr = admin_addr(&inlay);
    let stats_with = |token: &std::path::Path| {
        admin_cli(
            addr,
            &["--token-file", &token.display().to_string(), "stats"],
        )
        .status
        .success()
    };
    assert!(stats_with(&old) && !stats_with(&new));
    let requests = || {
        let out = admin_cli(
            addr,
            &["--token-file", &new.display().to_string(), "metrics"],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        sample(
            &text(&out.stdout),
            "inlay_client_requests_total{protocol=\"http/1.1\"}",
        )
    };
    let first = std::fs::read_to_string(&inlay.config).unwrap();
    let rotated = first.replace("old.token", "new.token");
    // The token file the config names is read again: the old token is refused.
    tokio::task::block_in_place(|| inlay.reload_to(&rotated, 2));
    assert!(stats_with(&new) && !stats_with(&old));
    // Metrics off: requests are no longer counted; on again: they are.
    get(&inlay.url("/resp")).await;
    let counted = requests();
    assert!(counted >= 1);
    tokio::task::block_in_place(|| {
        inlay.reload_to(&format!("{rotated}\n[metrics]\nenabled = false\n"), 3)
    });
    get(&inlay.url("/resp")).await;
    assert_eq!(requests(), counted, "counted while off");
    tokio::task::block_in_place(|| inlay.reload_to(&rotated, 4));
    get(&inlay.url("/resp")).await;
    assert_eq!(requests(), counted + 1);
    // A token file that cannot be read refuses the reload: the token stays.
    std::fs::remove_file(&new).unwrap();
    std::fs::write(&inlay.config, &rotated).unwrap();
    inlay.signal("HUP");
    inlay.expect_log(
        "config reload refused: admin.token_file",
        Duration::from_secs(60),
    );
    std::fs::write(&new, "new-token\n").unwrap();
    assert!(stats_with(&new));
}

//! Backends, in process against real origins: `https://` origins made by
//! the test (its own CA, rcgen; tokio-rustls), verification, SNI, client
//! certificates and HTTP/2 to the origin.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{Harness, Origin, TestCa, TlsOrigin, get};
use inlay::config::Config;
use inlay::startup::resolve;

/// `[backends.default]` at `address` with extra `lines`.
fn backend(address: &str, lines: &str) -> String {
    format!(
        "[backends.default]\naddress = \"{address}\"\nconnect_timeout = \"2s\"\nfirst_byte_timeout = \"3s\"\n{lines}\n"
    )
}

fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

async fn inlay_with(address: &str, lines: &str) -> Harness {
    Harness::builder()
        .toml(&backend(address, lines))
        .start_in_process()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_backend_trusted_through_ca_file_is_fetched_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test origin CA");
    let origin = TlsOrigin::start(&ca.issue(&["127.0.0.1"]), None).await;
    let ca_file = ca.write(dir.path(), "ca.pem");
    let inlay = inlay_with(&origin.url(), &format!("ca_file = {}", toml_path(&ca_file))).await;
    let r = get(&inlay.url("/page")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "hello over tls\n");
    assert_eq!(
        r.header("x-version"),
        Some("HTTP/1.1"),
        "no http2: HTTP/1.1"
    );
    assert_eq!(r.header("x-client-cert"), Some("no"));
    // A second request reuses the pooled TLS connection: still fine.
    assert_eq!(get(&inlay.url("/again")).await.status, 200);
    assert_eq!(origin.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_whose_certificate_does_not_verify_gets_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("unknown CA");
    let origin = TlsOrigin::start(&ca.issue(&["127.0.0.1"]), None).await;
    // The system's roots do not know the test's CA.
    let system = inlay_with(&origin.url(), "").await;
    let r = get(&system.url("/page")).await;
    assert_eq!(r.status, 503, "a verification failure is a down backend");
    // Nor does another CA given as ca_file.
    let other = TestCa::new("another CA").write(dir.path(), "other.pem");
    let wrong = inlay_with(&origin.url(), &format!("ca_file = {}", toml_path(&other))).await;
    assert_eq!(get(&wrong.url("/page")).await.status, 503);
    assert_eq!(
        origin.requests(),
        0,
        "no request went over an unverified connection"
    );
    // The origin's side of a handshake ends when it reads the client's
    // alert, which may come after Inlay has answered its own client.
    let failed = || {
        origin
            .failed_handshakes
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while failed() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        failed() >= 2,
        "the client aborted the handshakes: {}",
        failed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_with_a_self_signed_ca_certificate_given_as_its_ca_file_is_fetched() {
    let dir = tempfile::tempdir().unwrap();
    // What `openssl req -x509 ... -addext subjectAltName=IP:127.0.0.1`
    // makes: self-signed, and flagged as a CA.
    let own = common::self_signed_ca(&["127.0.0.1"]);
    let origin = TlsOrigin::start(&own, None).await;
    let (ca_file, _) = own.write(dir.path(), "origin");
    let inlay = inlay_with(&origin.url(), &format!("ca_file = {}", toml_path(&ca_file))).await;
    let r = get(&inlay.url("/page")).await;
    assert_eq!(r.status, 200, "pinned: {}", r.text());
    assert_eq!(r.text(), "hello over tls\n");
    assert_eq!(origin.requests(), 1);
    // Pinned, its name is still checked: as another name, refused.
    let misnamed = inlay_with(
        &origin.url(),
        &format!(
            "ca_file = {}\nhost_header = \"origin.example\"",
            toml_path(&ca_file)
        ),
    )
    .await;
    assert_eq!(get(&misnamed.url("/page")).await.status, 503);
    // Another self-signed certificate in ca_file pins nothing.
    let (other, _) = common::self_signed_ca(&["127.0.0.1"]).write(dir.path(), "other");
    let wrong = inlay_with(&origin.url(), &format!("ca_file = {}", toml_path(&other))).await;
    assert_eq!(get(&wrong.url("/page")).await.status, 503);
    assert_eq!(
        origin.requests(),
        1,
        "no request over an unverified connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_and_verification_follow_the_host_header_override() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test origin CA");
    // Valid for the site's name only, not for the address connected to.
    let origin = TlsOrigin::start(&ca.issue(&["origin.test"]), None).await;
    let ca_file = toml_path(&ca.write(dir.path(), "ca.pem"));
    let named = inlay_with(
        &origin.url(),
        &format!("ca_file = {ca_file}\nhost_header = \"origin.test:443\""),
    )
    .await;
    let r = get(&named.url("/page")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-sni"),
        Some("origin.test"),
        "SNI is host_header's host"
    );
    assert_eq!(r.header("x-host"), Some("origin.test:443"));
    // Without the override the certificate is checked against 127.0.0.1.
    let by_address = inlay_with(&origin.url(), &format!("ca_file = {ca_file}")).await;
    assert_eq!(get(&by_address.url("/page")).await.status, 503);
    assert_eq!(origin.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_shown_to_an_origin_that_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test origin CA");
    let clients = TestCa::new("client CA");
    let origin = TlsOrigin::start(&ca.issue(&["127.0.0.1"]), Some(&clients)).await;
    let ca_file = toml_path(&ca.write(dir.path(), "ca.pem"));
    let (cert, key) = clients.issue(&["inlay.test"]).write(dir.path(), "client");
    let with_cert = inlay_with(
        &origin.url(),
        &format!(
            "ca_file = {ca_file}\nclient_cert = {}\nclient_key = {}",
            toml_path(&cert),
            toml_path(&key)
        ),
    )
    .await;
    let r = get(&with_cert.url("/page")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-client-cert"), Some("yes"));
    let without = inlay_with(&origin.url(), &format!("ca_file = {ca_file}")).await;
    let r = get(&without.url("/page")).await;
    assert!(
        r.status == 502 || r.status == 503,
        "the origin refused the handshake: {}",
        r.status
    );
    assert_eq!(
        origin.requests(),
        1,
        "only the request with a certificate was served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_spoken_to_an_origin_that_offers_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test origin CA");
    let origin = TlsOrigin::start(&ca.issue(&["127.0.0.1"]), None).await;
    let ca_file = toml_path(&ca.write(dir.path(), "ca.pem"));
    let inlay = inlay_with(&origin.url(), &format!("ca_file = {ca_file}\nhttp2 = true")).await;
    for path in ["/a", "/b"] {
        let r = get(&inlay.url(path)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-version"), Some("HTTP/2.0"));
        assert_eq!(r.header("x-sni"), Some("none"), "no SNI for an IP address");
    }
    // An origin that offers only HTTP/1.1 is spoken to in HTTP/1.1.
    let http1 = TlsOrigin::start_with_alpn(&ca.issue(&["127.0.0.1"]), None, &[b"http/1.1"]).await;
    let inlay = inlay_with(&http1.url(), &format!("ca_file = {ca_file}\nhttp2 = true")).await;
    let r = get(&inlay.url("/c")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-version"), Some("HTTP/1.1"));
    // A plain origin with http2: h2c with prior knowledge.
    let plain = Origin::start();
    let h2c = inlay_with(&plain.url(), "http2 = true").await;
    let r = get(&h2c.url("/echo")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(echo["version"], "HTTP/2.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_stalls_or_garbles_the_handshake_is_down_within_connect_timeout() {
    // One accepts and says nothing; the other answers the ClientHello with junk.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let garbling = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbling_addr = garbling.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = garbling.accept().await {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\nnot tls at all").await;
        }
    });
    let stalled = Harness::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"https://{silent_addr}\"\nconnect_timeout = \"300ms\"\nfirst_byte_timeout = \"20s\"\n"
        ))
        .start_in_process()
        .await;
    let started = std::time::Instant::now();
    let r = get(&stalled.url("/page")).await;
    assert_eq!(
        r.status, 503,
        "a stalled handshake is a down backend, not a 504"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "connect_timeout bounds the handshake, not first_byte_timeout"
    );
    let garbled = inlay_with(&format!("https://{garbling_addr}"), "").await;
    assert_eq!(get(&garbled.url("/page")).await.status, 503);
}

#[test]
fn tls_settings_are_checked_with_their_key_paths() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n").unwrap();
    let junk = toml_path(&junk);
    let missing = toml_path(&dir.path().join("missing.pem"));
    let lines = |err: inlay::config::ConfigError| err.to_string();
    let said = |msg: &str, path: &str, says: &str| {
        let line = msg
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{path}:")))
            .unwrap_or_else(|| panic!("no error for {path} in:\n{msg}"));
        assert!(line.contains(says), "{path}: {line}");
    };
    // What the file says is checked when it is read...
    let text = format!(
        "[backends.plain]\naddress = \"http://127.0.0.1:1\"\nca_file = \"ca.pem\"\n\
         [backends.tls]\naddress = \"https://127.0.0.1:1\"\nca_file = {junk}\nhttp2 = \"yes\"\n\
         [backends.missing]\naddress = \"https://127.0.0.1:1\"\n\
         keepalive_timeout = \"0s\"\nmax_idle_connections = -1\n\
         [backends.ftp]\naddress = \"ftp://127.0.0.1:1\"\n"
    );
    let msg =
        lines(Config::from_toml(&format!("default_backend = \"plain\"\n{text}")).unwrap_err());
    for (path, says) in [
        ("backends.plain.ca_file", "only for https:// backends"),
        ("backends.tls.http2", "expected true or false"),
        ("backends.ftp.address", "http:// or https://"),
        ("backends.missing.keepalive_timeout", "more than zero"),
        ("backends.missing.max_idle_connections", "integer"),
    ] {
        said(&msg, path, says);
    }
    // ... and the files it names when it is resolved (as a start, a reload
    // and `inlay check` do): every one, with its key path.
    let files = Config::from_toml(&format!(
        "default_backend = \"tls\"\n\
         [backends.tls]\naddress = \"https://127.0.0.1:1\"\nca_file = {junk}\nclient_cert = {junk}\n\
         [backends.missing]\naddress = \"https://127.0.0.1:1\"\nca_file = {missing}\n"
    ))
    .expect("the file itself is valid");
    let msg = lines(resolve(files).unwrap_err());
    for (path, says) in [
        ("backends.tls.ca_file", "bad PEM"),
        ("backends.tls.client_key", "missing"),
        ("backends.missing.ca_file", "cannot read"),
    ] {
        said(&msg, path, says);
    }
    // An https:// backend without ca_file trusts the system's roots.
    let ok = Config::from_toml("[backends.default]\naddress = \"https://example.com\"\n").unwrap();
    let ok = resolve(ok).expect("the system's roots load");
    assert_eq!(
        ok.backend_tls["default"].server_name().to_str(),
        "example.com"
    );
    // `-b https://...` makes the default backend a TLS one, and back.
    let mut c =
        Config::from_toml("[backends.default]\naddress = \"http://127.0.0.1:1\"\n").unwrap();
    let flag = |url: &str| inlay::config::Overrides {
        backend: Some(url.into()),
        ..Default::default()
    };
    c.apply_overrides(&flag("https://origin.test:8443"))
        .unwrap();
    let tls = resolve(c.clone()).expect("resolved");
    assert_eq!(
        tls.backend_tls["default"].server_name().to_str(),
        "origin.test"
    );
    c.apply_overrides(&flag("http://127.0.0.1:2")).unwrap();
    assert!(c.default_backend().tls.is_none());
}

/// An origin whose health check the test turns on and off: `/health`
/// answers 200 or 503; `/obj` is `v1`, `v2`, ... with no freshness and
/// five minutes of grace (every hit is stale in grace); `/kept` is `k1`,
/// ... with neither freshness nor grace, kept five minutes for
/// stale-if-error; `/pass` is not cacheable. It counts requests per path.
struct SwitchedOrigin {
    addr: std::net::SocketAddr,
    well: Arc<AtomicBool>,
    counts: Arc<Mutex<HashMap<String, u64>>>,
}

impl SwitchedOrigin {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let well = Arc::new(AtomicBool::new(true));
        let counts = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
        let (w, c) = (well.clone(), counts.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (w, c) = (w.clone(), c.clone());
                let service = hyper::service::service_fn(move |req: http::Request<_>| {
                    let path = req.uri().path().to_owned();
                    let n = {
                        let mut counts = c.lock().unwrap();
                        let n = counts.entry(path.clone()).or_insert(0);
                        *n += 1;
                        *n
                    };
                    let (status, cc, body) = match path.as_str() {
                        "/health" if w.load(Ordering::SeqCst) => (200, "no-store", "ok".into()),
                        "/health" => (503, "no-store", "down".into()),
                        "/obj" => (
                            200,
                            "max-age=0, stale-while-revalidate=300",
                            format!("v{n}"),
                        ),
                        "/kept" => (
                            200,
                            "max-age=0, stale-while-revalidate=0, stale-if-error=300",
                            format!("k{n}"),
                        ),
                        _ => (200, "no-store", "passed".to_owned()),
                    };
                    let resp = http::Response::builder()
                        .status(status)
                        .header("cache-control", cc)
                        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                        .unwrap();
                    std::future::ready(Ok::<_, std::convert::Infallible>(resp))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        Self { addr, well, counts }
    }

    fn count(&self, path: &str) -> u64 {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The value of the sample `name` (with its labels), 0 when absent.
async fn metric(inlay: &Harness, name: &str) -> u64 {
    let text = inlay.metrics.render().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// `inlay_backend_healthy{backend="default"}` as the metrics say.
async fn healthy_gauge(inlay: &Harness) -> Option<bool> {
    let text = inlay.metrics.render().await;
    let line = text
        .lines()
        .find(|l| l.starts_with("inlay_backend_healthy{backend=\"default\"}"))?;
    Some(line.ends_with(" 1"))
}

/// Waits (at most 10 s) for the default backend's health to be `want`.
async fn wait_health(inlay: &Harness, want: bool) {
    for _ in 0..1000 {
        if healthy_gauge(inlay).await == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the backend did not become healthy={want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sick_backend_gets_no_requests_and_its_objects_are_served_in_grace() {
    let origin = SwitchedOrigin::start().await;
    let window = 3;
    let inlay = Harness::builder()
        .toml(&format!(
            "[backends.default]\naddress = \"http://{}\"\n\
             [backends.default.probe]\nurl = \"/health\"\ninterval = \"50ms\"\ntimeout = \"1s\"\n\
             window = {window}\nthreshold = 2\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            origin.addr
        ))
        .start_in_process()
        .await;
    wait_health(&inlay, true).await;
    let r = get(&inlay.url("/obj")).await;
    assert_eq!((r.status, r.text().as_str()), (200, "v1"));
    let r = get(&inlay.url("/kept")).await;
    assert_eq!((r.status, r.text().as_str()), (200, "k1"));

    origin.well.store(false, Ordering::SeqCst);
    let before = origin.count("/health");
    wait_health(&inlay, false).await;
    let probes = origin.count("/health") - before;
    assert!(
        probes <= window + 1,
        "sick within the window: {probes} probes (one may have been in flight)"
    );
    let stats: serde_json::Value =
        serde_json::from_slice(&get(&inlay.admin_url("/stats")).await.body).unwrap();
    let health = &stats["backends"]["default"];
    assert_eq!(health["healthy"], false, "{stats}");
    assert_eq!(health["last"], "status 503", "{stats}");

    // In grace: served stale, and no refresh goes to the sick backend.
    let r = get(&inlay.url("/obj")).await;
    assert_eq!((r.status, r.text().as_str()), (200, "v1"));
    // Past grace, within keep: stale-if-error, without asking the backend.
    let r = get(&inlay.url("/kept")).await;
    assert_eq!((r.status, r.text().as_str()), (200, "k1"));
    assert_eq!(origin.count("/kept"), 1, "the sick backend was asked");
    // Nothing to serve stale: the error a down backend gives, not sent.
    assert_eq!(get(&inlay.url("/pass")).await.status, 503);
    assert_eq!(get(&inlay.url("/obj?other")).await.status, 503);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(origin.count("/obj"), 1, "the sick backend got a refresh");
    assert_eq!(origin.count("/pass"), 0, "the sick backend got a pass");
    assert!(
        metric(&inlay, "inlay_backend_unhealthy_total{backend=\"default\"}").await >= 2,
        "requests not sent to the sick backend are counted"
    );

    origin.well.store(true, Ordering::SeqCst);
    wait_health(&inlay, true).await;
    assert_eq!(get(&inlay.url("/pass")).await.status, 200);
    // The stale object is refreshed again.
    let r = get(&inlay.url("/obj")).await;
    assert_eq!(r.status, 200);
    for _ in 0..500 {
        if origin.count("/obj") >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(origin.count("/obj") >= 2, "no refresh once healthy");
}

#[test]
fn probe_settings_are_checked_with_their_key_paths() {
    let text = "[backends.default]\naddress = \"http://127.0.0.1:1\"\n\
        [backends.default.probe]\nurl = \"health\"\ninterval = \"0s\"\nwindow = 65\nthreshold = 9\n\
        initial = 10\nexpected_status = 99\ncolour = 1\n";
    let msg = Config::from_toml(text).unwrap_err().to_string();
    for path in [
        "url",
        "interval",
        "window",
        "threshold",
        "initial",
        "expected_status",
        "colour",
    ] {
        let key = format!("backends.default.probe.{path}:");
        assert!(
            msg.lines().any(|l| l.trim_start().starts_with(&key)),
            "no error for {key} in:\n{msg}"
        );
    }
    let ok = Config::from_toml(
        "[backends.default]\naddress = \"http://127.0.0.1:1\"\n[backends.default.probe]\n",
    )
    .unwrap();
    let p = ok.default_backend().probe.clone().expect("a probe");
    // Varnish's defaults.
    assert_eq!(
        (
            p.url.as_str(),
            p.interval,
            p.timeout,
            p.window,
            p.threshold,
            p.initial,
            p.expected_status
        ),
        (
            "/",
            Duration::from_secs(5),
            Duration::from_secs(2),
            8,
            3,
            2,
            200
        )
    );
}

/// `[backends.NAME]` for each (name, address) and `[directors.NAME]`.
fn directed(backends: &[(&str, String)], director: &str) -> String {
    let mut t = String::new();
    for (name, address) in backends {
        t.push_str(&format!(
            "[backends.{name}]\naddress = \"{address}\"\nconnect_timeout = \"2s\"\nfirst_byte_timeout = \"3s\"\n"
        ));
    }
    t.push_str(director);
    t
}

/// A backend that is sick from the start (its probe counts nothing good)
/// and stays sick: its one probe during the test gets the test origin's
/// 404 for a path it does not serve.
fn sick_from_start(name: &str) -> String {
    format!(
        "[backends.{name}.probe]\nurl = \"/probe-fails\"\ninterval = \"1h\"\nwindow = 1\nthreshold = 1\ninitial = 0\n"
    )
}

/// How many times `origin` saw `path` (the test origin's own count).
async fn seen(origin: &Origin, path: &str) -> u64 {
    origin.count(path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_takes_turns_and_skips_a_sick_backend() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    let inlay = Harness::builder()
        .toml(&directed(
            &[("a", a.url()), ("b", b.url()), ("c", c.url())],
            "[directors.default]\ntype = \"round_robin\"\nbackends = [\"a\", \"b\", \"c\"]\n",
        ))
        .toml(&sick_from_start("c"))
        .start_in_process()
        .await;
    for i in 0..6 {
        let r = get(&inlay.url(&format!("/static/{i}?cc=no-store"))).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut per = Vec::new();
    for o in [&a, &b, &c] {
        let mut n = 0;
        for i in 0..6 {
            n += seen(o, &format!("/static/{i}")).await;
        }
        per.push(n);
    }
    assert_eq!(per, [3, 3, 0], "turns between the healthy ones only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_spreads_by_weight() {
    let (a, b) = (Origin::start(), Origin::start());
    let even = Harness::builder()
        .toml(&directed(
            &[("a", a.url()), ("b", b.url())],
            "[directors.default]\ntype = \"random\"\nbackends = [\"a\", \"b\"]\n",
        ))
        .start_in_process()
        .await;
    for i in 0..64 {
        assert_eq!(
            get(&even.url(&format!("/resp?i={i}&cc=no-store")))
                .await
                .status,
            200
        );
    }
    let (na, nb) = (seen(&a, "/resp").await, seen(&b, "/resp").await);
    assert_eq!(na + nb, 64);
    // Each is missed with probability 2^-64.
    assert!(na > 0 && nb > 0, "a {na}, b {nb}");

    let (c, d) = (Origin::start(), Origin::start());
    let weighted = Harness::builder()
        .toml(&directed(
            &[("c", c.url()), ("d", d.url())],
            "[directors.default]\ntype = \"random\"\n\
             backends = [{ backend = \"c\", weight = 1 }, { backend = \"d\", weight = 1000000 }]\n",
        ))
        .start_in_process()
        .await;
    for i in 0..20 {
        assert_eq!(
            get(&weighted.url(&format!("/resp?i={i}&cc=no-store")))
                .await
                .status,
            200
        );
    }
    // c is picked with probability 1e-6 each time.
    assert_eq!((seen(&c, "/resp").await, seen(&d, "/resp").await), (0, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_takes_the_first_healthy_backend() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    let inlay = Harness::builder()
        .toml(&directed(
            &[("a", a.url()), ("b", b.url()), ("c", c.url())],
            "[directors.default]\ntype = \"fallback\"\nbackends = [\"a\", \"b\", \"c\"]\n",
        ))
        .toml(&sick_from_start("a"))
        .toml("[admin]\nlisten = \"127.0.0.1:0\"\n")
        .start_in_process()
        .await;
    let stats: serde_json::Value =
        serde_json::from_slice(&get(&inlay.admin_url("/stats")).await.body).unwrap();
    let director = &stats["directors"]["default"];
    assert_eq!(director["type"], "fallback", "{stats}");
    assert_eq!(director["healthy"], 2, "{stats}");
    assert_eq!(stats["backends"]["a"]["healthy"], false, "{stats}");
    for i in 0..5 {
        assert_eq!(
            get(&inlay.url(&format!("/resp?i={i}&cc=no-store")))
                .await
                .status,
            200
        );
    }
    let counts = (
        seen(&a, "/resp").await,
        seen(&b, "/resp").await,
        seen(&c, "/resp").await,
    );
    assert_eq!(
        counts,
        (0, 5, 0),
        "a is sick: b, the next in order, gets all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_sends_each_key_to_one_backend_and_skips_a_sick_one() {
    let (a, b, c) = (Origin::start(), Origin::start(), Origin::start());
    let dead = format!("http://127.0.0.1:{}", common::unused_port());
    let inlay = Harness::builder()
        .toml(&directed(
            &[
                ("a", a.url()),
                ("b", b.url()),
                ("c", c.url()),
                ("gone", dead),
            ],
            "[directors.default]\ntype = \"shard\"\nbackends = [\"a\", \"b\", \"c\", \"gone\"]\n",
        ))
        .toml(&sick_from_start("gone"))
        .start_in_process()
        .await;
    // Not cacheable: every request goes to the backend its key shards to.
    for round in 0..3 {
        for i in 0..24 {
            let r = get(&inlay.url(&format!("/static/{i}?cc=no-store"))).await;
            assert_eq!(r.status, 200, "round {round}, key {i}: {}", r.text());
        }
    }
    let mut used = [0; 3];
    for i in 0..24 {
        let path = format!("/static/{i}");
        let counts = [
            seen(&a, &path).await,
            seen(&b, &path).await,
            seen(&c, &path).await,
        ];
        let owners: Vec<usize> = (0..3).filter(|&o| counts[o] > 0).collect();
        assert_eq!(
            owners.len(),
            1,
            "key {i} went to several backends: {counts:?}"
        );
        assert_eq!(counts[owners[0]], 3, "key {i}: {counts:?}");
        used[owners[0]] += 1;
    }
    assert!(
        used.iter().all(|&n| n > 0),
        "24 keys spread over three: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_request_is_retried_once_on_another_backend() {
    let live = Origin::start();
    // Refuses connections.
    let refused = format!("http://127.0.0.1:{}", common::unused_port());
    // Accepts, reads the request, and closes without a byte of response.
    let resetting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let resetting_addr = resetting.local_addr().unwrap();
    let resets = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = resets.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut s, _)) = resetting.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            counted.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    let inlay = Harness::builder()
        .toml(&directed(
            &[
                ("refused", refused),
                ("resetting", format!("http://{resetting_addr}")),
                ("live", live.url()),
            ],
            "[directors.default]\ntype = \"round_robin\"\nbackends = [\"refused\", \"live\"]\n\
",
        ))
        .start_in_process()
        .await;
    // Every other GET goes to the refusing backend first, then to live.
    for i in 0..4 {
        let r = get(&inlay.url(&format!("/echo?i={i}"))).await;
        assert_eq!(r.status, 200, "GET {i}: {}", r.text());
    }
    assert_eq!(seen(&live, "/echo").await, 4);
    // A POST is not sent twice: the one whose turn is the refusing backend fails.
    let mut statuses = Vec::new();
    for i in 0..2 {
        let r = common::request(
            "POST",
            &inlay.url(&format!("/echo?post={i}")),
            &[],
            bytes::Bytes::from_static(b"x"),
        )
        .await;
        statuses.push(r.status);
    }
    assert_eq!(statuses, [503, 200]);
    assert_eq!(seen(&live, "/echo").await, 5);
    assert_eq!(
        metric(&inlay, "inlay_backend_retries_total{backend=\"refused\"}").await,
        2,
        "the two GETs sent elsewhere after the refusing backend failed them"
    );

    drop(inlay);
    // A reset before any response byte: retried too, but a POST is not.
    let inlay = Harness::builder()
        .toml(&directed(
            &[
                ("resetting", format!("http://{resetting_addr}")),
                ("live", live.url()),
            ],
            "[directors.default]\ntype = \"fallback\"\nbackends = [\"resetting\", \"live\"]\n",
        ))
        .start_in_process()
        .await;
    let r = get(&inlay.url("/echo?after-reset")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(resets.load(Ordering::SeqCst), 1);
    assert_eq!(seen(&live, "/echo").await, 6);
    let r = common::request(
        "POST",
        &inlay.url("/echo?post-reset"),
        &[],
        bytes::Bytes::from_static(b"x"),
    )
    .await;
    assert_eq!(r.status, 502, "a POST is not sent again");
    assert_eq!(seen(&live, "/echo").await, 6);
}

#[test]
fn director_settings_are_checked_with_their_key_paths() {
    let base = "[backends.a]\naddress = \"http://127.0.0.1:1\"\n[backends.b]\naddress = \"http://127.0.0.1:2\"\n";
    let text = format!(
        "default_backend = \"nowhere\"\n{base}\
         [directors.odd]\ntype = \"hash\"\nbackends = [\"a\"]\n\
         [directors.empty]\ntype = \"fallback\"\nbackends = []\n\
         [directors.unknown]\ntype = \"fallback\"\nbackends = [\"a\", \"c\", \"a\"]\n\
         [directors.weights]\ntype = \"shard\"\nbackends = [{{ backend = \"a\", weight = 2 }}]\n\
         [directors.zero]\ntype = \"random\"\nbackends = [{{ backend = \"a\", weight = 0 }}]\n\
         [directors.a]\ntype = \"fallback\"\nbackends = [\"b\"]\n"
    );
    let msg = Config::from_toml(&text).unwrap_err().to_string();
    for (path, says) in [
        ("directors.odd.type", "round_robin"),
        ("directors.empty.backends", "expected a list"),
        ("directors.unknown.backends[1]", "not a configured backend"),
        ("directors.unknown.backends[2]", "listed twice"),
        ("directors.weights.backends[0].weight", "random"),
        ("directors.zero.backends[0].weight", "1..="),
        ("directors.a", "also a backend"),
        ("default_backend", "backend or director"),
    ] {
        let line = msg
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{path}:")))
            .unwrap_or_else(|| panic!("no error for {path} in:\n{msg}"));
        assert!(line.contains(says), "{path}: {line}");
    }
    let ok = Config::from_toml(&format!(
        "default_backend = \"pool\"\n{base}[directors.pool]\ntype = \"shard\"\nbackends = [\"b\", \"a\"]\n"
    ))
    .unwrap();
    assert_eq!(ok.default_backend().name, "b", "a director's first backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_and_restarted_under_load_costs_no_client_error() {
    let (a, b) = (Origin::start(), Origin::start());
    let a_addr = a.addr;
    let probe = "[backends.{}.probe]\nurl = \"/resp\"\ninterval = \"50ms\"\ntimeout = \"500ms\"\nwindow = 4\nthreshold = 2\ninitial = 2\n";
    let inlay = Harness::builder()
        .toml(&directed(
            &[("a", a.url()), ("b", b.url())],
            "[directors.default]\ntype = \"round_robin\"\nbackends = [\"a\", \"b\"]\n",
        ))
        .toml(&probe.replace("{}", "a"))
        .toml(&probe.replace("{}", "b"))
        .start_in_process()
        .await;
    let url = inlay.url("/static/1?cc=no-store");
    // Four clients at once, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (url, stop) = (url.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut sent = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let r = get(&url).await;
                sent += 1;
                if r.status != 200 {
                    failures.push(format!("{} {}", r.status, r.text()));
                }
            }
            (sent, failures)
        }));
    }
    let served = |o: &Origin| {
        let url = format!("{}/__count?path=/static/1", o.url());
        async move { get(&url).await.text().trim().parse::<u64>().unwrap() }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(served(&a).await > 0, "a served before it was killed");
    a.stop().await;
    wait_health_of(&inlay, "a", false).await;
    let b_before = served(&b).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(served(&b).await > b_before, "b carries the load alone");
    let a = Origin::start_on(a_addr);
    wait_health_of(&inlay, "a", true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(served(&a).await > 0, "a is put back");
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for c in clients {
        let (sent, failures) = c.await.unwrap();
        total += sent;
        assert!(failures.is_empty(), "client errors: {failures:?}");
    }
    assert!(total > 0);
}

/// Waits (at most 10 s) for backend `name`'s health to be `want`, as
/// `inlay_backend_healthy` says.
async fn wait_health_of(inlay: &Harness, name: &str, want: bool) {
    let prefix = format!("inlay_backend_healthy{{backend=\"{name}\"}}");
    for _ in 0..1000 {
        let text = inlay.metrics.render().await;
        if text
            .lines()
            .any(|l| l.starts_with(&prefix) && l.ends_with(if want { " 1" } else { " 0" }))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {name} did not become healthy={want}");
}

/// An origin that counts the connections it accepts; every answer is
/// `200 ok`, not cacheable.
async fn connection_counting_origin() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let service = hyper::service::service_fn(|_req: http::Request<_>| {
                let resp = http::Response::builder()
                    .header("cache-control", "no-store")
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"ok")))
                    .unwrap();
                std::future::ready(Ok::<_, std::convert::Infallible>(resp))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_backend_connections_are_kept_for_reuse_unless_turned_off() {
    for (lines, reused) in [("", true), ("max_idle_connections = 0", false)] {
        let (addr, accepted) = connection_counting_origin().await;
        let inlay = inlay_with(&format!("http://{addr}"), lines).await;
        for i in 0..10 {
            let r = get(&inlay.url(&format!("/page?{i}"))).await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let n = accepted.load(Ordering::SeqCst);
        if reused {
            assert!(
                n <= 5,
                "kept-alive connections are reused: {n} for 10 requests"
            );
        } else {
            assert_eq!(n, 10, "no idle connection kept: one per request");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_esi_include_naming_an_https_backend_is_fetched_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test origin CA");
    let secure = TlsOrigin::start(&ca.issue(&["127.0.0.1"]), None).await;
    let pages = Origin::start();
    let inlay = Harness::builder()
        .backend(&pages)
        .toml(&format!(
            "[backends.secure]\naddress = \"{}\"\nca_file = {}\n",
            secure.url(),
            toml_path(&ca.write(dir.path(), "ca.pem"))
        ))
        .start_in_process()
        .await;
    let markup = format!("[<esi:include src=\"{}/fragment\"/>]", secure.url());
    let r = get(&inlay.url(&common::esi_page(&markup, true))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "[hello over tls\n]");
    assert_eq!(secure.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_answered_with_garbage_or_an_endless_head_marks_the_backend_sick() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Each reads the probe first. One answers with bytes that are not HTTP; the other sends a head
    // that never ends, a byte at a time.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let mut request = [0u8; 4096];
            let _ = s.read(&mut request).await;
            let _ = s
                .write_all(b"\x16\x03\x01\x00\xffnot http at all\r\n\r\n")
                .await;
        }
    });
    let endless = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endless_addr = endless.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = endless.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = s.read(&mut request).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nX-Long: ").await;
                while s.write_all(b"a").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        }
    });
    for (addr, says) in [
        (garbage_addr, "error"),
        (endless_addr, "no response within"),
    ] {
        let inlay = Harness::builder()
            .toml(&format!(
                "[backends.default]\naddress = \"http://{addr}\"\n\
                 [backends.default.probe]\nurl = \"/health\"\ninterval = \"50ms\"\ntimeout = \"300ms\"\n\
                 window = 1\nthreshold = 1\ninitial = 1\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n"
            ))
            .start_in_process()
            .await;
        wait_health(&inlay, false).await;
        let stats: serde_json::Value =
            serde_json::from_slice(&get(&inlay.admin_url("/stats")).await.body).unwrap();
        let last = stats["backends"]["default"]["last"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(last.contains(says), "{addr}: {last}");
        assert!(last.len() <= 200, "the outcome is bounded");
        assert_eq!(get(&inlay.url("/page")).await.status, 503);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_sends_a_request_through_a_director_it_names() {
    let (a, b) = (Origin::start(), Origin::start());
    let inlay = Harness::builder()
        .toml(&directed(
            &[("default", a.url()), ("b", b.url())],
            "[directors.pool]\ntype = \"fallback\"\nbackends = [\"b\", \"default\"]\n",
        ))
        .arg("--policy")
        .arg(common::policy("capabilities").display().to_string())
        .start_in_process()
        .await;
    // The director's first healthy backend gets it, not the default one.
    assert_eq!(get(&inlay.url("/cap/backend/pool")).await.status, 200);
    assert_eq!((seen(&a, "/echo").await, seen(&b, "/echo").await), (0, 1));
    // A backend by its own name still works; a name that is neither is refused.
    assert_eq!(get(&inlay.url("/cap/backend/default")).await.status, 200);
    assert_eq!((seen(&a, "/echo").await, seen(&b, "/echo").await), (1, 1));
    let refused = get(&inlay.url("/cap/backend/nope")).await;
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert_eq!(seen(&a, "/echo").await + seen(&b, "/echo").await, 2);
}

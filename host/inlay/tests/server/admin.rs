//! The admin API, in process: probes, the bearer token, purge against
//! what public traffic cached, the config, JSON errors and limits, and
//! the routes other parts fill through hooks.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Harness, Origin, get, raw, request};
use futures_util::FutureExt as _;
use inlay::admin::{Admin, AdminHooks, AdminServer, AdminToken, MAX_BODY};
use serde_json::{Value, json};

const TOKEN: &str = "t0ken-for-tests";

/// A harness with the admin API asking for [`TOKEN`].
async fn with_admin(origin: &Origin, token_dir: &tempfile::TempDir) -> Harness {
    let token_file = token_dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    Harness::builder()
        .backend(origin)
        .toml(&format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"",
            token_file.display()
        ))
        .start_in_process()
        .await
}

fn bearer() -> (&'static str, String) {
    ("authorization", format!("Bearer {TOKEN}"))
}

async fn admin(method: &str, url: &str, body: Value) -> (u16, Value) {
    let (k, v) = bearer();
    let mut headers = vec![(k, v.as_str())];
    let body = match body {
        Value::Null => Bytes::new(),
        b => {
            headers.push(("content-type", "application/json"));
            Bytes::from(b.to_string())
        }
    };
    let r = request(method, url, &headers, body).await;
    let v = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{method} {url}: not JSON ({e}): {}", r.text()));
    (r.status, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_without_a_token_and_every_other_route_needs_it() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let inlay = with_admin(&origin, &dir).await;
    let r = get(&inlay.admin_url("/healthz")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(&inlay.admin_url("/readyz")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        serde_json::from_slice::<Value>(&r.body).unwrap()["status"],
        "ready"
    );
    for (method, path) in [
        ("GET", "/stats"),
        ("POST", "/purge"),
        ("GET", "/config"),
        ("GET", "/metrics"),
        ("POST", "/ban"),
        ("GET", "/bans"),
        ("POST", "/reload"),
    ] {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer t0ken-for-test"),
            Some("Basic dDBrZW4tZm9yLXRlc3Rz"),
            Some(TOKEN),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let r = request(method, &inlay.admin_url(path), &headers, Bytes::new()).await;
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}: {}", r.text());
            assert!(
                r.header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Bearer")),
                "{:?}",
                r.headers
            );
            assert!(r.text().contains("\"error\""), "{}", r.text());
        }
    }
    let (status, stats) = admin("GET", &inlay.admin_url("/stats"), Value::Null).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["state"], "ready");
    assert_eq!(stats["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        stats["store"]["memory"]["capacity"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert_eq!(stats["store"]["disk"]["enabled"], false, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_over_the_api_take_the_path_of_the_ban_method() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let inlay = with_admin(&origin, &dir).await;
    let url = "/bytes/91?cc=max-age%3D60";
    get(&inlay.url(url)).await;
    get(&inlay.url(url)).await;
    assert_eq!(origin.count("/bytes/91").await, 1, "cached");
    let ban = inlay.admin_url("/ban");
    let expr = "req.url ~ ^/bytes/91 && obj.status == 200";
    let (status, v) = admin("POST", &ban, json!({ "expression": expr })).await;
    assert_eq!(
        (status, &v["ban"]["expression"]),
        (200, &json!(expr)),
        "{v}"
    );
    get(&inlay.url(url)).await;
    assert_eq!(origin.count("/bytes/91").await, 2, "banned: a miss");
    let (status, v) = admin("POST", &ban, json!({ "expression": "req.url ~ (" })).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].is_string(), "{v}");
    let (status, v) = admin("POST", &ban, json!({ "expr": "x" })).await;
    assert_eq!(status, 400, "unknown field: {v}");
    let (status, v) = admin("GET", &inlay.admin_url("/bans"), Value::Null).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["counts"]["added"], 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_over_the_api_removes_what_public_traffic_cached() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let inlay = with_admin(&origin, &dir).await;
    let a = "/bytes/81?cc=max-age%3D60&sk=product-1%20all";
    let b = "/bytes/82?cc=max-age%3D60&sk=product-2%20all";
    // The harness's client sends Host: 127.0.0.1:PORT.
    let host = inlay.addr.to_string();
    get(&inlay.url(a)).await;
    get(&inlay.url(b)).await;
    get(&inlay.url(a)).await;
    assert_eq!(origin.count("/bytes/81").await, 1, "cached");
    // By URL: a path and a host, then the full URL.
    let purge = inlay.admin_url("/purge");
    let (status, v) = admin("POST", &purge, json!({ "url": a, "host": host })).await;
    assert_eq!((status, v["purged"].as_u64()), (200, Some(1)), "{v}");
    get(&inlay.url(a)).await;
    assert_eq!(origin.count("/bytes/81").await, 2, "a miss after the purge");
    let (_, v) = admin("POST", &purge, json!({ "url": inlay.url(a) })).await;
    assert_eq!(v["purged"], 1, "{v}");
    get(&inlay.url(a)).await;
    assert_eq!(origin.count("/bytes/81").await, 3);
    // Nothing cached there: nothing purged, and still 200.
    let (status, v) = admin("POST", &purge, json!({ "url": "/nothing", "host": host })).await;
    assert_eq!((status, v["purged"].as_u64()), (200, Some(0)), "{v}");
    // By surrogate key: both objects are tagged "all".
    let (_, v) = admin("POST", &purge, json!({ "surrogate_keys": ["all", "none"] })).await;
    assert_eq!(v["purged"], 2, "{v}");
    get(&inlay.url(a)).await;
    get(&inlay.url(b)).await;
    assert_eq!(origin.count("/bytes/81").await, 4);
    assert_eq!(origin.count("/bytes/82").await, 2);
    // Soft: served stale while refreshed, not fetched in line.
    let (_, v) = admin(
        "POST",
        &purge,
        json!({ "surrogate_keys": ["product-2"], "soft": true }),
    )
    .await;
    assert_eq!(
        (v["purged"].as_u64(), v["soft"].as_bool()),
        (Some(1), Some(true)),
        "{v}"
    );
    let r = get(&inlay.url(b)).await;
    assert!(
        r.header("cache-status").unwrap().contains("ttl=-"),
        "stale after a soft purge: {:?}",
        r.headers
    );
    // Counted as the PURGE method's are: 1 + 1 + 0 + 2 + 1.
    let (k, v) = bearer();
    let metrics = request(
        "GET",
        &inlay.admin_url("/metrics"),
        &[(k, &v)],
        Bytes::new(),
    )
    .await;
    let purged = metrics
        .text()
        .lines()
        .find_map(|l| l.strip_prefix("inlay_purged_objects_total "))
        .map(|n| n.trim().to_owned());
    assert_eq!(purged.as_deref(), Some("5"), "{}", metrics.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_config_is_shown_with_its_secrets_redacted() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let inlay = with_admin(&origin, &dir).await;
    let (status, v) = admin("GET", &inlay.admin_url("/config"), Value::Null).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["backends"]["default"]["address"],
        format!("{}/", origin.url())
    );
    assert_eq!(v["backends"]["default"]["first_byte_timeout"], "3s");
    assert_eq!(v["server"]["shutdown_timeout"], "10s");
    assert_eq!(v["admin"]["token_file"], "<redacted>");
    assert!(!v.to_string().contains(TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_json_error_and_nothing_breaks() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let inlay = with_admin(&origin, &dir).await;
    let (k, token) = bearer();
    let auth = [(k, token.as_str()), ("content-type", "application/json")];
    let purge = inlay.admin_url("/purge");
    let cases: Vec<(&str, String, Bytes, u16)> = vec![
        ("POST", purge.clone(), Bytes::from_static(b"{not json"), 400),
        ("POST", purge.clone(), Bytes::new(), 400),
        ("POST", purge.clone(), Bytes::from_static(b"[1,2]"), 400),
        (
            "POST",
            purge.clone(),
            Bytes::from_static(b"{\"url\": \"/a\"}"),
            400,
        ),
        (
            "POST",
            purge.clone(),
            Bytes::from_static(b"{\"surrogate_keys\": [\"a b\"]}"),
            400,
        ),
        (
            "POST",
            purge.clone(),
            Bytes::from(vec![b' '; MAX_BODY + 1]),
            413,
        ),
        ("GET", purge.clone(), Bytes::new(), 405),
        ("DELETE", inlay.admin_url("/stats"), Bytes::new(), 405),
        ("GET", inlay.admin_url("/nope"), Bytes::new(), 404),
        ("GET", inlay.admin_url("/../stats"), Bytes::new(), 404),
    ];
    for (method, url, body, want) in cases {
        let r = request(method, &url, &auth, body).await;
        assert_eq!(r.status, want, "{method} {url}: {}", r.text());
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{method} {url}: not JSON ({e}): {}", r.text()));
        assert!(v["error"].is_string(), "{v}");
        if want == 405 {
            assert!(r.header("allow").is_some(), "{:?}", r.headers);
        }
    }
    // A body larger than the limit, sent chunked without a length.
    let addr = inlay.admin_addr.unwrap();
    let mut chunked = format!(
        "POST /purge HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..3 {
        chunked.extend_from_slice(format!("{:x}\r\n", 32 << 10).as_bytes());
        chunked.extend(std::iter::repeat_n(b' ', 32 << 10));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (answer, _) = raw(addr, &chunked, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A request head past the limit is refused, and the API still answers.
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let (answer, _) = raw(addr, huge.as_bytes(), Duration::from_secs(10)).await;
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(get(&inlay.admin_url("/healthz")).await.status, 200);
}

/// Hooks that answer what the test expects.
fn test_hooks(reload_ok: bool) -> AdminHooks {
    AdminHooks {
        metrics: Some(Arc::new(|| {
            async { "# TYPE inlay_client_requests counter\ninlay_client_requests 7\n".to_owned() }
                .boxed()
        })),
        bans: Some(Arc::new(move || json!({ "bans": ["req.url ~ /a"] }))),
        reload: Some(Arc::new(move || {
            async move {
                match reload_ok {
                    true => Ok(json!({ "generation": 2 })),
                    false => Err(vec![
                        "backends.api.address: not a URL".to_owned(),
                        "cache.default_ttl: bad".to_owned(),
                    ]),
                }
            }
            .boxed()
        })),
        ..AdminHooks::default()
    }
}

async fn start(admin: Admin) -> (AdminServer, SocketAddr) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = AdminServer::start(l, admin).unwrap();
    let addr = server.local_addr();
    (server, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooked_routes_pass_their_input_and_answer_in_json() {
    let token = AdminToken::new(TOKEN.as_bytes()).unwrap();
    let (server, addr) = start(Admin::new(Some(token), test_hooks(true))).await;
    let url = |p: &str| format!("http://{addr}{p}");
    let (k, v) = bearer();
    let r = request("GET", &url("/metrics"), &[(k, &v)], Bytes::new()).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some(inlay::metrics::CONTENT_TYPE),
        "the text is OpenMetrics"
    );
    assert!(r.text().contains("inlay_client_requests 7"), "{}", r.text());
    let (status, v) = admin("GET", &url("/bans"), Value::Null).await;
    assert_eq!((status, &v["bans"]), (200, &json!(["req.url ~ /a"])), "{v}");
    let (status, v) = admin("POST", &url("/reload"), Value::Null).await;
    assert_eq!((status, &v["generation"]), (200, &json!(2)), "{v}");
    // No cache yet: not ready, and a purge says why.
    let r = get(&url("/readyz")).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("starting"), "{}", r.text());
    let (status, v) = admin("POST", &url("/purge"), json!({ "surrogate_keys": ["k"] })).await;
    assert_eq!(status, 503, "{v}");
    let (status, v) = admin("POST", &url("/ban"), json!({ "expression": "req.url ~ /" })).await;
    assert_eq!(status, 501, "{v}");
    let (status, v) = admin("GET", &url("/stats"), Value::Null).await;
    assert_eq!((status, &v["store"]), (200, &Value::Null), "{v}");
    server.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_its_hook_answers_501() {
    let (server, addr) = start(Admin::new(None, AdminHooks::default())).await;
    for (method, path, body) in [
        ("GET", "/metrics", ""),
        ("POST", "/ban", "{\"expression\": \"req.url ~ /\"}"),
        ("GET", "/bans", ""),
        ("POST", "/reload", ""),
        ("GET", "/config", ""),
    ] {
        let url = format!("http://{addr}{path}");
        let json = [("content-type", "application/json")];
        let headers = if body.is_empty() { &[][..] } else { &json[..] };
        let r = request(method, &url, headers, Bytes::from(body)).await;
        assert_eq!(r.status, 501, "{method} {path}: {}", r.text());
        assert!(r.text().contains("not available"), "{}", r.text());
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_answers_500_with_every_error() {
    let (server, addr) = start(Admin::new(None, test_hooks(false))).await;
    // No token configured: no token asked.
    let r = request("POST", &format!("http://{addr}/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 500, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"], "reload refused");
    assert_eq!(v["errors"].as_array().unwrap().len(), 2, "{v}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_slow_requests_cannot_starve_the_probes_of_another() {
    use inlay::admin::MAX_CONNECTIONS_PER_CLIENT;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, addr) = start(Admin::new(None, AdminHooks::default())).await;
    // 127.0.0.2 opens its share and sends a head it never finishes.
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_CLIENT {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = s.connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    // Its next connection is closed at once, unanswered.
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut extra = s.connect(addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "closed, not left waiting");
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
    // Another address is answered at once.
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        get(&format!("http://{addr}/healthz")),
    )
    .await
    .expect("the probe was answered while the other client held its share");
    assert_eq!(r.status, 200);
    drop(held);
    server.shutdown().await;
}

/// A harness whose admin API asks for no token (loopback), with `extra`
/// lines in `[admin]`.
async fn with_open_admin(origin: &Origin, extra: &str) -> Harness {
    let inlay = Harness::builder()
        .backend(origin)
        .toml(&format!("[admin]\nlisten = \"127.0.0.1:0\"\n{extra}"))
        .start_in_process()
        .await;
    // The routes are wired to the proxy by the time it is ready.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while get(&inlay.admin_url("/readyz")).await.status != 200 {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    inlay
}

async fn ban_count(inlay: &Harness) -> u64 {
    let r = get(&inlay.admin_url("/bans")).await;
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    v["counts"]["added"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_cannot_drive_the_admin_api() {
    let origin = Origin::start();
    let inlay = with_open_admin(&origin, "").await;
    let ban = inlay.admin_url("/ban");
    let body = || Bytes::from_static(br#"{"expression":"req.url ~ ."}"#);
    // The issue's request: a cross-site simple POST, no preflight needed.
    let page = [
        ("origin", "http://attacker.example"),
        ("content-type", "text/plain"),
    ];
    let r = request("POST", &ban, &page, body()).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("allowed_origins"), "{}", r.text());
    // An Origin is refused whatever the type; and what a page can send
    // without a preflight is refused without an Origin too.
    let r = request(
        "POST",
        &ban,
        &[("origin", "null"), ("content-type", "application/json")],
        body(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    for t in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let r = request("POST", &ban, &[("content-type", t)], body()).await;
        assert_eq!(r.status, 415, "{t}: {}", r.text());
        assert!(r.text().contains("application/json"), "{}", r.text());
        let r = request(
            "POST",
            &inlay.admin_url("/reload"),
            &[("content-type", t)],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, 415, "reload with {t}: {}", r.text());
    }
    assert_eq!(ban_count(&inlay).await, 0, "no ban was added");
    // DNS rebinding: a page on another name reaching this port sends its
    // own name as Host.
    let port = inlay.admin_addr.unwrap().port();
    let config = inlay.admin_url("/config");
    let rebound = format!("attacker.example:{port}");
    let r = request("GET", &config, &[("host", &rebound)], Bytes::new()).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("allowed_hosts"), "{}", r.text());
    assert!(!r.text().contains("backends"), "{}", r.text());
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".into(),
        format!("[::1]:{port}"),
    ] {
        let r = request("GET", &config, &[("host", &host)], Bytes::new()).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    // The probes answer a load balancer whatever name it uses.
    for path in ["/healthz", "/readyz"] {
        let r = request(
            "GET",
            &inlay.admin_url(path),
            &[
                ("host", "lb-target.internal"),
                ("origin", "http://x.example"),
            ],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // What the admin client sends is served.
    let r = request(
        "POST",
        &ban,
        &[("content-type", "application/json")],
        body(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ban_count(&inlay).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_origins_and_host_names_are_served() {
    let origin = Origin::start();
    let inlay = with_open_admin(
        &origin,
        "allowed_origins = [\"https://Ops.example:443\"]\nallowed_hosts = [\"admin.internal\"]",
    )
    .await;
    let port = inlay.admin_addr.unwrap().port();
    // A dashboard at https://ops.example behind a proxy that forwards to
    // the admin port by name.
    let host = format!("admin.internal:{port}");
    let r = request(
        "POST",
        &inlay.admin_url("/purge"),
        &[
            ("host", host.as_str()),
            ("origin", "https://ops.example"),
            ("content-type", "application/json"),
        ],
        Bytes::from_static(br#"{"surrogate_keys": ["k"]}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Other origins and names are still refused.
    let r = request(
        "GET",
        &inlay.admin_url("/stats"),
        &[("origin", "http://ops.example")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let r = request(
        "GET",
        &inlay.admin_url("/stats"),
        &[("host", "admin.internal.attacker.example")],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let r = get(&inlay.admin_url("/config")).await;
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v["admin"]["allowed_origins"],
        json!(["https://ops.example"])
    );
    assert_eq!(v["admin"]["allowed_hosts"], json!(["admin.internal"]));
}

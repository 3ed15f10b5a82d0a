//! `inlay admin policy push`, `status` and `rollback` with the real binary
//! against `inlay serve` in a cluster (a real `nats-server`; skipped, saying
//! so, where it is not installed).

use std::time::{Duration, Instant};

use crate::admin::{admin_addr, admin_cli, text};
use crate::common::{Inlay, NatsServer, Origin, get, policy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inlay_admin_policy_push_status_and_rollback() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    // A cache directory of the test's: the node keeps pushed components
    // there (without one, in a temporary directory a killed node leaves).
    let cache = tempfile::tempdir().unwrap();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!(
            "[policy]\npath = {:?}\n[cache]\ndir = {:?}\n[cluster]\nnats_urls = [\"{}\"]\nnode_name = \"edge-p\"",
            policy("default").display().to_string(),
            cache.path().display().to_string(),
            nats.url()
        ))
        .arg("--admin")
        .arg("127.0.0.1:0")
        .spawn_process();
    let addr = admin_addr(&inlay);
    // Its hooks are wired once it serves.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !admin_cli(addr, &["ready"]).status.success() {
        assert!(Instant::now() < deadline, "not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let headers = policy("headers").display().to_string();
    let out = admin_cli(addr, &["policy", "push", &headers]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let version = answer["pushed"].as_str().expect("a version").to_owned();
    // The node logs the version it runs, and serves with it.
    inlay.expect_log(
        &format!("this node runs policy version {version}"),
        Duration::from_secs(20),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        n += 1;
        let r = get(&inlay.url(&format!("/echo?n={n}"))).await;
        if r.header("x-inlay-policy") == Some("headers") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pushed policy does not serve"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = admin_cli(addr, &["policy", "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["version"], version.as_str(), "{status}");
    // Rolling back the only version returns to the node's own policy.path.
    let out = admin_cli(addr, &["policy", "rollback"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    inlay.expect_log(
        "this node runs its own policy.path again",
        Duration::from_secs(20),
    );
    // Then nothing is left to roll back: exit 1 and why.
    let out = admin_cli(addr, &["policy", "rollback"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("nothing to roll back"),
        "{}",
        text(&out.stderr)
    );
    // A file that is not there: a usage error.
    let out = admin_cli(addr, &["policy", "push", "/nonexistent/policy.wasm"]);
    assert_eq!(out.status.code(), Some(2));
}

//! `inlay serve --component` on the embedded default config, and `inlay
//! check` of a config with component backends.

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;

use crate::common::{component, get, request, spawn_without_config};

#[tokio::test]
async fn serve_component_runs_a_component_as_the_default_backend_of_the_embedded_config() {
    let app = component("hello-rs").display().to_string();
    let inlay = spawn_without_config(&["-a", "127.0.0.1:0", "--component", &app]);
    let first = get(&inlay.url("/hello")).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.text(), "hello from a Rust component\n");
    let again = get(&inlay.url("/hello")).await;
    assert!(
        again.header("cache-status").unwrap().contains("hit"),
        "{:?}",
        again.headers
    );
    let page = get(&inlay.url("/")).await.text();
    assert!(
        page.contains("<p>fragment from a Rust component</p>"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_0_3_instances_kept_for_reuse_exits_without_a_failure() {
    let app = component("hello-p3-rs").display().to_string();
    let mut inlay = spawn_without_config(&["-a", "127.0.0.1:0", "--component", &app]);
    // Uncached (a cookie makes the built-in rules pass), at once: the
    // instances stay, idle, for the next requests.
    let asks = (0..4).map(|i| {
        let url = inlay.url(&format!("/hello?n={i}"));
        tokio::spawn(async move {
            request("GET", &url, &[("cookie", "session=1")], Bytes::new())
                .await
                .status
        })
    });
    for ask in asks.collect::<Vec<_>>() {
        assert_eq!(ask.await.unwrap(), 200);
    }
    inlay.signal("TERM");
    let st =
        tokio::task::block_in_place(|| inlay.wait(Duration::from_secs(10))).expect("inlay exited");
    let log = inlay.log.text();
    assert!(st.success(), "exit status {st:?}\n{log}");
    // Each kept instance's worker ends with the runtime: not a trap, not
    // a failed response.
    assert!(log.contains("all connections drained"), "{log}");
    assert!(!log.contains("component failed"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn check_loads_the_components_a_config_names() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm garbage").unwrap();
    let config = |path: &std::path::Path| {
        let file = dir.path().join("inlay.toml");
        std::fs::write(
            &file,
            format!(
                "[backends.app]\ncomponent = {:?}\n",
                path.display().to_string()
            ),
        )
        .unwrap();
        Command::new(env!("CARGO_BIN_EXE_inlay"))
            .arg("check")
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap()
    };
    let out = config(&bad);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("backends.app.component: cannot compile"),
        "{err}"
    );
    let out = config(&component("hello-rs"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! The command line: `inlay check`, and start-up errors and exit codes.

use std::process::Command;

fn inlay() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inlay"))
}

#[test]
fn check_reports_every_error_with_its_key_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[server]\nlisten = [\"nowhere\"]\n[backends.web]\naddress = \"ftp://x\"\nfirst_byte_timeout = \"soon\"\n[cache]\nmemory_size = \"12 parsecs\"\n",
    )
    .unwrap();
    let out = inlay()
        .arg("check")
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "server.listen[0]",
        "backends.web.address",
        "backends.web.first_byte_timeout",
        "cache.memory_size",
        "\"soon\"",
    ] {
        assert!(err.contains(want), "missing {want}: {err}");
    }
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[backends.web]\naddress = \"http://127.0.0.1:1\"\n").unwrap();
    let out = inlay()
        .arg("check")
        .arg("--config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn serve_refuses_a_bad_config_without_panicking() {
    let out = inlay()
        .args(["serve", "-a", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-a") && err.contains("not-an-address"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_bad_policy_file_is_refused_at_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm garbage").unwrap();
    let out = inlay()
        .args([
            "serve",
            "-a",
            "127.0.0.1:0",
            "-b",
            "http://127.0.0.1:1",
            "--policy",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.wasm") && err.to_lowercase().contains("policy"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_cache_dir_the_system_refuses_stops_the_start_and_is_left_alone() {
    // A mistyped cache directory that names a file: not a corrupt database
    // to move aside, and not something to serve around silently.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, b"precious").unwrap();
    let out = inlay()
        .args([
            "serve",
            "-a",
            "127.0.0.1:0",
            "-b",
            "http://127.0.0.1:1",
            "--cache-dir",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("notes.txt") && err.contains("cache.dir"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

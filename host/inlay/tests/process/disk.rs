//! The disk tier of the real binary: its size bound, and a full disk.

use std::process::Command;
use std::time::Duration;

use crate::common::{Inlay, Origin, get_site};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_bound_holds_by_evicting_old_objects() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!(
            "[cache]\ndir = \"{}\"\nmemory_size = \"1MiB\"\ndisk_size = \"4MiB\"",
            dir.path().join("c").display()
        ))
        .spawn_process();
    // 40 objects of 256 KiB: 10 MiB through a 4 MiB disk tier.
    for i in 0..40 {
        let r = get_site(&inlay.url(&format!("/bytes/262144?id={i}&cc=max-age%3D600"))).await;
        assert_eq!(r.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The newest is still cached; the oldest was evicted and is fetched again.
    get_site(&inlay.url("/bytes/262144?id=39&cc=max-age%3D600")).await;
    assert_eq!(origin.count("/bytes/262144").await, 40);
    get_site(&inlay.url("/bytes/262144?id=0&cc=max-age%3D600")).await;
    assert_eq!(
        origin.count("/bytes/262144").await,
        41,
        "oldest object should have been evicted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_survived_and_responses_are_served_uncached() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!(
            "skipped: cannot mount a tmpfs here (needs root); the storage crate's tests cover ENOSPC"
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .toml(&format!(
            "[cache]\ndir = \"{}\"\nmemory_size = \"1MiB\"\ndisk_size = \"1GiB\"",
            mnt.join("c").display()
        ))
        .spawn_process();
    // 24 MiB of objects into a 3 MiB filesystem.
    for i in 0..24 {
        let r = get_site(&inlay.url(&format!("/bytes/1048576?id={i}&cc=max-age%3D600"))).await;
        assert_eq!(r.status, 200, "request {i} failed: {}", r.text());
        assert_eq!(r.body.len(), 1 << 20);
    }
    assert!(
        inlay.log.wait_for("full", Duration::from_secs(5))
            || inlay.log.wait_for("write failed", Duration::from_secs(1)),
        "a full disk should be logged:\n{}",
        inlay.log.text()
    );
    // Still serving, and what fits is still cached.
    let r = get_site(&inlay.url("/resp?after=full")).await;
    assert_eq!(r.status, 200);
    assert!(!inlay.log.text().contains("panicked"));
}

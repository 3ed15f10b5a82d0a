//! Health probes across reloads: the probe of a backend that a reload
//! replaced stops, so twenty reloads leave one probe running.

use std::time::Duration;

use crate::common::{Inlay, Origin};

/// The config of generation `n`: the default backend probed at
/// `/static/{n}` (so each reload changes the backend, and the origin
/// counts each generation's probes apart).
fn config(origin: &Origin, n: u64) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\nshutdown_timeout = \"10s\"\n\
         [backends.default]\naddress = \"{}\"\n\
         [backends.default.probe]\nurl = \"/static/{n}\"\ninterval = \"50ms\"\n",
        origin.url()
    )
}

async fn probes_seen(origin: &Origin) -> Vec<u64> {
    let mut counts = Vec::new();
    for n in 2..=21 {
        counts.push(origin.count(&format!("/static/{n}")).await);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_leave_only_the_current_probe_running() {
    let origin = Origin::start();
    let inlay = tokio::task::block_in_place(|| {
        let inlay = Inlay::builder().backend(&origin).spawn_process();
        for n in 2..=21 {
            inlay.reload_to(&config(&origin, n), n);
        }
        inlay
    });
    // Each replaced generation (no request holds it) goes at once, and
    // its probe with it; a probe in flight then has long finished.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = probes_seen(&origin).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = probes_seen(&origin).await;
    for (i, (b, a)) in before.iter().zip(&after).enumerate().take(19) {
        assert_eq!(a, b, "the probe of generation {} still runs", i + 2);
    }
    assert!(after[19] > before[19], "the current probe runs: {after:?}");
    drop(inlay);
}

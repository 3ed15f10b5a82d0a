//! The open-file limit: raised at start to what `[server]` needs, and when
//! descriptors run out anyway, refused connections give theirs back first.

use std::time::Duration;

use crate::common::{Inlay, Origin, get_resp_from};

/// The soft and hard `RLIMIT_NOFILE` of `pid` ("self" for this process), from /proc.
fn open_files(pid: &str) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut figures = line.split_whitespace().skip(3).map(|f| match f {
        "unlimited" => u64::MAX,
        f => f.parse().unwrap(),
    });
    (figures.next().unwrap(), figures.next().unwrap())
}

fn soft_open_files(pid: i32) -> u64 {
    open_files(&pid.to_string()).0
}

/// This process's hard open-file limit (a child's may only be lowered
/// without CAP_SYS_RESOURCE), at least what these tests need.
fn hard_limit() -> u64 {
    let hard = open_files("self").1.min(65_536);
    assert!(
        hard >= 2400,
        "these tests need a hard open-file limit of 2400"
    );
    hard
}

#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_what_the_server_limits_need() {
    let origin = Origin::start();
    // 200 + 100 refused + the closing thread's 1024 + a reserve of 1024.
    let inlay = Inlay::builder()
        .backend(&origin)
        .server("max_connections = 200\ntarpit_max = 100")
        .open_files(256, hard_limit())
        .spawn_process();
    assert_eq!(soft_open_files(inlay.pid()), 2348);
    // Short for admitted clients even at the hard limit: a warning at start.
    let short = Inlay::builder()
        .backend(&origin)
        .server("max_connections = 1100\ntarpit_max = 100")
        .open_files(256, 2000)
        .spawn_process();
    assert_eq!(soft_open_files(short.pid()), 2000);
    short.expect_log(
        "the open-file limit is 2000, below the 2124",
        Duration::from_secs(5),
    );
}

/// Refused connections held in the tarpit fill the process's descriptors
/// (here the limit is lowered under the running process, as anything else
/// that takes descriptors would). Accepting then fails (EMFILE); before,
/// the accept loop only slept and retried, so no other client got in until
/// the held ones timed out. Now the tarpit closes its oldest and the
/// accept goes on.
#[tokio::test]
async fn out_of_descriptors_refused_connections_make_way_for_other_clients() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .server(
            "max_connections = 50\nmax_connections_per_client = 5\ntarpit_max = 300\n\
             defer_accept = \"0s\"\nheader_read_timeout = \"60s\"",
        )
        .open_files(2400, hard_limit())
        .spawn_process();
    let lowered = std::process::Command::new("prlimit")
        .args(["--pid", &inlay.pid().to_string(), "--nofile=200:200"])
        .status()
        .unwrap();
    assert!(lowered.success());
    let mut flood = Vec::new();
    for _ in 0..400 {
        flood.push(tokio::net::TcpStream::connect(inlay.addr).await.unwrap());
    }
    inlay.expect_log("out of descriptors", Duration::from_secs(5));
    let answer = get_resp_from(
        "127.0.0.2",
        inlay.addr,
        Duration::from_secs(5),
        "another address while the flood holds every descriptor",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    drop(flood);
}

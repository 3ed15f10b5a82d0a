//! The cluster (`[cluster]`, NATS with JetStream): in process, against a
//! real `nats-server` on a loopback port (skipped, saying so, where it is
//! not installed).

use crate::common;

use common::{NatsServer, Origin, unused_port};
use inlay::config::Config;
use inlay::startup::Proxy;

fn config(origin: &str, cluster: &str) -> Config {
    Config::from_toml(&format!(
        "[backends.default]\naddress = \"{origin}\"\n[cluster]\n{cluster}\n"
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_its_nats_servers_before_it_serves() {
    crate::require_nats!();
    let nats = NatsServer::start();
    let origin = Origin::start();
    let proxy = Proxy::load(config(
        &origin.url(),
        &format!("nats_urls = [\"{}\"]\nnode_name = \"edge-1\"", nats.url()),
    ))
    .await
    .unwrap();
    let cluster = proxy
        .cluster()
        .expect("a [cluster] table joins the cluster");
    assert_eq!(cluster.node(), "edge-1");
    assert_eq!(
        cluster.client().connection_state(),
        async_nats::connection::State::Connected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_nats_servers_are_all_down_does_not_start() {
    let origin = Origin::start();
    let dead = format!("nats://127.0.0.1:{}", unused_port());
    let err = Proxy::load(config(
        &origin.url(),
        &format!("nats_urls = [\"{dead}\"]\nconnect_timeout = \"500ms\""),
    ))
    .await
    .expect_err("it would miss the other nodes' purges");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("cannot connect to NATS") && msg.contains(&dead),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_token_file_is_named_at_start() {
    let origin = Origin::start();
    let err = Proxy::load(config(
        &origin.url(),
        "nats_urls = [\"nats://127.0.0.1:4222\"]\ntoken_file = \"/nonexistent/nats-token\"",
    ))
    .await
    .expect_err("no credentials, no start");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("cluster.token_file") && msg.contains("/nonexistent/nats-token"),
        "{msg}"
    );
}

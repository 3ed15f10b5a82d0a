//! How a node proves who it is to NATS (`[cluster]` `token_file`,
//! `nkey_seed_file`, `[cluster.tls]`), against a real `nats-server` that
//! requires it: the right credentials join, wrong or missing ones stop the
//! start with the reason.

use crate::common;

use std::path::Path;

use common::{NatsServer, Origin, TestCa};
use inlay::config::Config;
use inlay::startup::Proxy;

fn config(origin: &Origin, cluster: &str) -> Config {
    Config::from_toml(&format!(
        "[backends.default]\naddress = \"{}\"\n[cluster]\nconnect_timeout = \"2s\"\n{cluster}\n",
        origin.url()
    ))
    .unwrap()
}

fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// Starts a node with `cluster`; whether it joined, or why not.
async fn join(origin: &Origin, cluster: &str) -> Result<(), String> {
    match Proxy::load(config(origin, cluster)).await {
        Ok(proxy) => {
            let c = proxy.cluster().expect("joined");
            assert_eq!(
                c.client().connection_state(),
                async_nats::connection::State::Connected
            );
            Ok(())
        }
        Err(e) => Err(format!("{e:#}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_token_file_is_shown_to_a_server_that_requires_one() {
    crate::require_nats!();
    let nats = NatsServer::start_with(&["--auth", "s3cret-token"]);
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("token");
    std::fs::write(&good, "s3cret-token\n").unwrap();
    let bad = dir.path().join("wrong");
    std::fs::write(&bad, "guess").unwrap();
    let url = nats.url();
    join(
        &origin,
        &format!("nats_urls = [\"{url}\"]\ntoken_file = {}", toml_path(&good)),
    )
    .await
    .expect("the right token joins");
    for cluster in [
        format!("nats_urls = [\"{url}\"]\ntoken_file = {}", toml_path(&bad)),
        format!("nats_urls = [\"{url}\"]"),
    ] {
        let e = join(&origin, &cluster).await.expect_err("refused");
        assert!(e.contains("cannot connect to NATS"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_signs_the_servers_challenge() {
    crate::require_nats!();
    let user = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let nats = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let origin = Origin::start();
    let seed = dir.path().join("user.nk");
    std::fs::write(&seed, user.seed().unwrap()).unwrap();
    let stranger = dir.path().join("stranger.nk");
    std::fs::write(&stranger, nkeys::KeyPair::new_user().seed().unwrap()).unwrap();
    let url = nats.url();
    join(
        &origin,
        &format!(
            "nats_urls = [\"{url}\"]\nnkey_seed_file = {}",
            toml_path(&seed)
        ),
    )
    .await
    .expect("the configured user joins");
    let e = join(
        &origin,
        &format!(
            "nats_urls = [\"{url}\"]\nnkey_seed_file = {}",
            toml_path(&stranger)
        ),
    )
    .await
    .expect_err("an unknown user is refused");
    assert!(e.contains("cannot connect to NATS"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_nats_verifies_the_server_against_ca_file() {
    crate::require_nats!();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("nats test CA");
    let (cert, key) = ca.issue(&["127.0.0.1"]).write(dir.path(), "nats");
    let nats = NatsServer::start_with(&[
        "--tls",
        "--tlscert",
        cert.to_str().unwrap(),
        "--tlskey",
        key.to_str().unwrap(),
    ]);
    let origin = Origin::start();
    let ca_file = ca.write(dir.path(), "ca.pem");
    let other = TestCa::new("another CA").write(dir.path(), "other.pem");
    let url = nats.url();
    join(
        &origin,
        &format!(
            "nats_urls = [\"{url}\"]\n[cluster.tls]\nca_file = {}",
            toml_path(&ca_file)
        ),
    )
    .await
    .expect("a server whose certificate chains to ca_file");
    let e = join(
        &origin,
        &format!(
            "nats_urls = [\"{url}\"]\n[cluster.tls]\nca_file = {}",
            toml_path(&other)
        ),
    )
    .await
    .expect_err("a certificate another CA signed does not verify");
    assert!(e.contains("cannot connect to NATS"), "{e}");
}

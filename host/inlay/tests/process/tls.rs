//! TLS from the command line: `-a https://ADDR --tls-cert FILE --tls-key
//! FILE`, SIGHUP reading the certificate again, and a key that does not load
//! stopping the start; the PROXY protocol turned on by SIGHUP; `-a
//! h2c://ADDR`, HTTP/2 without TLS and without HTTP/1.1; `-a quic://ADDR`,
//! HTTP/3 with the same certificate, swapped by SIGHUP too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{Inlay, Origin};

/// A CA (written to `ca.pem`) and a certificate for `site.test` whose
/// subject is `CN=<cn>`, signed by it (`site.pem`, `site.key`).
struct Files {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Files {
    fn new(dir: &Path) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Self {
            issuer: rcgen::Issuer::new(params, ca_key),
        }
    }

    fn issue(&self, dir: &Path, cn: &str) {
        let mut params = rcgen::CertificateParams::new(vec!["site.test".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(dir.join("site.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("site.key"), key.serialize_pem()).unwrap();
    }
}

/// The port of the process's `listening on https://` line.
fn https_port(inlay: &Inlay) -> u16 {
    listener_port(inlay, "https")
}

/// The port of the process's `listening on SCHEME://` line.
fn listener_port(inlay: &Inlay, scheme: &str) -> u16 {
    let said = format!("listening on {scheme}://");
    assert!(
        inlay.log.wait_for(&said, Duration::from_secs(30)),
        "{}",
        inlay.log.text()
    );
    let line = inlay
        .log
        .all()
        .into_iter()
        .find(|l| l.contains(&said))
        .unwrap();
    let rest = line.split(&said).nth(1).unwrap();
    let addr: std::net::SocketAddr = rest.split_whitespace().next().unwrap().parse().unwrap();
    addr.port()
}

/// `curl -v` for `https://site.test:PORT/static/8`: the status line and
/// the certificate subject it saw.
fn curl(dir: &Path, port: u16) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "10", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{http_version}"])
        .arg("--cacert")
        .arg(dir.join("ca.pem"))
        .arg("--resolve")
        .arg(format!("site.test:{port}:127.0.0.1"))
        .arg(format!("https://site.test:{port}/static/8"))
        .output()
        .expect("curl runs");
    let err = String::from_utf8_lossy(&out.stderr);
    let subject = err
        .lines()
        .find_map(|l| l.split("subject: ").nth(1))
        .unwrap_or_else(|| panic!("no subject in {err}"))
        .to_owned();
    (String::from_utf8_lossy(&out.stdout).into_owned(), subject)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_quick_flags_serve_https_and_sighup_reads_the_certificate_again() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let files = Files::new(dir.path());
    files.issue(dir.path(), "first");
    let path = |f: &str| -> PathBuf { dir.path().join(f) };
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("-a")
        .arg("127.0.0.1:0")
        .arg("-a")
        .arg("https://127.0.0.1:0")
        .arg("--tls-cert")
        .arg(path("site.pem").display().to_string())
        .arg("--tls-key")
        .arg(path("site.key").display().to_string())
        .spawn_process();
    let port = tokio::task::block_in_place(|| https_port(&inlay));
    let d = dir.path().to_owned();
    let (status, subject) = tokio::task::spawn_blocking(move || curl(&d, port))
        .await
        .unwrap();
    assert_eq!(status, "200 2", "curl offers h2 over TLS");
    assert!(subject.contains("CN=first"), "{subject}");

    files.issue(dir.path(), "second");
    inlay.signal("HUP");
    tokio::task::block_in_place(|| {
        inlay.expect_log("config reloaded: generation 2", Duration::from_secs(60));
    });
    let d = dir.path().to_owned();
    let (status, subject) = tokio::task::spawn_blocking(move || curl(&d, port))
        .await
        .unwrap();
    assert_eq!(status, "200 2");
    assert!(subject.contains("CN=second"), "{subject}");
}

#[test]
fn a_key_that_does_not_load_stops_the_start_with_its_key_path() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::new(dir.path());
    files.issue(dir.path(), "site");
    std::fs::write(dir.path().join("bad.key"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_inlay"))
        .args([
            "serve",
            "-a",
            "https://127.0.0.1:0",
            "-b",
            "http://127.0.0.1:1",
        ])
        .arg("--tls-cert")
        .arg(dir.path().join("site.pem"))
        .arg("--tls-key")
        .arg(dir.path().join("bad.key"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.tls[0].key: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("listening on"), "{err}");
}

#[test]
fn check_reads_the_tls_files_and_names_the_entry_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::new(dir.path());
    files.issue(dir.path(), "site");
    let config = dir.path().join("inlay.toml");
    let write = |cert: &str| {
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = [\"https://127.0.0.1:6443\"]\n\
                 [[server.tls]]\ncert = {:?}\nkey = {:?}\n\
                 [backends.default]\naddress = \"http://127.0.0.1:1\"\n",
                dir.path().join(cert),
                dir.path().join("site.key"),
            ),
        )
        .unwrap();
    };
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_inlay"))
            .arg("check")
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    };
    write("site.pem");
    let out = check();
    assert!(out.status.success(), "{out:?}");
    write("missing.pem");
    let out = check();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.tls[0].cert: cannot read"), "{err}");
}

/// `server.proxy_protocol` turned on by SIGHUP: new connections must send
/// the header; a connection open before the reload goes on without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_turns_the_proxy_protocol_on_for_new_connections() {
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = Origin::start();
    let inlay = Inlay::builder().backend(&origin).spawn_process();
    let connect = |header: &'static [u8]| async move {
        let mut tcp = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
        tcp.write_all(header).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        send
    };
    let forwarded_for =
        |send: &mut hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>| {
            let req = http::Request::post("/echo")
                .header("host", "x")
                .body(Empty::new())
                .unwrap();
            let sent = send.send_request(req);
            async move {
                let body = sent.await.unwrap().into_body().collect().await.unwrap();
                let reply = crate::common::Reply {
                    status: 200,
                    headers: http::HeaderMap::new(),
                    body: body.to_bytes(),
                    version: http::Version::HTTP_11,
                };
                crate::common::echoed(&reply, "x-forwarded-for")
            }
        };
    let mut before = connect(b"").await;
    assert_eq!(
        forwarded_for(&mut before).await.as_deref(),
        Some("127.0.0.1")
    );

    let text = std::fs::read_to_string(&inlay.config).unwrap().replace(
        "[server]\n",
        "[server]\nproxy_protocol = true\nproxy_protocol_from = [\"127.0.0.1\"]\n",
    );
    std::fs::write(&inlay.config, text).unwrap();
    inlay.signal("HUP");
    tokio::task::block_in_place(|| {
        inlay.expect_log("config reloaded: generation 2", Duration::from_secs(60));
    });
    let mut proxied = connect(b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 80\r\n").await;
    assert_eq!(
        forwarded_for(&mut proxied).await.as_deref(),
        Some("203.0.113.7")
    );
    // Without a header a new connection is closed unanswered.
    let mut bare = tokio::net::TcpStream::connect(inlay.addr).await.unwrap();
    bare.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), bare.read(&mut buf))
        .await
        .expect("closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // The connection from before the reload keeps its terms.
    before.ready().await.unwrap();
    assert_eq!(
        forwarded_for(&mut before).await.as_deref(),
        Some("127.0.0.1")
    );
}

/// `curl ARGS http://127.0.0.1:PORT/static/8`: `-w` status and version,
/// and curl's exit code.
fn curl_h2c(port: u16, args: &[&str]) -> (String, Option<i32>) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{http_version}"])
        .args(args)
        .arg(format!("http://127.0.0.1:{port}/static/8"))
        .output()
        .expect("curl runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code(),
    )
}

/// An `h2c://` listener serves HTTP/2 with prior knowledge and closes an
/// HTTP/1.1 request unanswered; the plain listener beside it serves both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_listener_serves_prior_knowledge_and_no_http11() {
    let origin = Origin::start();
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("-a")
        .arg("127.0.0.1:0")
        .arg("-a")
        .arg("h2c://127.0.0.1:0")
        .spawn_process();
    let h2c = tokio::task::block_in_place(|| listener_port(&inlay, "h2c"));
    let plain = inlay.addr.port();
    tokio::task::spawn_blocking(move || {
        let prior = ["--http2-prior-knowledge"];
        assert_eq!(curl_h2c(h2c, &prior), ("200 2".to_owned(), Some(0)));
        assert_eq!(curl_h2c(plain, &prior), ("200 2".to_owned(), Some(0)));
        assert_eq!(curl_h2c(plain, &[]), ("200 1.1".to_owned(), Some(0)));
        // HTTP/2 frames (SETTINGS, GOAWAY) and no HTTP/1 reply: curl
        // says "Received HTTP/0.9 when not allowed" (exit 1).
        let (status, code) = curl_h2c(h2c, &["--http1.1"]);
        assert_eq!((status.as_str(), code), ("000 0", Some(1)));
    })
    .await
    .unwrap();
}

/// An HTTP/3 GET of `/static/8` from `site.test` on `port` (UDP),
/// trusting `ca.pem`: the status and the certificate the server showed.
async fn h3_get(dir: &Path, port: u16) -> (u16, Vec<u8>) {
    use rustls::pki_types::pem::PemObject as _;
    let ca = rustls::pki_types::CertificateDer::from_pem_file(dir.join("ca.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(quic)));
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let exchange = async {
        let conn = endpoint.connect(to, "site.test").unwrap().await.unwrap();
        let shown = conn
            .peer_identity()
            .unwrap()
            .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .unwrap()[0]
            .to_vec();
        let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        let req = http::Request::get(format!("https://site.test:{port}/static/8"))
            .body(())
            .unwrap();
        let mut stream = send.send_request(req).await.unwrap();
        stream.finish().await.unwrap();
        let status = stream.recv_response().await.unwrap().status().as_u16();
        (status, shown)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an HTTP/3 answer within 10 s")
}

/// The DER of the certificate in `site.pem`.
fn site_der(dir: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::from_pem_file(dir.join("site.pem"))
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quic_flag_serves_http3_and_sighup_swaps_its_certificate() {
    let origin = Origin::start();
    let dir = tempfile::tempdir().unwrap();
    let files = Files::new(dir.path());
    files.issue(dir.path(), "first");
    let path = |f: &str| -> PathBuf { dir.path().join(f) };
    let inlay = Inlay::builder()
        .backend(&origin)
        .arg("-a")
        .arg("127.0.0.1:0")
        .arg("-a")
        .arg("quic://127.0.0.1:0")
        .arg("--tls-cert")
        .arg(path("site.pem").display().to_string())
        .arg("--tls-key")
        .arg(path("site.key").display().to_string())
        .spawn_process();
    let port = tokio::task::block_in_place(|| listener_port(&inlay, "quic"));
    let (status, shown) = h3_get(dir.path(), port).await;
    assert_eq!(status, 200);
    assert_eq!(shown, site_der(dir.path()));

    files.issue(dir.path(), "second");
    inlay.signal("HUP");
    tokio::task::block_in_place(|| {
        inlay.expect_log("config reloaded: generation 2", Duration::from_secs(60));
    });
    let (status, shown) = h3_get(dir.path(), port).await;
    assert_eq!(status, 200);
    assert_eq!(shown, site_der(dir.path()), "the renewed certificate");
}

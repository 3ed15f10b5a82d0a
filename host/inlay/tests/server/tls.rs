//! TLS termination, in process against the test origin: certificates per
//! SNI name from a CA the test makes, ALPN h2 and http/1.1, session
//! resumption, certificates swapped by a reload, OCSP stapling (on the
//! TLS and the QUIC listener), and clients that never finish (or never
//! start) a handshake.
//!
//! `cargo test -p inlay --test server -- tls::`

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Harness, Origin, raw, request};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A CA, and certificates it signed, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Inlay test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        // For `openssl ocsp`, which signs the responses as the CA.
        std::fs::write(dir.path().join("ca.key"), ca_key.serialize_pem()).unwrap();
        Self {
            dir,
            ca,
            issuer: rcgen::Issuer::new(params, ca_key),
        }
    }

    /// A certificate for `names`, written to `FILE.pem` and `FILE.key`; its DER.
    fn issue(&self, file: &str, names: &[&str]) -> CertificateDer<'static> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{file}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn ca_file(&self) -> PathBuf {
        let p = self.path("ca.pem");
        std::fs::write(&p, self.ca.pem()).unwrap();
        p
    }

    /// A `[[server.tls]]` entry for `FILE.pem` and `FILE.key`.
    fn entry(&self, file: &str, names: &[&str]) -> String {
        let names = match names {
            [] => String::new(),
            n => format!("names = {n:?}\n"),
        };
        format!(
            "[[server.tls]]\ncert = {:?}\nkey = {:?}\n{names}",
            self.path(&format!("{file}.pem")),
            self.path(&format!("{file}.key")),
        )
    }

    /// An OCSP response for `FILE.pem`, signed by the CA (`openssl ocsp`,
    /// valid for `days`), written to `FILE.ocsp`; its bytes.
    fn ocsp(&self, file: &str, days: u32) -> Vec<u8> {
        let index = self.path("index.txt");
        // Not in the CA's index: the status is `unknown`, in a response
        // that is `successful` all the same (what a client gets stapled).
        std::fs::write(&index, "").unwrap();
        let out = self.path(&format!("{file}.ocsp"));
        let status = std::process::Command::new("openssl")
            .arg("ocsp")
            .arg("-index")
            .arg(&index)
            .arg("-rsigner")
            .arg(self.ca_file())
            .arg("-rkey")
            .arg(self.path("ca.key"))
            .arg("-CA")
            .arg(self.ca_file())
            .arg("-issuer")
            .arg(self.ca_file())
            .arg("-cert")
            .arg(self.path(&format!("{file}.pem")))
            .arg("-respout")
            .arg(&out)
            .args(["-ndays", &days.to_string()])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl ocsp failed");
        std::fs::read(out).unwrap()
    }

    /// A client trusting this CA only, offering `alpn`.
    fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(c)
    }
}

/// Two named certificates (`a.test`, `b.test`) and a default (for
/// `default.test` and `127.0.0.1`, whose clients send no SNI).
fn two_names(pki: &Pki) -> [CertificateDer<'static>; 3] {
    [
        pki.issue("a", &["a.test"]),
        pki.issue("b", &["b.test"]),
        pki.issue("default", &["default.test", "127.0.0.1"]),
    ]
}

async fn start(origin: &Origin, pki: &Pki, extra: &str) -> Harness {
    Harness::builder()
        .backend(origin)
        .arg("-a")
        .arg("127.0.0.1:0")
        .arg("-a")
        .arg("https://127.0.0.1:0")
        .toml(&pki.entry("a", &["a.test"]))
        .toml(&pki.entry("b", &["b.test"]))
        .toml(&pki.entry("default", &[]))
        .toml(extra)
        .start_in_process()
        .await
}

/// A TLS connection to `addr` for `name` (a host name: sent as SNI; an IP
/// address: no SNI), verified against the test CA.
async fn connect(
    addr: SocketAddr,
    client: &Arc<rustls::ClientConfig>,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let server_name = ServerName::try_from(name.to_owned()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(client));
    tokio::time::timeout(Duration::from_secs(10), connector.connect(server_name, tcp))
        .await
        .expect("handshake within 10 s")
}

fn peer_certificate(s: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    s.get_ref().1.peer_certificates().unwrap()[0].clone()
}

fn alpn(s: &TlsStream<TcpStream>) -> Option<Vec<u8>> {
    s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
}

/// HTTP on an open TLS connection, in whichever protocol ALPN chose.
enum Session {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Session {
    async fn open(stream: TlsStream<TcpStream>) -> Self {
        let h2 = alpn(&stream).as_deref() == Some(b"h2");
        let io = TokioIo::new(stream);
        if h2 {
            let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(conn);
            Session::H2(send)
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Session::H1(send)
        }
    }

    /// GET `path` of `host`: status, head and body.
    async fn get(
        &mut self,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (http::response::Parts, Bytes) {
        self.send("GET", host, path, headers).await
    }

    /// `method` `path` of `host`, without a body.
    async fn send(
        &mut self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (http::response::Parts, Bytes) {
        let mut req = http::Request::builder().method(method);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let exchange = async {
            let resp = match self {
                Session::H1(send) => {
                    let req = req.uri(path).header("host", host);
                    send.ready().await.unwrap();
                    send.send_request(req.body(Empty::new()).unwrap()).await
                }
                Session::H2(send) => {
                    let req = req.uri(format!("https://{host}{path}"));
                    send.ready().await.unwrap();
                    send.send_request(req.body(Empty::new()).unwrap()).await
                }
            };
            let (parts, body) = resp.unwrap().into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        };
        tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .expect("response within 10 s")
    }
}

/// The `X-Forwarded-Proto` values the origin's `/echo` received for `method`.
async fn forwarded_proto(s: &mut Session, method: &str) -> Vec<String> {
    let (parts, body) = s
        .send(method, "a.test", "/echo", &[("x-forwarded-proto", "http")])
        .await;
    assert_eq!(parts.status, 200);
    let echoed = common::echo_headers(&common::Reply {
        status: 200,
        headers: parts.headers,
        body,
        version: parts.version,
    });
    echoed
        .into_iter()
        .filter(|(k, _)| k == "x-forwarded-proto")
        .map(|(_, v)| v)
        .collect()
}

fn cache_status(parts: &http::response::Parts) -> String {
    parts.headers["cache-status"].to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sni_name_gets_its_certificate_and_no_or_unknown_names_the_default() {
    let origin = Origin::start();
    let pki = Pki::new();
    let [a, b, default] = two_names(&pki);
    let inlay = start(&origin, &pki, "").await;
    let addr = inlay.tls_addr.unwrap();
    let client = pki.client(&[b"http/1.1"]);
    let a_conn = connect(addr, &client, "a.test").await.unwrap();
    assert_eq!(peer_certificate(&a_conn), a);
    let b_conn = connect(addr, &client, "b.test").await.unwrap();
    assert_eq!(peer_certificate(&b_conn), b);
    // An IP address sends no SNI: the default (which covers 127.0.0.1).
    let none = connect(addr, &client, "127.0.0.1").await.unwrap();
    assert_eq!(peer_certificate(&none), default);
    // An unknown name gets the default, which the client refuses.
    let unknown = connect(addr, &client, "c.test").await.unwrap_err();
    assert!(
        unknown.to_string().contains("not valid for name"),
        "{unknown}"
    );
    // Each connection serves.
    let mut s = Session::open(a_conn).await;
    let (parts, _) = s.get("a.test", "/static/10", &[]).await;
    assert_eq!(parts.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_h2_and_http11_both_serve_a_cached_hit_and_the_origin_learns_https() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = start(&origin, &pki, "[log]\naccess_log_format = \"json\"").await;
    let addr = inlay.tls_addr.unwrap();

    let h1 = connect(addr, &pki.client(&[b"http/1.1"]), "a.test")
        .await
        .unwrap();
    assert_eq!(alpn(&h1).as_deref(), Some(&b"http/1.1"[..]));
    let mut h1 = Session::open(h1).await;
    let (first, body) = h1.get("a.test", "/static/1000", &[]).await;
    assert_eq!((first.status.as_u16(), body.len()), (200, 1000));
    assert_eq!(first.version, http::Version::HTTP_11);
    let (again, _) = h1.get("a.test", "/static/1000", &[]).await;
    assert!(cache_status(&again).contains("hit"), "{again:?}");

    let h2 = connect(addr, &pki.client(&[b"h2", b"http/1.1"]), "a.test")
        .await
        .unwrap();
    assert_eq!(alpn(&h2).as_deref(), Some(&b"h2"[..]));
    let mut h2 = Session::open(h2).await;
    let (hit, body) = h2.get("a.test", "/static/1000", &[]).await;
    assert_eq!(hit.version, http::Version::HTTP_2);
    assert_eq!(body.len(), 1000);
    assert!(cache_status(&hit).contains("hit"), "{hit:?}");
    assert_eq!(origin.count("/static/1000").await, 1);

    // A pass tells the origin https, whatever the client claimed; a fetch
    // for the cache leaves it out (it is not in the key: docs/cache.md,
    // "Forwarding headers").
    assert_eq!(forwarded_proto(&mut h2, "POST").await, ["https"]);
    assert!(forwarded_proto(&mut h2, "GET").await.is_empty());

    // A plain listener's requests stay http in the log.
    let plain = common::get(&inlay.url("/static/1000")).await;
    assert_eq!(plain.status, 200);
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = inlay.access.lines();
        if lines.len() >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let schemes: Vec<String> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["scheme"].to_string())
        .collect();
    let mut want = vec!["\"https\""; 5];
    want.push("\"http\"");
    assert_eq!(schemes, want, "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_with_a_ticket() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = start(&origin, &pki, "").await;
    let addr = inlay.tls_addr.unwrap();
    let client = pki.client(&[b"http/1.1"]);
    let mut first = Session::open(connect(addr, &client, "a.test").await.unwrap()).await;
    // TLS 1.3 tickets come after the handshake: a request makes sure they did.
    first.get("a.test", "/static/1", &[]).await;
    let second = connect(addr, &client, "a.test").await.unwrap();
    assert_eq!(
        second.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_new_certificates_to_new_connections_and_open_ones_go_on() {
    let origin = Origin::start();
    let pki = Pki::new();
    let [a, b, _] = two_names(&pki);
    let inlay = start(&origin, &pki, "[admin]\nlisten = \"127.0.0.1:0\"").await;
    let addr = inlay.tls_addr.unwrap();
    let client = pki.client(&[b"http/1.1"]);
    let old = connect(addr, &client, "a.test").await.unwrap();
    assert_eq!(peer_certificate(&old), a);
    let mut old = Session::open(old).await;
    assert_eq!(old.get("a.test", "/static/5", &[]).await.0.status, 200);

    let renewed = pki.issue("a", &["a.test"]);
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A session from before the reload resumes (the ticket key is kept),
    // carrying the certificate it was made with.
    let resumed = connect(addr, &client, "a.test").await.unwrap();
    assert_eq!(
        resumed.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed)
    );
    // A fresh client gets the new certificate.
    let client = pki.client(&[b"http/1.1"]);
    let new = connect(addr, &client, "a.test").await.unwrap();
    assert_eq!(peer_certificate(&new), renewed);
    assert_ne!(renewed, a);
    // The connection opened before the reload still serves.
    assert_eq!(old.get("a.test", "/static/5", &[]).await.0.status, 200);

    // A key that does not load refuses the reload, naming the entry.
    std::fs::write(pki.path("b.key"), "-----BEGIN PRIVATE KEY-----\ngarbage\n").unwrap();
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("server.tls[1].key: "), "{}", r.text());
    // ... and the same for a key that is not the certificate's.
    std::fs::copy(pki.path("default.key"), pki.path("b.key")).unwrap();
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("server.tls[1].key: "), "{}", r.text());
    // Nothing changed: b.test still gets its certificate, a.test the renewed one.
    let client = pki.client(&[b"http/1.1"]);
    let b_conn = connect(addr, &client, "b.test").await.unwrap();
    assert_eq!(peer_certificate(&b_conn), b);
    assert_eq!(
        peer_certificate(&connect(addr, &client, "a.test").await.unwrap()),
        renewed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_load_stops_the_start() {
    let pki = Pki::new();
    two_names(&pki);
    std::fs::write(pki.path("a.pem"), "not a certificate\n").unwrap();
    let text = format!(
        "[server]\nlisten = [\"https://127.0.0.1:0\"]\n{}[backends.default]\naddress = \"http://127.0.0.1:1\"\n",
        pki.entry("a", &["a.test"])
    );
    let cfg = inlay::config::Config::from_toml(&text).unwrap();
    let err = inlay::startup::Proxy::load(cfg).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("server.tls[0].cert: "),
        "{err:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_garbage_handshake_is_closed_and_others_are_served() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = Harness::builder()
        .backend(&origin)
        .server("tls_handshake_timeout = \"500ms\"")
        .arg("-a")
        .arg("https://127.0.0.1:0")
        .toml(&pki.entry("default", &[]))
        .start_in_process()
        .await;
    let addr = inlay.tls_addr.unwrap();
    // The start of a ClientHello record, never finished.
    let stalled = tokio::spawn(raw(
        addr,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        Duration::from_secs(5),
    ));
    // Plain HTTP on the TLS port.
    let (_, closed) = raw(
        addr,
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(closed, "garbage left open");
    // Random bytes.
    let (_, closed) = raw(addr, &[0xff; 64], Duration::from_secs(5)).await;
    assert!(closed, "random bytes left open");
    let started = std::time::Instant::now();
    let (_, closed) = stalled.await.unwrap();
    assert!(closed, "a stalled handshake was left open");
    assert!(started.elapsed() < Duration::from_secs(4));
    // A real client is served meanwhile and after.
    let client = pki.client(&[b"h2"]);
    let mut s = Session::open(connect(addr, &client, "127.0.0.1").await.unwrap()).await;
    assert_eq!(s.get("x", "/static/3", &[]).await.0.status, 200);
}

/// `curl` as a client: `--http1.1` and `--http2` with the test CA, the name
/// resolved to the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_a_hit_over_http11_and_h2() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = start(&origin, &pki, "").await;
    let port = inlay.tls_addr.unwrap().port();
    let ca = pki.ca_file();
    let curl = |version: &'static str| {
        let ca = ca.clone();
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new("curl")
                .args(["-sS", "--max-time", "10", version, "--cacert"])
                .arg(&ca)
                .arg("--resolve")
                .arg(format!("b.test:{port}:127.0.0.1"))
                .args(["-o", "/dev/null", "-D", "-"])
                .arg(format!("https://b.test:{port}/static/20"))
                .output()
                .expect("curl runs");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().to_lowercase()
        })
    };
    let first = curl("--http1.1").await.unwrap();
    assert!(first.starts_with("http/1.1 200"), "{first}");
    let second = curl("--http2").await.unwrap();
    assert!(second.starts_with("http/2 200"), "{second}");
    assert!(
        second.contains("cache-status: ") && second.contains("hit"),
        "{second}"
    );
}

/// `openssl s_client`: the protocol versions rustls allows, ALPN, and the
/// chain verified for the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_negotiates_tls12_and_tls13_with_alpn() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = start(&origin, &pki, "").await;
    let addr = inlay.tls_addr.unwrap();
    let ca = pki.ca_file();
    let s_client = |args: &'static [&'static str]| {
        let ca = ca.clone();
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new("timeout")
                .args(["10", "openssl", "s_client", "-connect"])
                .arg(addr.to_string())
                .args([
                    "-servername",
                    "a.test",
                    "-verify_hostname",
                    "a.test",
                    "-CAfile",
                ])
                .arg(&ca)
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("openssl runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    let tls13 = s_client(&["-tls1_3", "-alpn", "h2,http/1.1"])
        .await
        .unwrap();
    assert!(
        tls13.contains("Protocol  : TLSv1.3") || tls13.contains("TLSv1.3"),
        "{tls13}"
    );
    assert!(tls13.contains("ALPN protocol: h2"), "{tls13}");
    assert!(tls13.contains("Verify return code: 0 (ok)"), "{tls13}");
    let tls12 = s_client(&["-tls1_2", "-alpn", "http/1.1"]).await.unwrap();
    assert!(tls12.contains("TLSv1.2"), "{tls12}");
    assert!(tls12.contains("ALPN protocol: http/1.1"), "{tls12}");
    assert!(tls12.contains("Verify return code: 0 (ok)"), "{tls12}");
    let old = s_client(&["-tls1_1"]).await.unwrap();
    assert!(
        old.contains("no peer certificate available"),
        "TLS 1.1 accepted: {old}"
    );
}

/// `server.proxy_protocol` on a TLS listener: the header comes first, then
/// the handshake, and the request carries the proxied client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_comes_before_the_tls_handshake() {
    use tokio::io::AsyncWriteExt;
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = Harness::builder()
        .backend(&origin)
        .server("proxy_protocol = true\nproxy_protocol_from = [\"127.0.0.1\"]")
        .arg("-a")
        .arg("https://127.0.0.1:0")
        .toml(&pki.entry("a", &["a.test"]))
        .start_in_process()
        .await;
    let mut tcp = TcpStream::connect(inlay.tls_addr.unwrap()).await.unwrap();
    tcp.write_all(b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 443\r\n")
        .await
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(pki.client(&[b"h2"]));
    let tls = connector
        .connect(ServerName::try_from("a.test").unwrap(), tcp)
        .await
        .unwrap();
    let mut s = Session::open(tls).await;
    let (parts, body) = s.send("POST", "a.test", "/echo", &[]).await;
    assert_eq!(parts.status, 200);
    let reply = common::Reply {
        status: 200,
        headers: parts.headers,
        body,
        version: parts.version,
    };
    assert_eq!(
        common::echoed(&reply, "x-forwarded-for").as_deref(),
        Some("203.0.113.7")
    );
    // Without the header, the TLS listener closes the connection.
    let err = connect(inlay.tls_addr.unwrap(), &pki.client(&[b"h2"]), "a.test").await;
    assert!(err.is_err(), "a handshake without a PROXY header succeeded");
}

/// h2 over TLS gets the `server.h2_*` limits h2c has: the advertised
/// stream limit, and a GOAWAY for a rapid-reset flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_over_tls_has_the_h2c_limits() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = Harness::builder()
        .backend(&origin)
        .server("h2_max_concurrent_streams = 3")
        .server("h2_max_pending_accept_reset_streams = 20")
        .arg("-a")
        .arg("https://127.0.0.1:0")
        .toml(&pki.entry("a", &["a.test"]))
        .start_in_process()
        .await;
    // The server closes right after its GOAWAY; a client still writing
    // resets may see the broken pipe before it reads the GOAWAY (a race of
    // the client's, not the server's): up to three floods, one must get it.
    let mut last = None;
    for _ in 0..3 {
        let tls = connect(inlay.tls_addr.unwrap(), &pki.client(&[b"h2"]), "a.test")
            .await
            .unwrap();
        let (send, conn) = h2::client::handshake(tls).await.unwrap();
        let conn = tokio::spawn(conn);
        let mut send = send.ready().await.unwrap();
        let req = http::Request::get("https://a.test/static/1")
            .body(())
            .unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        assert_eq!(resp.await.unwrap().status(), 200);
        assert_eq!(send.current_max_send_streams(), 3);
        for _ in 0..100 {
            let Ok(ready) = send.clone().ready().await else {
                break;
            };
            send = ready;
            let req = http::Request::get("https://a.test/static/2")
                .body(())
                .unwrap();
            let Ok((_, mut stream)) = send.send_request(req, false) else {
                break;
            };
            stream.send_reset(h2::Reason::CANCEL);
        }
        let e = tokio::time::timeout(Duration::from_secs(10), conn)
            .await
            .expect("the connection ended within 10 s")
            .unwrap()
            .expect_err("ended without an error");
        if e.is_io() {
            last = Some(e);
            continue;
        }
        assert_eq!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{e:?}");
        return;
    }
    panic!("every flood ended on the transport, never on a GOAWAY: {last:?}");
}

/// Reads what the server sends on `s` until it closes (within 5 s).
async fn read_until_closed(s: &mut TlsStream<TcpStream>) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    match read {
        Ok(_) => got,
        Err(_) => panic!(
            "not closed within 5 s; got {:?}",
            String::from_utf8_lossy(&got)
        ),
    }
}

/// Once ALPN has chosen `h2`, the connection speaks HTTP/2 only: a client
/// that does not send the connection preface gets its connection closed
/// (RFC 9113 3.4; h2spec 3.5/2), never an HTTP/1.1 answer, while the `h2`
/// crate's client, which sends it, is served. Without `h2` in ALPN, a
/// TLS connection is HTTP/1 only (HTTP/2 over TLS needs ALPN, 3.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_alpn_h2_an_invalid_preface_is_closed_not_answered_in_http1() {
    use tokio::io::AsyncWriteExt;
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = start(&origin, &pki, "").await;
    let addr = inlay.tls_addr.unwrap();
    let h2_client = pki.client(&[b"h2"]);
    for preface in [
        &b"GET /static/1 HTTP/1.1\r\nhost: a.test\r\n\r\n"[..],
        b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
    ] {
        let mut tls = connect(addr, &h2_client, "a.test").await.unwrap();
        assert_eq!(alpn(&tls).as_deref(), Some(&b"h2"[..]));
        tls.write_all(preface).await.unwrap();
        let got = read_until_closed(&mut tls).await;
        // Nothing but HTTP/2 frames (the server's SETTINGS, a GOAWAY).
        let mut frames = &got[..];
        while let [a, b, c, kind, ..] = *frames {
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            assert!(kind <= 9 && frames.len() >= 9 + len, "not HTTP/2: {got:?}");
            frames = &frames[9 + len..];
        }
        assert!(
            frames.is_empty(),
            "not HTTP/2 frames: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    let tls = connect(addr, &h2_client, "a.test").await.unwrap();
    let (send, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::get("https://a.test/static/1")
        .body(())
        .unwrap();
    let (resp, _) = send.send_request(req, true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    // ALPN http/1.1: the HTTP/2 preface is no HTTP/1 request (hyper closes
    // the connection at it, unanswered).
    let mut tls = connect(addr, &pki.client(&[b"http/1.1"]), "a.test")
        .await
        .unwrap();
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let got = read_until_closed(&mut tls).await;
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || got.starts_with("HTTP/1.1 4"),
        "served as HTTP/2 without ALPN h2: {got:?}"
    );
}

/// A WebSocket over TLS: `wss://` with ALPN http/1.1 (what browsers send)
/// upgrades the HTTP/1.1 connection; with ALPN h2 it is an extended
/// CONNECT stream (RFC 8441). Both reach the origin's echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_is_tunnelled_over_http11_and_h2() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let inlay = start(&origin, &pki, "").await;
    let addr = inlay.tls_addr.unwrap();
    let hello = Message::text("hello over tls");

    let h1 = connect(addr, &pki.client(&[b"http/1.1"]), "a.test")
        .await
        .unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async("wss://a.test/ws", h1)
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    ws.send(hello.clone()).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), hello);
    ws.close(None).await.unwrap();

    let h2 = connect(addr, &pki.client(&[b"h2"]), "a.test")
        .await
        .unwrap();
    assert_eq!(alpn(&h2).as_deref(), Some(&b"h2"[..]));
    let mut ws = common::h2_websocket(TokioIo::new(h2), "https://a.test/ws").await;
    ws.send(hello.clone()).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), hello);
    assert_eq!(origin.count("/ws").await, 2);
}

/// A server certificate verifier that checks as a client trusting the
/// test CA does, and keeps the OCSP response the server stapled.
#[derive(Debug)]
struct StapleSeen {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    stapled: std::sync::Mutex<Option<Vec<u8>>>,
}

impl rustls::client::danger::ServerCertVerifier for StapleSeen {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.stapled.lock().unwrap() = Some(ocsp_response.to_vec());
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, &[], now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The OCSP response stapled on a fresh handshake for `name` (rustls
/// clients ask for the status on every handshake), over TLS `version`;
/// empty: none.
async fn stapled(
    pki: &Pki,
    addr: SocketAddr,
    name: &str,
    version: &'static rustls::SupportedProtocolVersion,
) -> Vec<u8> {
    let (verifier, client) = staple_client(pki, version);
    let stream = connect(addr, &Arc::new(client), name).await.unwrap();
    drop(stream);
    let seen = verifier.stapled.lock().unwrap().take();
    seen.expect("the certificate was verified")
}

/// A client over TLS `version` trusting the test CA, and its verifier,
/// which keeps the OCSP response stapled on the handshake.
fn staple_client(
    pki: &Pki,
    version: &'static rustls::SupportedProtocolVersion,
) -> (Arc<StapleSeen>, rustls::ClientConfig) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(StapleSeen {
        inner: rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap(),
        stapled: Default::default(),
    });
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    (verifier, client)
}

/// The OCSP response stapled on a fresh QUIC handshake (ALPN `h3`, TLS
/// 1.3) with the `quic://` listener at `addr` for `name`; empty: none.
async fn stapled_quic(pki: &Pki, addr: SocketAddr, name: &str) -> Vec<u8> {
    let (verifier, mut client) = staple_client(pki, &rustls::version::TLS13);
    client.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(client).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    let conn = tokio::time::timeout(
        Duration::from_secs(10),
        endpoint.connect(addr, name).unwrap(),
    )
    .await
    .expect("QUIC handshake within 10 s")
    .expect("QUIC handshake");
    conn.close(0u32.into(), b"");
    endpoint.wait_idle().await;
    let seen = verifier.stapled.lock().unwrap().take();
    seen.expect("the certificate was verified")
}

/// Inlay with a TLS and a QUIC listener serving `a.test` with `ocsp`
/// stapled, the default certificate with none, and the admin API.
async fn start_stapling(origin: &Origin, pki: &Pki, ocsp: &std::path::Path) -> Harness {
    Harness::builder()
        .backend(origin)
        .arg("-a")
        .arg("https://127.0.0.1:0")
        .arg("-a")
        .arg("quic://127.0.0.1:0")
        .toml(&pki.entry("a", &["a.test"]))
        .toml(&format!("ocsp_file = {ocsp:?}\n"))
        .toml(&pki.entry("default", &[]))
        .toml("[admin]\nlisten = \"127.0.0.1:0\"")
        .start_in_process()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ocsp_response_is_stapled_and_a_reload_reads_the_renewed_one() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let first = pki.ocsp("a", 1);
    let a_ocsp = pki.path("a.ocsp");
    let inlay = start_stapling(&origin, &pki, &a_ocsp).await;
    let addr = inlay.tls_addr.unwrap();
    let tls13 = &rustls::version::TLS13;
    let tls12 = &rustls::version::TLS12;
    assert_eq!(stapled(&pki, addr, "a.test", tls13).await, first);
    assert_eq!(stapled(&pki, addr, "a.test", tls12).await, first);
    assert!(stapled(&pki, addr, "default.test", tls13).await.is_empty());

    // openssl's client shows the response it asked for with -status.
    let ca = pki.ca_file();
    let s_client = tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("timeout")
            .args(["10", "openssl", "s_client", "-status", "-connect"])
            .arg(addr.to_string())
            .args(["-servername", "a.test", "-CAfile"])
            .arg(&ca)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("openssl runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap();
    assert!(
        s_client.contains("OCSP Response Status: successful (0x0)"),
        "{s_client}"
    );
    assert!(s_client.contains("Cert Status: unknown"), "{s_client}");

    // The operator's job writes a renewed response; a reload staples it.
    let renewed = pki.ocsp("a", 2);
    assert_ne!(renewed, first);
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(stapled(&pki, addr, "a.test", tls13).await, renewed);

    // A file that is not a DER response refuses the reload, naming the
    // key, and the last good one is stapled still.
    let pem = format!(
        "-----BEGIN OCSP RESPONSE-----\n{}\n-----END OCSP RESPONSE-----\n",
        renewed.len()
    );
    std::fs::write(&a_ocsp, pem).unwrap();
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        r.text().contains("server.tls[0].ocsp_file: ") && r.text().contains("not a DER OCSP"),
        "{}",
        r.text()
    );
    std::fs::remove_file(&a_ocsp).unwrap();
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("cannot read it"), "{}", r.text());
    assert_eq!(stapled(&pki, addr, "a.test", tls13).await, renewed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ocsp_response_is_stapled_on_quic_handshakes_and_a_reload_renews_it_there() {
    let origin = Origin::start();
    let pki = Pki::new();
    two_names(&pki);
    let first = pki.ocsp("a", 1);
    let a_ocsp = pki.path("a.ocsp");
    let inlay = start_stapling(&origin, &pki, &a_ocsp).await;
    let quic = inlay.quic_addr.unwrap();
    assert_eq!(stapled_quic(&pki, quic, "a.test").await, first);
    assert!(stapled_quic(&pki, quic, "default.test").await.is_empty());

    // The QUIC handshakes read the certificates the reload installed, not
    // a copy made at the start.
    let renewed = pki.ocsp("a", 2);
    assert_ne!(renewed, first);
    let r = request("POST", &inlay.admin_url("/reload"), &[], Bytes::new()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(stapled_quic(&pki, quic, "a.test").await, renewed);
    let tls = inlay.tls_addr.unwrap();
    assert_eq!(
        stapled(&pki, tls, "a.test", &rustls::version::TLS13).await,
        renewed
    );
}

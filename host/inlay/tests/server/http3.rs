//! HTTP/3 on a `quic://` listener, in process against the test origin,
//! with hyperium's h3 client over quinn: the cache, ESI streamed in order,
//! large bodies both ways, a policy, many streams on one connection, the
//! `Alt-Svc` of the TLS listener, the drain, and a flood of Initials from
//! one address while another client is served.
//!
//! `cargo test -p inlay --test server -- http3::`

use crate::common;

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use common::{Harness, Origin, get, policy};
use rustls::pki_types::CertificateDer;

/// A self-signed certificate for `localhost`, written as PEM files.
struct Cert {
    dir: tempfile::TempDir,
    der: CertificateDer<'static>,
}

impl Cert {
    fn new() -> Self {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.pem"), c.cert.pem()).unwrap();
        std::fs::write(dir.path().join("c.key"), c.signing_key.serialize_pem()).unwrap();
        Self {
            der: c.cert.der().clone(),
            dir,
        }
    }

    fn entry(&self) -> String {
        format!(
            "[[server.tls]]\ncert = {:?}\nkey = {:?}\n",
            self.dir.path().join("c.pem"),
            self.dir.path().join("c.key")
        )
    }
}

/// Inlay with a plain, a TLS and a QUIC listener, and `server` lines in
/// `[server]`.
async fn start(origin: &Origin, cert: &Cert, server: &str) -> Harness {
    start_with(origin, cert, server, &[]).await
}

async fn start_with(origin: &Origin, cert: &Cert, server: &str, args: &[&str]) -> Harness {
    let mut b = Harness::builder().backend(origin);
    for a in [
        "-a",
        "127.0.0.1:0",
        "-a",
        "https://127.0.0.1:0",
        "-a",
        "quic://127.0.0.1:0",
    ]
    .iter()
    .chain(args)
    {
        b = b.arg(*a);
    }
    b.server(server)
        .toml(&cert.entry())
        .start_in_process()
        .await
}

/// A QUIC client endpoint on `bind` trusting `cert`, offering `h3`.
fn endpoint(bind: &str, cert: &Cert) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut e = quinn::Endpoint::client(bind.parse().unwrap()).unwrap();
    e.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    e
}

/// One HTTP/3 connection.
#[derive(Clone)]
struct H3 {
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    _endpoint: quinn::Endpoint,
}

/// A response, with when each DATA chunk arrived (since the request).
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
    chunks: Vec<(Duration, usize)>,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl H3 {
    async fn connect(addr: SocketAddr, cert: &Cert) -> Self {
        Self::connect_from("127.0.0.1:0", addr, cert).await
    }

    async fn connect_from(bind: &str, addr: SocketAddr, cert: &Cert) -> Self {
        let endpoint = endpoint(bind, cert);
        let conn = tokio::time::timeout(
            Duration::from_secs(10),
            endpoint.connect(addr, "localhost").unwrap(),
        )
        .await
        .expect("QUIC handshake within 10 s")
        .expect("QUIC handshake");
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Self {
            send,
            _endpoint: endpoint,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.request("GET", path, &[], Bytes::new()).await
    }

    async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Answer {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("https://localhost{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(()).unwrap();
        let mut send = self.send.clone();
        let exchange = async move {
            let started = Instant::now();
            let mut stream = send.send_request(req).await.unwrap();
            // In pieces, as a client streams an upload; the server may
            // stop reading it (a body past max_request_body) and answer.
            let mut stopped = false;
            for piece in body.chunks(64 * 1024) {
                if stream
                    .send_data(Bytes::copy_from_slice(piece))
                    .await
                    .is_err()
                {
                    stopped = true;
                    break;
                }
            }
            // A server that answered without the rest of the request may
            // stop reading it first (RFC 9114 4.1): the response counts.
            if !stopped {
                let _ = stream.finish().await;
            }
            let resp = stream.recv_response().await.unwrap();
            let mut body = Vec::new();
            let mut chunks = Vec::new();
            while let Some(mut chunk) = stream.recv_data().await.unwrap() {
                chunks.push((started.elapsed(), chunk.remaining()));
                while chunk.has_remaining() {
                    let c = chunk.chunk();
                    body.extend_from_slice(c);
                    let n = c.len();
                    chunk.advance(n);
                }
            }
            Answer {
                status: resp.status().as_u16(),
                headers: resp.headers().clone(),
                body: body.into(),
                chunks,
            }
        };
        tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .expect("HTTP/3 response within 30 s")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_get_over_http3_is_a_hit_and_tls_responses_advertise_it() {
    let origin = Origin::start();
    let cert = Cert::new();
    let inlay = start(&origin, &cert, "").await;
    let quic = inlay.quic_addr.unwrap();
    let h3 = H3::connect(quic, &cert).await;
    let first = h3.get("/static/177").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), 177);
    let again = h3.get("/static/177").await;
    assert!(again.header("cache-status").contains("hit"), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(origin.count("/static/177").await, 1);
    // The origin hears of HTTPS, whatever the client claimed.
    // (A POST: a GET for the cache leaves the field out, docs/cache.md.)
    let echo = h3
        .request(
            "POST",
            "/echo",
            &[("x-forwarded-proto", "http")],
            Bytes::new(),
        )
        .await;
    let v: serde_json::Value = serde_json::from_slice(&echo.body).unwrap();
    let protos: Vec<&str> = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == "x-forwarded-proto")
        .map(|h| h[1].as_str().unwrap())
        .collect();
    assert_eq!(protos, ["https"], "{}", echo.text());
    // The access log names the protocol; the metrics count it.
    let line = inlay
        .access
        .wait_for(&["/static/177", "HTTP/3.0"], Duration::from_secs(5))
        .await;
    assert!(line.is_some(), "{}", inlay.access.text());
    let text = inlay.metrics.encode();
    assert!(
        text.contains("inlay_client_requests_total{protocol=\"http/3\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("inlay_quic_connections_accepted_total 1"),
        "{text}"
    );
    // HTTP/3 is on: the TLS listener says where; plain HTTP does not.
    let alt_svc = format!("h3=\":{}\"; ma=86400", quic.port());
    let tls = tls_get(inlay.tls_addr.unwrap(), &cert, "/static/177").await;
    assert_eq!(tls.headers().get("alt-svc").unwrap(), alt_svc.as_str());
    let plain = get(&inlay.url("/static/177")).await;
    assert_eq!(plain.header("alt-svc"), None);
}

/// A GET over TLS (HTTP/1.1) to `addr`.
async fn tls_get(addr: SocketAddr, cert: &Cert, path: &str) -> http::Response<Bytes> {
    use http_body_util::BodyExt;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let (parts, body) = send.send_request(req).await.unwrap().into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_esi_page_streams_over_http3_with_slow_fragments_in_order() {
    let origin = Origin::start();
    let cert = Cert::new();
    let inlay = start(&origin, &cert, "").await;
    let h3 = H3::connect(inlay.quic_addr.unwrap(), &cert).await;
    // Fragment 0 is the slowest: the order must still be 0, 1, 2, 3.
    let r = h3
        .get("/esi/page?n=4&delays=600,100,300,200&cacheable=0")
        .await;
    assert_eq!(r.status, 200);
    let text = r.text();
    let pos: Vec<usize> = (0..4)
        .map(|i| {
            text.find(&format!("data-id=\"{i}\""))
                .unwrap_or_else(|| panic!("fragment {i} missing: {text}"))
        })
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "out of order: {text}");
    assert!(!text.contains("<esi:"), "{text}");
    // Streamed: the page's head came before the slowest fragment did, and
    // the whole page took the slowest fragment, not the sum.
    let (first, _) = r.chunks[0];
    let (last, _) = *r.chunks.last().unwrap();
    assert!(first < Duration::from_millis(400), "{:?}", r.chunks);
    assert!(last >= Duration::from_millis(600), "{:?}", r.chunks);
    assert!(last < Duration::from_millis(1100), "{:?}", r.chunks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_go_both_ways_over_http3() {
    let origin = Origin::start();
    let cert = Cert::new();
    let inlay = start(&origin, &cert, "").await;
    let h3 = H3::connect(inlay.quic_addr.unwrap(), &cert).await;
    let n = 8 << 20;
    let path = format!("/bytes/{n}");
    let over_h1 = get(&inlay.url(&path)).await;
    assert_eq!(over_h1.body.len(), n);
    let miss_or_hit = h3.get(&path).await;
    assert_eq!(miss_or_hit.status, 200);
    assert!(miss_or_hit.body == over_h1.body, "8 MiB differ");
    assert!(miss_or_hit.chunks.len() > 1, "one chunk of 8 MiB?");
    // An upload in 64 KiB pieces reaches the origin whole.
    let up = vec![b'x'; 4 << 20];
    let r = h3.request("POST", "/upload", &[], up.into()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["bytes"], 4 << 20);
    // ... within server.max_request_body.
    let limited = start(&origin, &cert, "max_request_body = \"1MiB\"").await;
    let h3 = H3::connect(limited.quic_addr.unwrap(), &cert).await;
    let r = h3
        .request("POST", "/upload", &[], vec![b'x'; 2 << 20].into())
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_s_headers_apply_over_http3() {
    let origin = Origin::start();
    let cert = Cert::new();
    let headers = policy("headers").display().to_string();
    let inlay = start_with(&origin, &cert, "", &["--policy", &headers]).await;
    let h3 = H3::connect(inlay.quic_addr.unwrap(), &cert).await;
    let path = "/echo?b=2&utm_source=x&a=1&cc=max-age%3D60&h=Server:Apache";
    let r = h3.get(path).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-inlay-policy"), "headers");
    assert_eq!(r.header("server"), "");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["query"], "b=2&a=1&cc=max-age%3D60&h=Server:Apache");
    // Another tracking value: the same object, and on_deliver on the hit.
    let r = h3
        .get("/echo?b=2&utm_campaign=y&a=1&cc=max-age%3D60&h=Server:Apache")
        .await;
    assert!(r.header("cache-status").contains("hit"), "{r:?}");
    assert_eq!(r.header("x-inlay-policy"), "headers");
    assert_eq!(origin.count("/echo").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_on_one_connection_are_all_answered_within_the_stream_limit() {
    let origin = Origin::start();
    let cert = Cert::new();
    // Sixteen at once: the rest wait for a stream credit, none is refused.
    let inlay = start(&origin, &cert, "h2_max_concurrent_streams = 16").await;
    let h3 = H3::connect(inlay.quic_addr.unwrap(), &cert).await;
    let requests = (0..200).map(|i| {
        let h3 = h3.clone();
        tokio::spawn(async move {
            let r = h3.get(&format!("/static/{}", 100 + i % 50)).await;
            (i, r)
        })
    });
    for r in futures_util::future::join_all(requests).await {
        let (i, r) = r.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), 100 + i % 50);
    }
    // 50 distinct objects: each fetched once, the rest hits or joined fills.
    let counts: u64 = {
        let mut n = 0;
        for i in 0..50 {
            n += origin.count(&format!("/static/{}", 100 + i)).await;
        }
        n
    };
    assert_eq!(counts, 50);
    assert_eq!(inlay.metrics.quic().accepted(), 1);
}

/// `n` Initial packets of distinct connections, as quinn clients send
/// them: made towards a socket that never answers, and kept.
async fn initials(cert: &Cert, n: usize) -> Vec<Vec<u8>> {
    let sink = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let to = sink.local_addr().unwrap();
    let client = endpoint("127.0.0.1:0", cert);
    let mut pending = Vec::new();
    let mut packets = Vec::new();
    let mut buf = vec![0u8; 2048];
    while packets.len() < n {
        pending.push(client.connect(to, "localhost").unwrap());
        let len = tokio::time::timeout(Duration::from_secs(5), sink.recv(&mut buf))
            .await
            .expect("an Initial")
            .unwrap();
        packets.push(buf[..len].to_vec());
    }
    client.close(0u32.into(), b"");
    packets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_initials_from_one_address_gets_retries_and_another_client_is_served() {
    let origin = Origin::start();
    let cert = Cert::new();
    let inlay = start(&origin, &cert, "").await;
    let quic = inlay.quic_addr.unwrap();
    let flood = initials(&cert, 1000).await;
    // From 127.0.0.2, which never answers what the server sends.
    let flooder = tokio::net::UdpSocket::bind("127.0.0.2:0").await.unwrap();
    let sending = tokio::spawn(async move {
        // In bursts of 50: a socket's receive buffer holds about 150 of
        // them, and what the kernel drops never reaches the server.
        for _ in 0..3 {
            for burst in flood.chunks(50) {
                for p in burst {
                    flooder.send_to(p, quic).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Meanwhile a client on 127.0.0.1 connects (through a Retry: the
    // server is busy with handshakes) and is served.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let h3 = H3::connect(quic, &cert).await;
    for i in 0..20 {
        let r = h3.get(&format!("/static/{}", 10 + i)).await;
        assert_eq!(r.status, 200);
    }
    let took = started.elapsed();
    sending.await.unwrap();
    assert!(took < Duration::from_secs(3), "served in {took:?}");
    let quic_stats = inlay.metrics.quic();
    // The handshakes the flood got are bounded; the rest were Retries.
    assert!(
        quic_stats.retries() >= 600,
        "retries: {}",
        quic_stats.retries()
    );
    assert!(
        quic_stats.open() <= inlay_listener::quic::RETRY_ABOVE + 1,
        "open: {}",
        quic_stats.open()
    );
    // The client connected once and is still being served.
    let r = h3.get("/static/5").await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_lets_an_http3_request_in_flight_finish() {
    let origin = Origin::start();
    let cert = Cert::new();
    let mut inlay = start(&origin, &cert, "").await;
    let quic = inlay.quic_addr.unwrap();
    let h3 = H3::connect(quic, &cert).await;
    let slow = tokio::spawn({
        let h3 = h3.clone();
        async move { h3.get("/esi/page?n=2&delay_ms=500&cacheable=0").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = Instant::now();
    inlay.stop().await;
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("data-id=\"1\""), "{}", r.text());
    assert!(stopping.elapsed() < Duration::from_secs(5));
    // Stopped: a new connection is not served.
    let e = endpoint("127.0.0.1:0", &cert);
    let connecting = e.connect(quic, "localhost").unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(3), connecting).await;
    assert!(!matches!(refused, Ok(Ok(_))), "connected after the drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_share_is_refused_and_a_silent_connection_times_out() {
    let origin = Origin::start();
    let cert = Cert::new();
    let inlay = start(
        &origin,
        &cert,
        "max_connections_per_client = 1\nidle_timeout = \"1s\"",
    )
    .await;
    let quic = inlay.quic_addr.unwrap();
    let first = H3::connect(quic, &cert).await;
    assert_eq!(first.get("/static/3").await.status, 200);
    // A second connection from 127.0.0.1: proven by a Retry, then refused.
    let e = endpoint("127.0.0.1:0", &cert);
    let second = tokio::time::timeout(
        Duration::from_secs(5),
        e.connect(quic, "localhost").unwrap(),
    )
    .await
    .expect("an answer within 5 s");
    match second {
        Err(quinn::ConnectionError::ConnectionClosed(c)) => {
            assert_eq!(c.error_code, quinn::TransportErrorCode::CONNECTION_REFUSED);
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(inlay.metrics.quic().refused(), 1);
    assert!(inlay.metrics.quic().retries() >= 1);
    // Another address has a share of its own.
    let other = H3::connect_from("127.0.0.2:0", quic, &cert).await;
    assert_eq!(other.get("/static/3").await.status, 200);
    drop((first, other));
    // A connection that says nothing is closed after idle_timeout.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let silent = tokio::time::timeout(
        Duration::from_secs(5),
        e.connect(quic, "localhost").unwrap(),
    )
    .await
    .unwrap()
    .expect("a share free again");
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.closed())
        .await
        .expect("closed within 5 s");
    assert!(
        matches!(closed, quinn::ConnectionError::TimedOut),
        "{closed:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
}

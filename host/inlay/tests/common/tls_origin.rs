//! TLS for the tests: a CA made in the test (rcgen), certificates it
//! issues, and an HTTPS origin (tokio-rustls in front of a small hyper
//! service, HTTP/1.1 and HTTP/2 by ALPN) that says what it saw: the SNI
//! name, the protocol, the Host, whether the client showed a certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::oneshot;

/// A certificate authority of the test's own.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// A leaf certificate for `names` (DNS names or IP addresses).
    pub fn issue(&self, names: &[&str]) -> Issued {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Write the CA certificate to `dir/NAME`; its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.pem).unwrap();
        p
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.pem.as_bytes()).unwrap())
            .unwrap();
        roots
    }
}

/// A self-signed certificate for `names` that says it is a CA, as the
/// usual one-liner makes it (`openssl req -x509 -newkey rsa:2048 -nodes
/// -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1`): the
/// certificate an origin serves and, as its own `ca_file`, the one it
/// is trusted by.
pub fn self_signed_ca(names: &[&str]) -> Issued {
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.self_signed(&key).unwrap();
    Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

impl Issued {
    /// Write `STEM.crt` and `STEM.key` into `dir`; their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An HTTPS origin on a free loopback port, in the test's runtime; stopped
/// on drop. Every response is `200 hello over tls`, not cacheable, with
/// `x-sni`, `x-version`, `x-host` and `x-client-cert` saying what it saw.
pub struct TlsOrigin {
    pub addr: SocketAddr,
    /// Requests answered.
    pub requests: Arc<AtomicU64>,
    /// TLS handshakes that failed.
    pub failed_handshakes: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
}

impl TlsOrigin {
    /// Serve `cert`; with `client_ca`, require a client certificate it issued.
    pub async fn start(cert: &Issued, client_ca: Option<&TestCa>) -> Self {
        Self::start_with_alpn(cert, client_ca, &[b"h2", b"http/1.1"]).await
    }

    /// [`start`](Self::start) offering only `alpn` (e.g. no `h2`).
    pub async fn start_with_alpn(
        cert: &Issued,
        client_ca: Option<&TestCa>,
        alpn: &[&[u8]],
    ) -> Self {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(ca.roots()),
                    provider(),
                )
                .build()
                .unwrap(),
            ),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let failed_handshakes = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let (counted, failed) = (requests.clone(), failed_handshakes.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((s, _)) => s,
                        Err(_) => continue,
                    },
                    _ = &mut stopped => return,
                };
                let (acceptor, counted, failed) =
                    (acceptor.clone(), counted.clone(), failed.clone());
                tokio::spawn(async move {
                    let tls = match acceptor.accept(stream).await {
                        Ok(tls) => tls,
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    };
                    let session = tls.get_ref().1;
                    let sni = session.server_name().unwrap_or("none").to_owned();
                    let client_cert = session.peer_certificates().is_some();
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let host = req
                            .headers()
                            .get(http::header::HOST)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("none")
                            .to_owned();
                        let resp = http::Response::builder()
                            .header("cache-control", "no-store")
                            .header("x-sni", sni.as_str())
                            .header("x-version", format!("{:?}", req.version()))
                            .header("x-host", host)
                            .header("x-client-cert", if client_cert { "yes" } else { "no" })
                            .body(Full::new(Bytes::from_static(b"hello over tls\n")))
                            .unwrap();
                        async move { Ok::<_, std::convert::Infallible>(resp) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            requests,
            failed_handshakes,
            stop: Some(stop),
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for TlsOrigin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

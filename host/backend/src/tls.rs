//! TLS to `https://` backends: the roots a backend's certificate must chain
//! to (the system's, or `ca_file`), the name sent in SNI and verified, an
//! optional client certificate, and ALPN (`h2` when `http2 = true`).
//!
//! Certificates are verified as rustls' `WebPkiServerVerifier` does, with
//! one exception (`OriginVerifier`): a certificate that is exactly one
//! of `ca_file`'s is trusted even when it says it is a CA, as OpenSSL
//! (nginx, Varnish) trusts it; `openssl req -x509` makes such self-signed
//! certificates, and webpki refuses a CA as a server's own certificate.
//! Its dates and name are still checked. Every refused certificate is
//! logged in words that say what to change.
//!
//! The files are read and checked when the config is read, so that a bad
//! file is a config error with its key path (at start-up, `inlay check` and
//! on reload, which then keeps the running generation); a reload reads them
//! again, and a file whose contents changed gives the backend a new client.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::future::Future;
use std::hash::Hasher;
use std::io::Read;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore};

/// Largest certificate or key file read (a CA bundle of the whole Web
/// PKI is well under 1 MiB); past it the file is refused, not read.
const MAX_PEM_FILE: u64 = 16 << 20;

pub use inlay_config::TlsSettings;

/// The TLS of each `https://` backend, by name, its files read.
pub type BackendTlsSet = std::collections::HashMap<String, BackendTls>;

/// The TLS of every `https://` backend of `config`, its files read and
/// checked now: the resolve step's part for backends. Every problem is
/// returned, each with its key path (`backends.NAME.ca_file`).
pub fn load_all(
    config: &inlay_config::Config,
) -> Result<BackendTlsSet, Vec<inlay_config::ConfigIssue>> {
    let mut set = BackendTlsSet::new();
    let mut issues = Vec::new();
    for (name, b) in &config.backends {
        let Some(settings) = &b.tls else { continue };
        match BackendTls::load(name, &b.address, b.host_header.as_deref(), settings.clone()) {
            Ok(tls) => {
                set.insert(name.clone(), tls);
            }
            Err(found) => {
                issues.extend(
                    found
                        .into_iter()
                        .map(|(key, message)| inlay_config::ConfigIssue {
                            path: format!("backends.{name}.{key}"),
                            message,
                        }),
                )
            }
        }
    }
    match issues.is_empty() {
        true => Ok(set),
        false => Err(issues),
    }
}

/// The TLS side of one `https://` backend, ready to connect with.
#[derive(Clone)]
pub struct BackendTls {
    settings: TlsSettings,
    server_name: ServerName<'static>,
    client: Arc<rustls::ClientConfig>,
    /// A hash of the files' contents, so that a reload sees a changed file.
    digest: u64,
}

/// One thing wrong with a backend's TLS settings: the key (within
/// `backends.NAME`) and what is wrong.
pub type TlsIssue = (&'static str, String);

impl BackendTls {
    /// Read and check the files of `settings` for the backend `name` at
    /// `address` (SNI and verification use `host_header`'s host when it is
    /// set, else the address's host). Every problem found, each with its key.
    pub fn load(
        name: &str,
        address: &Uri,
        host_header: Option<&str>,
        settings: TlsSettings,
    ) -> Result<Self, Vec<TlsIssue>> {
        let mut issues = Vec::new();
        let mut digest = DefaultHasher::new();
        let server_name = match host_header {
            Some(h) => server_name(host_of(h)).map_err(|m| ("host_header", m)),
            None => server_name(address.host().unwrap_or_default()).map_err(|m| ("address", m)),
        };
        let server_name = server_name.map_err(|e| issues.push(e)).ok();
        // The roots, the certificates pinned (ca_file's own), and where
        // they come from (for the log).
        let roots = match &settings.ca_file {
            Some(path) => match read_pem(path).and_then(|pem| {
                digest.write(&pem);
                roots_from(&pem, path)
            }) {
                Ok((roots, pinned)) => Some((
                    Arc::new(roots),
                    pinned,
                    format!("ca_file {}", path.display()),
                )),
                Err(m) => {
                    issues.push(("ca_file", m));
                    None
                }
            },
            None => match system_roots() {
                Ok(roots) => Some((roots, Vec::new(), "the system's CA certificates".to_owned())),
                Err(m) => {
                    issues.push(("ca_file", m));
                    None
                }
            },
        };
        let identity = match (&settings.client_cert, &settings.client_key) {
            (None, None) => None,
            (Some(_), None) => {
                issues.push(("client_key", "missing: client_cert needs its key".into()));
                None
            }
            (None, Some(_)) => {
                issues.push((
                    "client_cert",
                    "missing: client_key needs its certificate".into(),
                ));
                None
            }
            (Some(cert), Some(key)) => {
                let chain = read_pem(cert).and_then(|pem| {
                    digest.write(&pem);
                    certificates(&pem, cert)
                });
                let key = read_pem(key).and_then(|pem| {
                    digest.write(&pem);
                    PrivateKeyDer::from_pem_slice(&pem)
                        .map_err(|e| format!("no private key in {}: {e}", key.display()))
                });
                match (chain, key) {
                    (Ok(chain), Ok(key)) => Some((chain, key)),
                    (chain, key) => {
                        if let Err(m) = chain {
                            issues.push(("client_cert", m));
                        }
                        if let Err(m) = key {
                            issues.push(("client_key", m));
                        }
                        None
                    }
                }
            }
        };
        let (Some(server_name), Some((roots, pinned, trust))) = (server_name, roots) else {
            return Err(issues);
        };
        if !issues.is_empty() {
            return Err(issues);
        }
        let verifier = OriginVerifier::new(name, roots, pinned, trust)
            .map_err(|e| vec![("ca_file", format!("TLS setup failed: {e}"))])?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| vec![("address", format!("TLS setup failed: {e}"))])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut client = match identity {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| vec![("client_key", format!("does not fit client_cert: {e}"))])?,
        };
        client.alpn_protocols = if settings.http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Ok(Self {
            settings,
            server_name,
            client: Arc::new(client),
            digest: digest.finish(),
        })
    }

    /// The name sent in SNI and that the certificate must be valid for.
    pub fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// The settings as configured.
    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// The connector for this backend: TCP with `http`'s settings, then
    /// TLS, the two together within `deadline`.
    pub(crate) fn connector(
        &self,
        http: hyper_util::client::legacy::connect::HttpConnector,
        deadline: Duration,
    ) -> Connector {
        let name = self.server_name.clone();
        let https = hyper_rustls::HttpsConnector::new(
            http,
            Arc::clone(&self.client),
            true,
            Arc::new(hyper_rustls::FixedServerNameResolver::new(name)),
        );
        Connector {
            inner: https,
            deadline,
        }
    }

    /// A connector for a plain `http://` backend, of the same type as the
    /// TLS ones: it never starts TLS (the scheme is `http`).
    pub(crate) fn plain_connector(
        http: hyper_util::client::legacy::connect::HttpConnector,
        deadline: Duration,
    ) -> Connector {
        static UNUSED: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
        let unused = UNUSED.get_or_init(|| {
            Arc::new(
                rustls::ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .expect("ring supports the default protocol versions")
                    .with_root_certificates(RootCertStore::empty())
                    .with_no_client_auth(),
            )
        });
        let https = hyper_rustls::HttpsConnector::new(
            http,
            Arc::clone(unused),
            false,
            Arc::new(hyper_rustls::DefaultServerNameResolver::default()),
        );
        Connector {
            inner: https,
            deadline,
        }
    }
}

impl fmt::Debug for BackendTls {
    /// Paths, name and a digest of the contents: reload compares backends'
    /// configs by their `Debug` text, so a changed file shows here.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendTls")
            .field("settings", &self.settings)
            .field("server_name", &self.server_name)
            .field("digest", &format_args!("{:016x}", self.digest))
            .finish()
    }
}

/// The connector every backend client uses: `http://` or `https://` (the
/// backend's scheme decides), with one deadline on TCP connect and TLS
/// handshake together, so a handshake that stalls is a down backend (503)
/// within `connect_timeout`, not a first-byte timeout.
#[derive(Clone, Debug)]
pub struct Connector {
    inner: hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    deadline: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Stream = hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;

impl tower_service::Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let deadline = self.deadline;
        Box::pin(async move {
            match tokio::time::timeout(deadline, connecting).await {
                Ok(result) => result,
                Err(_) => Err(format!(
                    "connect and TLS handshake took over {deadline:?} (connect_timeout)"
                )
                .into()),
            }
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The host of a Host header value (`example.com:8443`, `[::1]:8080`).
fn host_of(host_header: &str) -> &str {
    inlay_core::headers::host_without_port(host_header)
}

fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host:?} cannot be a TLS server name: {e}"))
}

fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut pem = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if pem.len() as u64 > MAX_PEM_FILE {
        return Err(format!(
            "{} is larger than {} MiB: not a PEM file",
            path.display(),
            MAX_PEM_FILE >> 20
        ));
    }
    Ok(pem)
}

fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("bad PEM in {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "no certificate (-----BEGIN CERTIFICATE-----) in {}",
            path.display()
        ));
    }
    Ok(certs)
}

/// The roots `ca_file` holds, and its certificates as they are (pinned:
/// an origin that presents one of them is trusted, see [`OriginVerifier`]).
fn roots_from(
    pem: &[u8],
    path: &Path,
) -> Result<(RootCertStore, Vec<CertificateDer<'static>>), String> {
    let mut roots = RootCertStore::empty();
    let certs = certificates(pem, path)?;
    for (i, cert) in certs.iter().enumerate() {
        roots.add(cert.clone()).map_err(|e| {
            format!(
                "certificate {} in {} is not a usable CA: {e}",
                i + 1,
                path.display()
            )
        })?;
    }
    Ok((roots, certs))
}

/// How often, at most, a backend's refused certificates are logged.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// An origin's certificate verifier: rustls' own, and a certificate that
/// is exactly one of `ca_file`'s trusted whatever its CA flag (pinning).
/// webpki refuses a certificate that says it is a CA as a server's own
/// (`CaUsedAsEndEntity`), and `openssl req -x509` makes exactly such
/// self-signed certificates; OpenSSL, and so nginx and Varnish, trust one
/// given as its own CA. A pinned certificate's dates are checked (webpki
/// checks an end entity's dates before its CA flag, so a certificate it
/// refused for the flag alone is within them; a test holds it to that)
/// and its name as any other's; the handshake proves the origin holds
/// its key. Each refusal is logged, at most once a minute per backend,
/// with what to change.
#[derive(Debug)]
pub(crate) struct OriginVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
    /// Where the roots come from: `ca_file PATH` or the system's.
    trust: String,
    /// The backend's name, for the log.
    backend: String,
    last_logged: parking_lot::Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl OriginVerifier {
    fn new(
        backend: &str,
        roots: Arc<RootCertStore>,
        pinned: Vec<CertificateDer<'static>>,
        trust: String,
    ) -> Result<Self, rustls::client::VerifierBuilderError> {
        Ok(Self {
            webpki: WebPkiServerVerifier::builder_with_provider(roots, provider()).build()?,
            pinned,
            trust,
            backend: backend.to_owned(),
            last_logged: parking_lot::Mutex::new(None),
            unlogged: AtomicU64::new(0),
        })
    }

    /// `end_entity` is one of `ca_file`'s certificates.
    fn is_pinned(&self, end_entity: &CertificateDer<'_>) -> bool {
        self.pinned
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref())
    }

    /// Log a refusal with what to change, unless one was logged in the
    /// last [`REFUSAL_LOG_EVERY`] (those are counted in the next line).
    fn log_refusal(&self, e: &rustls::Error, server_name: &ServerName<'_>) {
        {
            let mut last = self.last_logged.lock();
            if last.is_some_and(|t| t.elapsed() < REFUSAL_LOG_EVERY) {
                self.unlogged.fetch_add(1, Ordering::Relaxed);
                return;
            }
            *last = Some(Instant::now());
        }
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            backend = %self.backend,
            unlogged,
            "the origin's certificate was refused ({e}): {}",
            advice(e, &self.backend, &server_name.to_str(), &self.trust)
        );
    }
}

impl ServerCertVerifier for OriginVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(e) if is_ca_as_end_entity(&e) && self.is_pinned(end_entity) => {
                ParsedCertificate::try_from(end_entity)
                    .and_then(|cert| rustls::client::verify_server_name(&cert, server_name))
                    .map(|()| ServerCertVerified::assertion())
            }
            verified => verified,
        };
        if let Err(e) = &verified {
            self.log_refusal(e, server_name);
        }
        verified
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.webpki.root_hint_subjects()
    }
}

/// webpki's refusal of a certificate that says it is a CA as a server's own.
fn is_ca_as_end_entity(e: &rustls::Error) -> bool {
    matches!(e, rustls::Error::InvalidCertificate(e) if is_ca_certificate_error(e))
}

fn is_ca_certificate_error(e: &CertificateError) -> bool {
    matches!(
        e,
        CertificateError::Other(other)
            if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
    )
}

/// What to change so that an origin's certificate refused with `e` is
/// trusted: the key of the backend `backend` to set, or what to fix on the
/// origin. `name` is the name verified, `trust` where the roots come from.
fn advice(e: &rustls::Error, backend: &str, name: &str, trust: &str) -> String {
    let ca_file = format!("backends.{backend}.ca_file");
    let rustls::Error::InvalidCertificate(e) = e else {
        return format!("check the certificate the origin sends against {trust}");
    };
    match e {
        CertificateError::UnknownIssuer => format!(
            "no CA in {trust} issued it: set {ca_file} to the PEM of the CA that did (or to this very certificate, to pin it)"
        ),
        e if is_ca_certificate_error(e) => format!(
            "it is a CA certificate (basicConstraints CA:TRUE, as `openssl req -x509` makes) used as the origin's own: put this very certificate in {ca_file} to pin it, or give the origin a certificate issued by that CA"
        ),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => format!(
            "it is not valid for {name:?}, the name verified (the host of backends.{backend}.address, or of host_header when set): give the origin a certificate whose subjectAltName lists {name:?}, or set host_header to a name the certificate lists"
        ),
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "it has expired: renew it on the origin (or check this machine's clock)".to_owned()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "it is not valid yet: check the clocks of this machine and of the origin".to_owned()
        }
        CertificateError::BadSignature => format!(
            "its signature does not verify with the key of its issuer in {trust}: {ca_file} holds another CA of the same name than the one that issued it"
        ),
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "its extended key usage does not allow a TLS server (serverAuth): give the origin a server certificate".to_owned()
        }
        CertificateError::BadEncoding => {
            "it is not a well-formed X.509 certificate: check what the origin is configured to send".to_owned()
        }
        _ => format!("check the certificate the origin sends against {trust}"),
    }
}

/// The system's trusted roots (Debian: /etc/ssl/certs, from the
/// ca-certificates package; SSL_CERT_FILE and SSL_CERT_DIR override),
/// read once per process.
fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                return Err(format!(
                    "no system CA certificates found{why}; install ca-certificates or set ca_file"
                ));
            }
            Ok(Arc::new(roots))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_takes_the_host_of_a_host_header() {
        assert_eq!(host_of("example.com:8443"), "example.com");
        assert_eq!(host_of("example.com"), "example.com");
        assert_eq!(host_of("[::1]:8080"), "::1");
        assert!(server_name("bad name").is_err());
        assert!(server_name("127.0.0.1").is_ok());
    }

    /// A self-signed certificate that says it is a CA, as `openssl req
    /// -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -addext
    /// subjectAltName=IP:127.0.0.1` makes, valid until `until`: DER and PEM.
    fn self_signed_ca(names: &[&str], until: (i32, u8, u8)) -> (CertificateDer<'static>, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        let cert = params.self_signed(&key).unwrap();
        (cert.der().clone(), cert.pem())
    }

    /// The verifier of a backend whose `ca_file` holds `pems`.
    fn verifier_of(pems: &[&str]) -> OriginVerifier {
        let (roots, pinned) = roots_from(pems.concat().as_bytes(), Path::new("ca.pem")).unwrap();
        OriginVerifier::new("origin", Arc::new(roots), pinned, "ca_file ca.pem".into()).unwrap()
    }

    fn verify(
        v: &OriginVerifier,
        cert: &CertificateDer<'_>,
        name: &str,
    ) -> Result<(), rustls::Error> {
        let name = ServerName::try_from(name.to_owned()).unwrap();
        v.verify_server_cert(cert, &[], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn a_self_signed_ca_certificate_given_as_its_own_ca_file_is_pinned() {
        let (cert, pem) = self_signed_ca(&["127.0.0.1", "localhost"], (2200, 1, 1));
        let v = verifier_of(&[&pem]);
        verify(&v, &cert, "127.0.0.1").expect("pinned");
        verify(&v, &cert, "localhost").expect("pinned");
        // Its name is still checked.
        let e = verify(&v, &cert, "other.example").unwrap_err();
        assert!(
            matches!(
                e,
                rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })
            ),
            "{e:?}"
        );
        // And its dates: webpki checks them before the CA flag.
        let (expired, expired_pem) = self_signed_ca(&["127.0.0.1"], (2001, 1, 1));
        let e = verify(&verifier_of(&[&expired_pem]), &expired, "127.0.0.1").unwrap_err();
        assert!(
            matches!(
                e,
                rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. })
            ),
            "{e:?}"
        );
        // Only the very certificate is pinned, among others or not.
        let (_, other) = self_signed_ca(&["127.0.0.1"], (2200, 1, 1));
        assert!(verify(&verifier_of(&[&other]), &cert, "127.0.0.1").is_err());
        assert!(verify(&verifier_of(&[&other, &pem]), &cert, "127.0.0.1").is_ok());
    }

    #[test]
    fn refusals_say_what_to_change() {
        let cases = [
            (CertificateError::UnknownIssuer, "backends.origin.ca_file"),
            (
                CertificateError::Other(rustls::OtherError(Arc::new(
                    webpki::Error::CaUsedAsEndEntity,
                ))),
                "put this very certificate in backends.origin.ca_file",
            ),
            (CertificateError::NotValidForName, "host_header"),
            (CertificateError::Expired, "renew it"),
            (CertificateError::NotValidYet, "clock"),
            (CertificateError::BadSignature, "backends.origin.ca_file"),
            (CertificateError::InvalidPurpose, "serverAuth"),
        ];
        for (e, words) in cases {
            let text = advice(
                &rustls::Error::InvalidCertificate(e.clone()),
                "origin",
                "127.0.0.1",
                "ca_file ca.pem",
            );
            assert!(text.contains(words), "{e:?}: {text}");
        }
    }

    #[test]
    fn bad_files_are_issues_with_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let uri: Uri = "https://origin.test".parse().unwrap();
        let issues = BackendTls::load(
            "secure",
            &uri,
            None,
            TlsSettings {
                ca_file: Some(junk.clone()),
                client_cert: Some(dir.path().join("missing.pem")),
                client_key: Some(junk),
                http2: false,
            },
        )
        .unwrap_err();
        let keys: Vec<_> = issues.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["ca_file", "client_cert", "client_key"], "{issues:?}");
        assert!(issues[0].1.contains("no certificate"), "{issues:?}");
        assert!(issues[1].1.contains("cannot read"), "{issues:?}");
    }
}

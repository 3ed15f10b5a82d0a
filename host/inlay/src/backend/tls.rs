//! TLS to `https://` backends: the roots a backend's certificate must chain
//! to (the system's, or `ca_file`), the name sent in SNI and verified, an
//! optional client certificate, and ALPN (`h2` when `http2 = true`).
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
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Largest certificate or key file read (a CA bundle of the whole Web
/// PKI is well under 1 MiB); past it the file is refused, not read.
const MAX_PEM_FILE: u64 = 16 << 20;

pub use crate::config::TlsSettings;

/// The TLS of each `https://` backend, by name, its files read.
pub type BackendTlsSet = std::collections::HashMap<String, BackendTls>;

/// The TLS of every `https://` backend of `config`, its files read and
/// checked now: the resolve step's part for backends. Every problem is
/// returned, each with its key path (`backends.NAME.ca_file`).
pub fn load_all(
    config: &crate::config::Config,
) -> Result<BackendTlsSet, Vec<crate::config::ConfigIssue>> {
    let mut set = BackendTlsSet::new();
    let mut issues = Vec::new();
    for (name, b) in &config.backends {
        let Some(settings) = &b.tls else { continue };
        match BackendTls::load(&b.address, b.host_header.as_deref(), settings.clone()) {
            Ok(tls) => {
                set.insert(name.clone(), tls);
            }
            Err(found) => {
                issues.extend(
                    found
                        .into_iter()
                        .map(|(key, message)| crate::config::ConfigIssue {
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
    /// Read and check the files of `settings` for a backend at `address`
    /// (SNI and verification use `host_header`'s host when it is set, else
    /// the address's host). Every problem found, each with its key.
    pub fn load(
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
        let roots = match &settings.ca_file {
            Some(path) => match read_pem(path).and_then(|pem| {
                digest.write(&pem);
                roots_from(&pem, path)
            }) {
                Ok(roots) => Some(Arc::new(roots)),
                Err(m) => {
                    issues.push(("ca_file", m));
                    None
                }
            },
            None => match system_roots() {
                Ok(roots) => Some(roots),
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
        let (Some(server_name), Some(roots)) = (server_name, roots) else {
            return Err(issues);
        };
        if !issues.is_empty() {
            return Err(issues);
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| vec![("address", format!("TLS setup failed: {e}"))])?
            .with_root_certificates(roots);
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
    if let Some(rest) = host_header.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host_header.split(':').next().unwrap_or(host_header)
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

fn roots_from(pem: &[u8], path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in certificates(pem, path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            format!(
                "certificate {} in {} is not a usable CA: {e}",
                i + 1,
                path.display()
            )
        })?;
    }
    Ok(roots)
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

    #[test]
    fn bad_files_are_issues_with_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let uri: Uri = "https://origin.test".parse().unwrap();
        let issues = BackendTls::load(
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

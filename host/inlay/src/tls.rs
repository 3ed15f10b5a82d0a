//! TLS termination on the `https://` listeners (rustls, ring provider).
//!
//! One [`Tls`] serves the whole process: its rustls config (ALPN `h2` and
//! `http/1.1`, TLS 1.2 and 1.3, a session cache and rotating session
//! tickets) is made once, so that sessions resume across reloads; the
//! certificates it serves are a [`CertificateSet`] swapped by a reload
//! ([`Tls::install`]). A handshake picks its certificate when it starts, so
//! connections already open keep theirs.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsCertConfig;

/// TLS sessions the server remembers for resumption by session id (TLS 1.2
/// clients without tickets, TLS 1.3 clients that ask for stateful resumption);
/// bounded, the oldest go first.
const SESSION_CACHE_ENTRIES: usize = 16 * 1024;

/// The protocols offered by ALPN, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The TLS side of the listeners: the rustls config every handshake uses
/// and the certificates it serves.
pub struct Tls {
    certificates: Arc<SniResolver>,
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("certificates", &self.certificates.current.load().len())
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// The TLS side serving `entries` (`[[server.tls]]`), their files read
    /// now. Errors name the entry's key (`server.tls[N].cert: ...`).
    pub fn new(entries: &[TlsCertConfig]) -> Result<Self, Vec<String>> {
        let set = CertificateSet::load(entries)?;
        let certificates = Arc::new(SniResolver {
            current: ArcSwap::from_pointee(set),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| vec![format!("server.tls: {e}")])?
        .with_no_client_auth()
        .with_cert_resolver(certificates.clone());
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES);
        config.ticketer = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| vec![format!("server.tls: cannot make a session ticket key: {e}")])?;
        Ok(Self {
            certificates,
            config: Arc::new(config),
        })
    }

    /// Serve `set` to the handshakes that start from now on.
    pub fn install(&self, set: CertificateSet) {
        self.certificates.current.store(Arc::new(set));
    }

    /// How many `[[server.tls]]` entries are served.
    pub fn len(&self) -> usize {
        self.certificates.current.load().len()
    }

    /// Whether no certificate is served (every handshake fails).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An acceptor for one connection's handshake.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }
}

/// The certificates of `[[server.tls]]`, by SNI name, with the default.
#[derive(Default)]
pub struct CertificateSet {
    by_name: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    entries: usize,
}

impl std::fmt::Debug for CertificateSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.by_name.keys().collect();
        names.sort();
        f.debug_struct("CertificateSet")
            .field("names", &names)
            .field("default", &self.default.is_some())
            .finish()
    }
}

impl CertificateSet {
    /// Read every entry's certificate chain and key, and check that they
    /// belong together. Every entry's problems are returned, each naming
    /// its key (`server.tls[N].cert: ...`), none read half.
    pub fn load(entries: &[TlsCertConfig]) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let mut set = Self {
            entries: entries.len(),
            ..Self::default()
        };
        for (i, entry) in entries.iter().enumerate() {
            let key = match load_entry(entry) {
                Ok(k) => Arc::new(k),
                Err((field, message)) => {
                    errors.push(format!("server.tls[{i}].{field}: {message}"));
                    continue;
                }
            };
            // The entry without names, or else the first, is the default.
            if entry.names.is_empty() || (i == 0 && set.default.is_none()) {
                set.default = Some(key.clone());
            }
            for name in &entry.names {
                set.by_name.insert(name.clone(), key.clone());
            }
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(errors)
        }
    }

    fn len(&self) -> usize {
        self.entries
    }

    /// The certificate for `name` (an exact name first, then `*.` over its
    /// first label), or the default.
    fn pick(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let found = name.and_then(|n| {
            let n = n.to_ascii_lowercase();
            self.by_name.get(&n).or_else(|| {
                let (_, parent) = n.split_once('.')?;
                self.by_name.get(&format!("*.{parent}"))
            })
        });
        found.or(self.default.as_ref()).cloned()
    }
}

/// One entry's chain and key, or the field at fault and why.
fn load_entry(entry: &TlsCertConfig) -> Result<CertifiedKey, (&'static str, String)> {
    let cert_err = |m: String| ("cert", m);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&entry.cert)
        .map_err(|e| cert_err(format!("cannot read {}: {e}", entry.cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| {
            cert_err(format!(
                "{} is not a PEM certificate file: {e}",
                entry.cert.display()
            ))
        })?;
    if chain.is_empty() {
        return Err(cert_err(format!(
            "{} holds no certificate (-----BEGIN CERTIFICATE-----)",
            entry.cert.display()
        )));
    }
    let key_err = |m: String| ("key", m);
    let key = PrivateKeyDer::from_pem_file(&entry.key).map_err(|e| {
        key_err(format!(
            "cannot read a private key from {}: {e}",
            entry.key.display()
        ))
    })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| {
        key_err(format!(
            "{} is not a usable private key: {e}",
            entry.key.display()
        ))
    })?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| {
        key_err(format!(
            "{} does not belong to the certificate in {}: {e}",
            entry.key.display(),
            entry.cert.display()
        ))
    })?;
    Ok(certified)
}

/// Picks each handshake's certificate from the current set.
struct SniResolver {
    current: ArcSwap<CertificateSet>,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniResolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load().pick(hello.server_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_cert(dir: &std::path::Path, name: &str) -> TlsCertConfig {
        let c = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        TlsCertConfig {
            cert,
            key,
            names: vec![name.to_owned()],
        }
    }

    #[test]
    fn names_pick_their_certificate_and_others_get_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_cert(dir.path(), "a.example");
        let mut b = write_cert(dir.path(), "b.example");
        b.names = vec!["*.b.example".into()];
        let mut d = write_cert(dir.path(), "default.example");
        d.names.clear();
        let set = CertificateSet::load(&[a, b, d]).unwrap();
        let der = |n: Option<&str>| set.pick(n).unwrap().cert[0].clone();
        let a_der = der(Some("a.example"));
        assert_eq!(der(Some("A.EXAMPLE")), a_der);
        assert_ne!(der(Some("www.b.example")), a_der);
        assert_ne!(der(Some("b.example")), der(Some("www.b.example")));
        assert_eq!(der(Some("b.example")), der(None), "not covered by *.");
        assert_eq!(der(Some("unknown.example")), der(None));
        assert_ne!(der(None), a_der);
    }

    #[test]
    fn the_first_entry_is_the_default_when_every_entry_has_names() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_cert(dir.path(), "a.example");
        let b = write_cert(dir.path(), "b.example");
        let set = CertificateSet::load(&[a, b]).unwrap();
        assert_eq!(
            set.pick(None).unwrap().cert[0],
            set.pick(Some("a.example")).unwrap().cert[0]
        );
    }

    #[test]
    fn bad_files_are_named_by_their_entry_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let good = write_cert(dir.path(), "a.example");
        let other = write_cert(dir.path(), "b.example");
        let missing = TlsCertConfig {
            cert: dir.path().join("nope.pem"),
            ..good.clone()
        };
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a pem file\n").unwrap();
        let not_a_cert = TlsCertConfig {
            cert: garbage.clone(),
            ..good.clone()
        };
        let not_a_key = TlsCertConfig {
            key: garbage,
            ..good.clone()
        };
        let wrong_key = TlsCertConfig {
            key: other.key.clone(),
            ..good.clone()
        };
        let errors =
            CertificateSet::load(&[good, missing, not_a_cert, not_a_key, wrong_key]).unwrap_err();
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(
            errors[0].starts_with("server.tls[1].cert: cannot read"),
            "{errors:?}"
        );
        assert!(errors[1].starts_with("server.tls[2].cert: "), "{errors:?}");
        assert!(errors[2].starts_with("server.tls[3].key: "), "{errors:?}");
        assert!(
            errors[3].starts_with("server.tls[4].key: ") && errors[3].contains("does not belong"),
            "{errors:?}"
        );
    }
}

//! TLS termination on the TLS listeners (rustls, ring provider).
//!
//! One [`Tls`] serves every TLS listener of a process: its rustls config
//! (ALPN `h2` and `http/1.1`, TLS 1.2 and 1.3, a session cache and rotating
//! session tickets) is made once, so that sessions resume across reloads;
//! the certificates it serves are a [`CertificateSet`] swapped by a reload
//! ([`Tls::install`]). A handshake picks its certificate when it starts, so
//! connections already open keep theirs. The caller reads and checks the
//! certificate and key files; this module takes them loaded.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::CLIENT_WARNINGS;
use crate::activity::TrackedIo;
use crate::limits::Limits;

/// TLS sessions the server remembers for resumption by session id (TLS 1.2
/// clients without tickets, TLS 1.3 clients that ask for stateful resumption);
/// bounded, the oldest go first.
const SESSION_CACHE_ENTRIES: usize = 16 * 1024;

/// The protocols offered by ALPN, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// What ALPN offers on the QUIC listeners (RFC 9114 3.1).
const ALPN_QUIC: [&[u8]; 1] = [b"h3"];

/// Why the TLS side could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refused the protocol versions.
    #[error("{0}")]
    Versions(rustls::Error),
    /// No key for session tickets could be made.
    #[error("cannot make a session ticket key: {0}")]
    Ticketer(rustls::Error),
}

/// The TLS side of the listeners: the rustls config every handshake uses
/// and the certificates it serves.
pub struct Tls {
    certificates: Arc<SniResolver>,
    config: Arc<rustls::ServerConfig>,
    /// The same certificates, sessions and ticket key, with ALPN `h3`
    /// and TLS 1.3 only (QUIC), for the QUIC listeners.
    quic: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("certificates", &self.len())
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// The TLS side serving `certificates`.
    pub fn new(certificates: CertificateSet) -> Result<Self, TlsError> {
        let certificates = Arc::new(SniResolver {
            current: ArcSwap::from_pointee(certificates),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Versions)?
        .with_no_client_auth()
        .with_cert_resolver(certificates.clone());
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES);
        config.ticketer = rustls::crypto::ring::Ticketer::new().map_err(TlsError::Ticketer)?;
        let mut quic = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::Versions)?
        .with_no_client_auth()
        .with_cert_resolver(certificates.clone());
        quic.alpn_protocols = ALPN_QUIC.iter().map(|p| p.to_vec()).collect();
        quic.session_storage = config.session_storage.clone();
        quic.ticketer = config.ticketer.clone();
        Ok(Self {
            certificates,
            config: Arc::new(config),
            quic: Arc::new(quic),
        })
    }

    /// The rustls config of the QUIC listeners' handshakes.
    pub(crate) fn quic_config(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.quic)
    }

    /// Serve `set` to the handshakes that start from now on.
    pub fn install(&self, set: CertificateSet) {
        self.certificates.current.store(Arc::new(set));
    }

    /// How many certificate entries are served.
    pub fn len(&self) -> usize {
        self.certificates.current.load().entries
    }

    /// Whether no certificate is served (every handshake fails).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An acceptor for one connection's handshake.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }
}

/// Certificates by SNI name, with the default for clients that send no
/// name or one no entry lists.
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
    /// The set of `entries`, each a certificate chain with its key and the
    /// names it serves (lower-case; `*.example.com` covers one label). The
    /// entry without names, or else the first, is the default.
    pub fn new(entries: impl IntoIterator<Item = (Arc<CertifiedKey>, Vec<String>)>) -> Self {
        let mut set = Self::default();
        for (i, (key, names)) in entries.into_iter().enumerate() {
            set.entries += 1;
            if names.is_empty() || (i == 0 && set.default.is_none()) {
                set.default = Some(key.clone());
            }
            for name in names {
                set.by_name.insert(name, key.clone());
            }
        }
        set
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

/// What is wrong with `der` as an OCSP response to staple, if anything.
///
/// The frame only (RFC 6960 4.2.1): one DER `OCSPResponse` SEQUENCE
/// filling the file, whose `responseStatus` is `successful` and which
/// carries `responseBytes`. It catches the usual mistakes (a PEM or
/// base64 file, a truncated download, a responder's `tryLater`); whether
/// the response is signed by the issuer and current is the client's check,
/// as with nginx's `ssl_stapling_file`. Written here: no crate in the
/// tree parses OCSP, and this is twenty lines of DER framing. The caller
/// reads the file; `CertifiedKey::ocsp` then staples it.
pub fn ocsp_response_problem(der: &[u8]) -> Option<String> {
    /// A DER tag-length header at the start of `b`: the tag, the content's
    /// length, and the header's own length.
    fn header(b: &[u8]) -> Option<(u8, usize, usize)> {
        let (&tag, rest) = b.split_first()?;
        let (&first, rest) = rest.split_first()?;
        if first < 0x80 {
            return Some((tag, usize::from(first), 2));
        }
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &d| (acc << 8) | usize::from(d));
        Some((tag, len, 2 + n))
    }
    let not_der = || {
        Some(
            "not a DER OCSP response (an OCSPResponse SEQUENCE; PEM or base64 text must be \
             decoded first, e.g. `openssl ocsp ... -respout FILE`)"
                .to_owned(),
        )
    };
    let Some((0x30, len, at)) = header(der) else {
        return not_der();
    };
    if at.checked_add(len) != Some(der.len()) {
        return not_der();
    }
    let body = &der[at..];
    // responseStatus ENUMERATED, then [0] EXPLICIT responseBytes.
    let [0x0a, 0x01, status, rest @ ..] = body else {
        return not_der();
    };
    let name = match status {
        0 => None,
        1 => Some("malformedRequest"),
        2 => Some("internalError"),
        3 => Some("tryLater"),
        5 => Some("sigRequired"),
        6 => Some("unauthorized"),
        _ => return not_der(),
    };
    if let Some(name) = name {
        return Some(format!(
            "the responder answered {name} ({status}), not a status to staple"
        ));
    }
    match header(rest) {
        Some((0xa0, len, at)) if at.checked_add(len) == Some(rest.len()) => None,
        _ => not_der(),
    }
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

/// The TLS handshake of a connection on a TLS listener, within
/// `tls_handshake_timeout`; `None` (the connection closed, a rate-limited
/// warning logged) when it fails, takes too long, or the server stops.
pub(crate) async fn handshake(
    tls: &Tls,
    tcp: TrackedIo,
    peer: SocketAddr,
    limits: &Limits,
    stop: &CancellationToken,
) -> Option<tokio_rustls::server::TlsStream<TrackedIo>> {
    let accept = tokio::time::timeout(limits.tls_handshake_timeout, tls.acceptor().accept(tcp));
    let result = tokio::select! {
        r = accept => r,
        () = stop.cancelled() => return None,
    };
    match result {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            if e.kind() == io::ErrorKind::UnexpectedEof
                || e.kind() == io::ErrorKind::ConnectionReset
            {
                debug!(%peer, error = %e, "client went away during the TLS handshake");
            } else if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, error = %e, suppressed = more, "TLS handshake failed; connection closed");
            }
            None
        }
        Err(_) => {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "TLS handshake not complete within tls_handshake_timeout; connection closed");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    use super::*;

    /// A self-signed certificate for `name`, with its key.
    fn key(name: &str) -> Arc<CertifiedKey> {
        let c = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(c.signing_key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&der).unwrap();
        Arc::new(CertifiedKey::new(vec![c.cert.der().clone()], signer))
    }

    #[test]
    fn names_pick_their_certificate_and_others_get_the_default() {
        let set = CertificateSet::new([
            (key("a.example"), vec!["a.example".to_owned()]),
            (key("b.example"), vec!["*.b.example".to_owned()]),
            (key("default.example"), vec![]),
        ]);
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
        let set = CertificateSet::new([
            (key("a.example"), vec!["a.example".to_owned()]),
            (key("b.example"), vec!["b.example".to_owned()]),
        ]);
        assert_eq!(
            set.pick(None).unwrap().cert[0],
            set.pick(Some("a.example")).unwrap().cert[0]
        );
    }

    #[test]
    fn an_ocsp_file_must_be_a_successful_der_response() {
        // SEQUENCE { ENUMERATED 0, [0] { SEQUENCE { OID, OCTET STRING } } }
        let good = [
            0x30, 0x0d, 0x0a, 0x01, 0x00, 0xa0, 0x08, 0x30, 0x06, 0x06, 0x01, 0x2a, 0x04, 0x01,
            0x00,
        ];
        assert_eq!(ocsp_response_problem(&good), None);
        let try_later = [0x30, 0x03, 0x0a, 0x01, 0x03];
        let m = ocsp_response_problem(&try_later).unwrap();
        assert!(m.contains("tryLater (3)"), "{m}");
        for bad in [
            &b"-----BEGIN OCSP RESPONSE-----\n"[..],
            &good[..good.len() - 1],
            &[good.as_slice(), &[0]].concat(),
            &[0x30, 0x03, 0x0a, 0x01, 0x00],
            &[],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
        ] {
            let m = ocsp_response_problem(bad).expect("refused");
            assert!(m.contains("not a DER OCSP response"), "{m}");
        }
    }

    #[test]
    fn a_reload_swaps_what_new_handshakes_get() {
        let tls = Tls::new(CertificateSet::default()).unwrap();
        assert!(tls.is_empty());
        tls.install(CertificateSet::new([(key("a.example"), vec![])]));
        assert_eq!(tls.len(), 1);
        assert!(tls.certificates.current.load().pick(Some("x")).is_some());
    }
}

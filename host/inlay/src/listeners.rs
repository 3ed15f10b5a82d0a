//! The client listeners' glue to `inlay-listener`: `[server]` as the
//! listener's [`Limits`], the `[[server.tls]]` files read into the
//! certificates it serves, the open-file limit `[server]` needs, and the
//! service that hands each request to the current pipeline generation, from
//! the TCP listeners and the QUIC (HTTP/3) ones alike.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};
use inlay_core::ProxyBody;
use inlay_listener::open_files::{self, Shortfall};
use inlay_listener::{
    CertificateSet, Connection, ConnectionStats, Limits, PeerFilter, QuicServer, QuicStats, Server,
};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{ConfigIssue, ServerConfig, TlsCertConfig};
use crate::pipeline::{ClientBody, Generations};

pub use inlay_listener::{Listener, OverTls, QuicListener, Tls};

/// How long a client may remember that HTTP/3 is served (`Alt-Svc`'s
/// `ma`, in seconds): a day, as Caddy and Cloudflare advertise.
const ALT_SVC_MAX_AGE: u32 = 86_400;

/// The listener's limits as `[server]` sets them.
pub fn limits(server: &ServerConfig) -> Limits {
    Limits {
        max_connections: server.max_connections,
        max_connections_per_client: server.max_connections_per_client,
        tarpit_max: server.tarpit_max,
        listen_backlog: server.listen_backlog,
        defer_accept: server.defer_accept,
        tcp_notsent_lowat: server.tcp_notsent_lowat,
        // The config refuses `proxy_protocol` without the peers it trusts.
        proxy_protocol: server.proxy_protocol.then(|| {
            let from = server.proxy_protocol_from.clone();
            PeerFilter::new(move |ip| from.iter().any(|n| n.contains(ip)))
        }),
        header_read_timeout: server.header_read_timeout,
        tls_handshake_timeout: server.tls_handshake_timeout,
        idle_timeout: server.idle_timeout,
        busy_idle_timeout: server.busy_idle_timeout,
        send_timeout: server.send_timeout,
        idle_send_timeout: server.idle_send_timeout,
        connection_deadline: None,
        max_header_size: server.max_header_size,
        keep_alive: true,
        http2: true,
        upgrades: true,
        h2_max_concurrent_streams: server.h2_max_concurrent_streams,
        h2_max_header_list_size: server.h2_max_header_list_size,
        h2_max_pending_accept_reset_streams: server.h2_max_pending_accept_reset_streams,
        h2_max_local_error_reset_streams: server.h2_max_local_error_reset_streams,
        h2_keep_alive_interval: server.h2_keep_alive_interval,
        h2_keep_alive_timeout: server.h2_keep_alive_timeout,
        shutdown_timeout: server.shutdown_timeout,
        setting_prefix: "server.",
    }
}

/// What the listeners count: the TCP connections and the QUIC ones.
#[derive(Debug, Clone)]
pub struct ListenerStats {
    /// The TCP listeners'.
    pub tcp: Arc<ConnectionStats>,
    /// The QUIC listeners'.
    pub quic: Arc<QuicStats>,
}

/// Serve `listeners` (TCP) and `quic` (HTTP/3) until `shutdown` resolves,
/// then drain both at once (see [`Server::serve`], [`QuicServer::serve`]):
/// each request runs on the pipeline generation current when it starts,
/// to its end; the limits follow `limits`, which a reload sends. With a
/// QUIC listener, responses on the TLS listeners advertise it (`Alt-Svc`).
pub async fn serve(
    listeners: impl IntoIterator<Item = impl Into<Listener>>,
    quic: Vec<QuicListener>,
    current: Arc<Generations>,
    limits: watch::Receiver<Arc<Limits>>,
    stats: ListenerStats,
    shutdown: impl Future<Output = ()>,
) {
    let alt_svc = quic.first().and_then(|l| alt_svc(l.local_addr().port()));
    let stop = CancellationToken::new();
    let tcp = Server::new(limits.clone(), {
        let current = Arc::clone(&current);
        move |conn: &Connection| PipelineService {
            current: Arc::clone(&current),
            conn: *conn,
            alt_svc: alt_svc.clone().filter(|_| conn.tls),
        }
    })
    .with_stats(stats.tcp)
    .serve(listeners, stop.clone().cancelled_owned());
    let h3 = QuicServer::new(limits, move |conn: &Connection| PipelineService {
        current: Arc::clone(&current),
        conn: *conn,
        alt_svc: None,
    })
    .with_stats(stats.quic)
    .serve(quic, stop.clone().cancelled_owned());
    let signal = async {
        shutdown.await;
        stop.cancel();
    };
    tokio::join!(tcp, h3, signal);
}

/// The `Alt-Svc` field that points clients to HTTP/3 on `port` of the
/// same host (RFC 7838, RFC 9114 3.1.1).
fn alt_svc(port: u16) -> Option<http::HeaderValue> {
    http::HeaderValue::try_from(format!("h3=\":{port}\"; ma={ALT_SVC_MAX_AGE}")).ok()
}

/// A connection's requests, each handed to the generation current when
/// it comes.
struct PipelineService {
    current: Arc<Generations>,
    conn: Connection,
    /// Set on every response (a TLS listener's, when HTTP/3 is served).
    alt_svc: Option<http::HeaderValue>,
}

/// A request being answered: boxed, and made in its box. The request's
/// future (about 9 KB, its states for every phase) held by value would be
/// copied at each move (the listener's wrapper, hyper's slot: 28 KB a
/// request); `Box::pin` of a value makes it on the stack and copies it
/// once more, where `Box::write(Box::new_uninit(), ..)` writes it into
/// the allocation.
type Answer = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

impl<B: ClientBody + Send + 'static> hyper::service::Service<Request<B>> for PipelineService {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut req: Request<B>) -> Answer {
        // Read once: the request finishes on this generation.
        let pipeline = self.current.load_full();
        if self.conn.tls {
            req.extensions_mut().insert(OverTls);
            // What the client claimed is replaced by what Inlay knows.
            req.headers_mut().insert(
                http::HeaderName::from_static("x-forwarded-proto"),
                http::HeaderValue::from_static("https"),
            );
        }
        let peer = self.conn.peer;
        let alt_svc = self.alt_svc.clone();
        let answer = Box::write(Box::new_uninit(), async move {
            let mut resp = pipeline.handle(req, peer).await;
            if let Some(v) = alt_svc {
                resp.headers_mut().insert(http::header::ALT_SVC, v);
            }
            Ok(resp)
        });
        Box::into_pin(answer)
    }
}

/// The TLS side of the listeners serving `certificates` (the resolve
/// step's, from `[[server.tls]]`).
pub fn tls(certificates: CertificateSet) -> anyhow::Result<Tls> {
    Tls::new(certificates).map_err(|e| anyhow::anyhow!("server.tls: {e}"))
}

/// Read every entry's certificate chain and key, and check that they
/// belong together. Every entry's problems are returned, each naming its
/// key (`server.tls[N].cert: ...`), none read half.
pub fn load_certificates(entries: &[TlsCertConfig]) -> Result<CertificateSet, Vec<ConfigIssue>> {
    let mut errors = Vec::new();
    let mut loaded = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        match load_entry(entry) {
            Ok(k) => loaded.push((Arc::new(k), entry.names.clone())),
            Err((field, message)) => errors.push(ConfigIssue {
                path: format!("server.tls[{i}].{field}"),
                message,
            }),
        }
    }
    if errors.is_empty() {
        Ok(CertificateSet::new(loaded))
    } else {
        Err(errors)
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
    let mut certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| {
        key_err(format!(
            "{} does not belong to the certificate in {}: {e}",
            entry.key.display(),
            entry.cert.display()
        ))
    })?;
    if let Some(path) = &entry.ocsp {
        let ocsp_err = |m: String| ("ocsp_file", format!("{}: {m}", path.display()));
        let der = std::fs::read(path).map_err(|e| ocsp_err(format!("cannot read it: {e}")))?;
        inlay_listener::ocsp_response_problem(&der).map_or(Ok(()), |m| Err(ocsp_err(m)))?;
        certified.ocsp = Some(der);
    }
    Ok(certified)
}

/// Raise the soft open-file limit to what `server` needs, up to the hard
/// limit, at start and at every reload; the limit and a smaller tarpit are
/// logged. Returns a warning for the operator when admitted connections
/// may not fit or the limit cannot be read or set.
pub fn raise_open_files(server: &ServerConfig) -> Option<String> {
    let (limit, short) = match open_files::raise(server.max_connections, server.tarpit_max) {
        Ok(raised) => raised,
        Err(e) => return Some(format!("cannot read or raise the open-file limit: {e}")),
    };
    info!(limit, "open-file limit");
    match shortfall_message(server, limit, short?) {
        Ok(warning) => Some(warning),
        Err(note) => {
            info!("{note}");
            None
        }
    }
}

/// What to tell the operator of `short`: a warning (`Ok`) when admitted
/// connections may not fit, a note (`Err`) when only the tarpit is
/// smaller than `server.tarpit_max`.
fn shortfall_message(
    server: &ServerConfig,
    limit: u64,
    short: Shortfall,
) -> Result<String, String> {
    let reserve = open_files::RESERVE;
    match short {
        Shortfall::Clients { needed } => Ok(format!(
            "the open-file limit is {limit}, below the {needed} that server.max_connections \
             ({}) needs with a reserve of {reserve}: past it, new clients wait (raise the hard \
             limit, e.g. LimitNOFILE= in the systemd unit, or lower server.max_connections)",
            server.max_connections
        )),
        Shortfall::Tarpit { bound } => Err(format!(
            "the open-file limit is {limit}: the tarpit holds at most {bound} refused connections, \
             not server.tarpit_max ({}); beside server.max_connections ({}) and a reserve of \
             {reserve} there are no more descriptors",
            server.tarpit_max, server.max_connections
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn server(extra: &str) -> ServerConfig {
        Config::from_toml(&format!(
            "[server]\n{extra}\n[backends.default]\naddress = \"http://127.0.0.1:9\"\n"
        ))
        .unwrap()
        .server
    }

    #[test]
    fn the_limits_are_server_s_and_proxy_protocol_from_tests_its_networks() {
        let s = server(
            "max_connections = 100\ntarpit_max = 50\nproxy_protocol = true\n\
             proxy_protocol_from = [\"10.0.0.0/8\"]",
        );
        let l = limits(&s);
        assert_eq!((l.max_connections, l.tarpit_max), (100, 50));
        assert!(l.keep_alive && l.http2);
        let from = l.proxy_protocol.expect("a filter");
        assert!(from.allows("10.1.2.3".parse().unwrap()));
        assert!(!from.allows("192.0.2.1".parse().unwrap()));
        assert!(limits(&server("")).proxy_protocol.is_none());
    }

    #[test]
    fn an_open_file_limit_short_of_the_clients_names_the_setting() {
        let s = server("max_connections = 100\ntarpit_max = 50");
        let warning = shortfall_message(&s, 1000, Shortfall::Clients { needed: 1124 }).unwrap();
        assert!(
            warning.contains("open-file limit is 1000")
                && warning.contains("below the 1124")
                && warning.contains("server.max_connections (100)"),
            "{warning}"
        );
        let note = shortfall_message(&s, 2000, Shortfall::Tarpit { bound: 40 }).unwrap_err();
        assert!(
            note.contains("at most 40 refused") && note.contains("server.tarpit_max (50)"),
            "{note}"
        );
    }

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
            ocsp: None,
        }
    }

    #[test]
    fn certificate_files_load_with_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_cert(dir.path(), "a.example");
        let mut d = write_cert(dir.path(), "default.example");
        d.names.clear();
        let set = load_certificates(&[a, d]).unwrap();
        assert_eq!(
            format!("{set:?}"),
            "CertificateSet { names: [\"a.example\"], default: true }"
        );
        let tls = tls(load_certificates(&[write_cert(dir.path(), "b.example")]).unwrap()).unwrap();
        assert_eq!(tls.len(), 1);
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
        let errors: Vec<String> =
            load_certificates(&[good, missing, not_a_cert, not_a_key, wrong_key])
                .unwrap_err()
                .iter()
                .map(|i| format!("{}: {}", i.path, i.message))
                .collect();
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

//! `[server]`: listeners, certificates and client-side limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::read::{IpNet, Reader, Table, Value, join, parse_listen};

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses to listen on for plain HTTP (HTTP/1.1 and h2c).
    pub listen: Vec<SocketAddr>,
    /// Addresses to listen on for TLS (`https://ADDR` in `server.listen`).
    pub listen_tls: Vec<SocketAddr>,
    /// Addresses to listen on for HTTP/2 with prior knowledge only
    /// (`h2c://ADDR` in `server.listen`): a connection that does not open
    /// with the HTTP/2 preface is closed, not read as HTTP/1.1.
    pub listen_h2c: Vec<SocketAddr>,
    /// Addresses to listen on for HTTP/3 (`quic://ADDR` in
    /// `server.listen`: UDP, the `[[server.tls]]` certificates).
    pub listen_quic: Vec<SocketAddr>,
    /// `[[server.tls]]`: the certificates the TLS listeners serve.
    pub tls: Vec<TlsCertConfig>,
    /// A TLS client must complete its handshake within this time.
    pub tls_handshake_timeout: Duration,
    /// Every connection starts with a PROXY protocol header (v1 or v2)
    /// naming the real client; one without is closed.
    pub proxy_protocol: bool,
    /// With `proxy_protocol`: the peers (load balancers) allowed to send
    /// the header; a connection from elsewhere is closed unread. Required
    /// (not empty) with `proxy_protocol`: anyone else could claim any
    /// address.
    pub proxy_protocol_from: Vec<IpNet>,
    /// Maximum concurrent client connections; more wait in the accept queue.
    pub max_connections: usize,
    /// Maximum concurrent connections from one client IP address (`0`: no
    /// limit); past it a new connection from that address is refused (held
    /// unanswered for `header_read_timeout`, then closed).
    pub max_connections_per_client: usize,
    /// Connections refused for `max_connections_per_client` held unread at
    /// most (each for `header_read_timeout`, the oldest closed first for a
    /// new one); zero closes them at once. Fewer when the open-file limit
    /// has no room for them beside `max_connections` ([`crate::open_files`]).
    pub tarpit_max: usize,
    /// The kernel's queue of connections not yet accepted, per listener
    /// (`listen(2)`'s backlog; Linux caps it at `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// A client must send its whole request head within this time.
    pub header_read_timeout: Duration,
    /// A connection with no traffic and no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// The idle timeout while fewer than a tenth of `max_connections` are
    /// free, so that idle clients cannot hold every slot.
    pub busy_idle_timeout: Duration,
    /// `defer_accept`: a connection reaches Inlay once its first bytes have
    /// come (TCP_DEFER_ACCEPT), or after this; zero turns it off.
    pub defer_accept: Duration,
    /// `tcp_notsent_lowat`: bytes a client connection's socket may hold
    /// written by Inlay but not yet sent (Linux `TCP_NOTSENT_LOWAT`); zero
    /// leaves the kernel's default (as much as the send buffer takes).
    pub tcp_notsent_lowat: u64,
    /// Longest time to send one response (head and body); the connection
    /// (HTTP/1) or the stream (HTTP/2) is then cut.
    pub send_timeout: Duration,
    /// Longest time a response may make no progress towards the client: a
    /// socket write that does not complete, or an HTTP/2 stream whose
    /// flow-control window keeps it from taking its next chunk.
    pub idle_send_timeout: Duration,
    /// Largest request head accepted, in bytes.
    pub max_header_size: usize,
    /// HTTP/2 (h2c and h2 over TLS): streams a client may have open at once.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2: largest header list (decoded) a client may send, in bytes.
    pub h2_max_header_list_size: u32,
    /// HTTP/2: streams a client may reset before the server took them up
    /// (the rapid-reset attack) before the connection gets a GOAWAY.
    pub h2_max_pending_accept_reset_streams: usize,
    /// HTTP/2: streams the server may reset for the client's errors before
    /// the connection gets a GOAWAY.
    pub h2_max_local_error_reset_streams: usize,
    /// HTTP/2: a PING is sent this often (zero: never) ...
    pub h2_keep_alive_interval: Duration,
    /// ... and the connection closed when its ACK is not back within this.
    pub h2_keep_alive_timeout: Duration,
    /// Largest request body accepted, in bytes; larger ones get 413.
    pub max_request_body: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    pub shutdown_timeout: Duration,
    /// The request-id field (`X-Request-Id`): accepted or minted, sent to
    /// backends and ESI includes, logged and returned. `None`: off.
    pub request_id_header: Option<http::HeaderName>,
    /// Keep a sane request id the client sent; false: always mint one.
    pub trust_request_id: bool,
    /// Add `Server-Timing` to every response (a policy can also turn it on
    /// for one request).
    pub server_timing: bool,
}

/// One `[[server.tls]]` entry: a certificate chain and its key, for the
/// SNI names it lists (none: the default, for clients that send no name or
/// one no entry lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsCertConfig {
    /// PEM file: the certificate, then its intermediates.
    pub cert: PathBuf,
    /// PEM file: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Lower-case host names (`*.example.com` covers one label).
    pub names: Vec<String>,
    /// `ocsp_file`: a DER OCSP response for the certificate, stapled on
    /// handshakes of clients that ask for the status; read again by a
    /// reload (a renewed response is the operator's cron job).
    pub ocsp: Option<PathBuf>,
}

/// Fields `server.request_id_header` may not name: they frame, route or
/// authenticate the message, or are Inlay's own.
pub const REQUEST_ID_RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "cookie",
    "authorization",
    "via",
    "x-forwarded-for",
    "cache-control",
    "inlay-server-timing",
    "server-timing",
];

/// What a `server.listen` entry serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListenScheme {
    /// `ADDR` or `http://ADDR`: HTTP/1.1, and h2c for a client that opens
    /// with the HTTP/2 preface.
    Http,
    /// `https://ADDR`: TLS.
    Https,
    /// `h2c://ADDR`: HTTP/2 with prior knowledge only.
    H2c,
    /// `quic://ADDR`: HTTP/3 over QUIC (UDP).
    Quic,
}

/// A `server.listen` entry: `ADDR` or `http://ADDR` (plain HTTP),
/// `https://ADDR` (TLS) or `h2c://ADDR` (HTTP/2 only, no TLS).
pub(super) fn parse_listener(s: &str) -> Result<(SocketAddr, ListenScheme), String> {
    let (scheme, addr) = match s.split_once("://") {
        None => (ListenScheme::Http, s),
        Some(("http", addr)) => (ListenScheme::Http, addr),
        Some(("https", addr)) => (ListenScheme::Https, addr),
        Some(("h2c", addr)) => (ListenScheme::H2c, addr),
        Some(("quic", addr)) => (ListenScheme::Quic, addr),
        Some(_) => {
            return Err(format!(
                "unknown scheme in {s:?} (use ADDR, http://ADDR, https://ADDR, h2c://ADDR or quic://ADDR)"
            ));
        }
    };
    parse_listen(addr).map(|a| (a, scheme))
}

impl ServerConfig {
    /// Put the listener at `addr` in the list of its `scheme`.
    pub(super) fn add_listener(&mut self, addr: SocketAddr, scheme: ListenScheme) {
        match scheme {
            ListenScheme::Http => self.listen.push(addr),
            ListenScheme::Https => self.listen_tls.push(addr),
            ListenScheme::H2c => self.listen_h2c.push(addr),
            ListenScheme::Quic => self.listen_quic.push(addr),
        }
    }
}

/// Why `server` cannot serve its TLS listeners: none of them has a certificate.
pub(super) fn tls_listeners_without_certificate(server: &ServerConfig) -> Option<String> {
    let first = (server.listen_tls.first().map(|a| format!("https://{a}")))
        .or_else(|| server.listen_quic.first().map(|a| format!("quic://{a}")))?;
    server.tls.is_empty().then(|| {
        format!(
            "{first} needs a certificate: add a [[server.tls]] entry (or pass --tls-cert and --tls-key)"
        )
    })
}

/// A host name `[[server.tls]]` may list: lower-case letters, digits, `-`
/// and dots, optionally `*.` in front.
fn valid_sni_name(name: &str) -> bool {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

impl Reader {
    pub(super) fn server(&mut self, t: &Table) -> ServerConfig {
        let p = "server";
        let mut listeners = Vec::new();
        for (i, a) in self
            .strings(t, p, "listen")
            .unwrap_or_else(|| vec!["127.0.0.1:6081".into()])
            .iter()
            .enumerate()
        {
            match parse_listener(a) {
                Ok(l) => listeners.push(l),
                Err(m) => self.err(format!("server.listen[{i}]"), m),
            }
        }
        let tls = self.tls(t);
        let max_header_size = self.size(t, p, "max_header_size", 64 << 10);
        if !(8192..=1 << 24).contains(&max_header_size) {
            self.err(
                "server.max_header_size",
                format!("must be between 8KiB and 16MiB, got {max_header_size}"),
            );
        }
        let h2_max_header_list_size = self.size(
            t,
            p,
            "h2_max_header_list_size",
            max_header_size.clamp(8192, 1 << 24),
        );
        if !(8192..=1 << 24).contains(&h2_max_header_list_size) {
            self.err(
                "server.h2_max_header_list_size",
                format!("must be between 8KiB and 16MiB, got {h2_max_header_list_size}"),
            );
        }
        let tcp_notsent_lowat = self.size(t, p, "tcp_notsent_lowat", 128 << 10);
        if tcp_notsent_lowat > 1 << 30 {
            self.err(
                "server.tcp_notsent_lowat",
                format!("must be at most 1GiB, got {tcp_notsent_lowat}"),
            );
        }
        let mut server = ServerConfig {
            listen: Vec::new(),
            listen_tls: Vec::new(),
            listen_h2c: Vec::new(),
            listen_quic: Vec::new(),
            tls,
            tls_handshake_timeout: self.positive_duration(
                t,
                p,
                "tls_handshake_timeout",
                Duration::from_secs(10),
            ),
            proxy_protocol: self.boolean(t, p, "proxy_protocol", false),
            proxy_protocol_from: self.networks(t, p, "proxy_protocol_from"),
            max_connections: self.uint(t, p, "max_connections", 10_000, 1, 1_000_000) as usize,
            max_connections_per_client: self.uint(
                t,
                p,
                "max_connections_per_client",
                1_000,
                0,
                1_000_000,
            ) as usize,
            tarpit_max: self.uint(t, p, "tarpit_max", 10_000, 0, 1_000_000) as usize,
            listen_backlog: self.uint(t, p, "listen_backlog", 1024, 1, 65_535) as u32,
            header_read_timeout: self.duration(
                t,
                p,
                "header_read_timeout",
                Duration::from_secs(10),
            ),
            idle_timeout: self.duration(t, p, "idle_timeout", Duration::from_secs(60)),
            busy_idle_timeout: self.positive_duration(
                t,
                p,
                "busy_idle_timeout",
                Duration::from_secs(1),
            ),
            defer_accept: self.duration(t, p, "defer_accept", Duration::from_secs(3)),
            tcp_notsent_lowat,
            send_timeout: self.positive_duration(t, p, "send_timeout", Duration::from_secs(600)),
            idle_send_timeout: self.positive_duration(
                t,
                p,
                "idle_send_timeout",
                Duration::from_secs(60),
            ),
            max_header_size: max_header_size as usize,
            h2_max_concurrent_streams: self.uint(t, p, "h2_max_concurrent_streams", 256, 1, 10_000)
                as u32,
            h2_max_header_list_size: h2_max_header_list_size.min(1 << 24) as u32,
            h2_max_pending_accept_reset_streams: self.uint(
                t,
                p,
                "h2_max_pending_accept_reset_streams",
                20,
                1,
                10_000,
            ) as usize,
            h2_max_local_error_reset_streams: self.uint(
                t,
                p,
                "h2_max_local_error_reset_streams",
                1024,
                1,
                100_000,
            ) as usize,
            h2_keep_alive_interval: self.duration(t, p, "h2_keep_alive_interval", Duration::ZERO),
            h2_keep_alive_timeout: self.positive_duration(
                t,
                p,
                "h2_keep_alive_timeout",
                Duration::from_secs(20),
            ),
            max_request_body: self.size(t, p, "max_request_body", 64 << 20),
            shutdown_timeout: self.duration(t, p, "shutdown_timeout", Duration::from_secs(30)),
            request_id_header: self.request_id_header(t),
            trust_request_id: self.boolean(t, p, "trust_request_id", true),
            server_timing: self.boolean(t, p, "server_timing", false),
        };
        for (addr, scheme) in listeners {
            server.add_listener(addr, scheme);
        }
        if let Some(m) = tls_listeners_without_certificate(&server) {
            self.err("server.listen", m);
        }
        if !server.proxy_protocol && !server.proxy_protocol_from.is_empty() {
            self.err(
                "server.proxy_protocol_from",
                "set, but server.proxy_protocol is off: no header is read",
            );
        }
        if server.proxy_protocol && server.proxy_protocol_from.is_empty() {
            self.err(
                "server.proxy_protocol_from",
                "empty, but server.proxy_protocol is on: any client could send a PROXY header \
                 claiming any address (127.0.0.1 passes cache.purge_allow); list the load \
                 balancers' networks, e.g. [\"10.0.0.0/8\"] (\"0.0.0.0/0\" and \"::/0\" trust everyone)",
            );
        }
        self.unknown_keys(t, p);
        server
    }

    /// `[[server.tls]]`: each entry's files and names; at most one entry
    /// without names (the default), no name in two entries.
    fn tls(&mut self, t: &Table) -> Vec<TlsCertConfig> {
        let items = match self.get(t, "server", "tls") {
            None => return Vec::new(),
            Some(Value::Array(items)) => items,
            Some(v) => {
                self.err(
                    "server.tls",
                    format!("expected [[server.tls]] entries (tables), got {v}"),
                );
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut default_at = None;
        for (i, item) in items.iter().enumerate() {
            let p = format!("server.tls[{i}]");
            let Value::Table(e) = item else {
                self.err(&p, format!("expected a table, got {item}"));
                continue;
            };
            let file = |r: &mut Self, key: &str| match r.string(e, &p, key) {
                Some(f) if !f.is_empty() => Some(PathBuf::from(f)),
                Some(_) => {
                    r.err(join(&p, key), "must name a PEM file");
                    None
                }
                None if !e.contains_key(key) => {
                    r.err(join(&p, key), "missing: the PEM file is required");
                    None
                }
                None => None,
            };
            let cert = file(self, "cert");
            let key = file(self, "key");
            let ocsp = match self.string(e, &p, "ocsp_file") {
                Some(f) if f.is_empty() => {
                    self.err(join(&p, "ocsp_file"), "must name a DER OCSP response file");
                    None
                }
                f => f.map(PathBuf::from),
            };
            let names = self.strings(e, &p, "names").unwrap_or_default();
            for (j, n) in names.iter().enumerate() {
                if !valid_sni_name(n) {
                    self.err(
                        format!("{p}.names[{j}]"),
                        format!(
                            "not a lower-case host name like \"www.example.com\" or \"*.example.com\": {n:?}"
                        ),
                    );
                } else if !seen.insert(n.clone()) {
                    self.err(
                        format!("{p}.names[{j}]"),
                        format!("{n:?} is listed by an earlier entry"),
                    );
                }
            }
            if names.is_empty() && e.contains_key("names") {
                self.err(
                    format!("{p}.names"),
                    "empty: leave it out for the default entry",
                );
            }
            if !e.contains_key("names") {
                match default_at {
                    Some(d) => self.err(
                        format!("{p}.names"),
                        format!(
                            "missing: server.tls[{d}] is the default already (one entry may go without names)"
                        ),
                    ),
                    None => default_at = Some(i),
                }
            }
            if let (Some(cert), Some(key)) = (cert, key) {
                out.push(TlsCertConfig {
                    cert,
                    key,
                    names,
                    ocsp,
                });
            }
            self.unknown_keys(e, &p);
        }
        out
    }

    /// `server.request_id_header`: a field name (default `X-Request-Id`),
    /// or `""` for off. Fields that frame or route the message are refused.
    fn request_id_header(&mut self, t: &Table) -> Option<http::HeaderName> {
        let name = self
            .string(t, "server", "request_id_header")
            .unwrap_or_else(|| "x-request-id".into());
        if name.is_empty() {
            return None;
        }
        match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) if !REQUEST_ID_RESERVED.contains(&n.as_str()) => Some(n),
            Ok(n) => {
                self.err(
                    "server.request_id_header",
                    format!("{n} is a field Inlay or HTTP itself gives meaning to"),
                );
                None
            }
            Err(_) => {
                self.err(
                    "server.request_id_header",
                    format!("{name:?} is not a header field name"),
                );
                None
            }
        }
    }
}

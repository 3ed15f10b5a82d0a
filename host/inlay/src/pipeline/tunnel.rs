//! tunnel: a request that asks to switch protocols (a WebSocket: HTTP/1.1
//! `Upgrade`, or HTTP/2 extended CONNECT, RFC 8441) goes to the backend it
//! would go to as a passed request, always over HTTP/1.1 with `Upgrade`;
//! when the backend switches (101), the client gets its 101 (HTTP/2: a
//! 200) and the bytes are carried both ways until either side closes,
//! nothing moves for `websocket.idle_timeout`, or a drain or a reload
//! ends it after `server.shutdown_timeout`. A backend that answers
//! anything else is a passed response. Nothing is cached.
//!
//! recv finds the upgrade ([`requested`]) and shows it to the policy's
//! `on-request` as a GET with `Upgrade`; the policy may answer it (refuse
//! it) or choose its backend.

use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Response, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use inlay_core::body::{self, ProxyBody};
use inlay_core::{CacheStatus, ProxyError, headers};
use inlay_listener::{TunnelGuard, TunnelTicket};
use tracing::debug;

use super::log::TunnelLog;
use super::{Outcome, Pipeline, RequestCtx, fetch, pass};
use crate::config::WebSocketConfig;
use crate::tunnels::{self, TunnelEnd, TunnelSlot};

const SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
const SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// A request that asks for a tunnel the config allows.
pub struct UpgradeRequest {
    /// The protocol, as the backend is asked to switch to it.
    protocol: HeaderValue,
    /// The client's connection (HTTP/1.1) or stream (HTTP/2), once the
    /// response that switches is sent.
    client: OnUpgrade,
    /// Keeps the client's connection counted while the tunnel is open.
    ticket: TunnelTicket,
    /// An HTTP/2 extended CONNECT: answered 200, its Sec-WebSocket-Key
    /// made here for the backend.
    h2: bool,
}

impl std::fmt::Debug for UpgradeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpgradeRequest")
            .field("protocol", &self.protocol)
            .field("h2", &self.h2)
            .finish_non_exhaustive()
    }
}

impl UpgradeRequest {
    /// The `Upgrade` field the policy sees (and the backend gets).
    pub(super) fn protocol(&self) -> &HeaderValue {
        &self.protocol
    }
}

/// Whether the request (as it came, before recv normalises it) asks for a
/// tunnel `config` allows: `None` when it is plain HTTP, or asks for an
/// upgrade Inlay ignores (a protocol not configured, `h2c`, an HTTP/1.0
/// `Upgrade`: served as HTTP, as RFC 9110 section 7.8 allows). An HTTP/2
/// extended CONNECT for `websocket` becomes the GET with `Upgrade:
/// websocket` an HTTP/1.1 client sends. Refused: any other CONNECT (Inlay
/// is not a forward proxy), and an upgrade with a body.
pub(super) fn requested(
    parts: &mut Parts,
    config: &WebSocketConfig,
) -> Result<Option<UpgradeRequest>, ProxyError> {
    if parts.method == Method::CONNECT {
        return extended_connect(parts, config).map(Some);
    }
    let Some(asked) = parts.headers.get(header::UPGRADE) else {
        return Ok(None);
    };
    // hyper offers the connection only to HTTP/1.1 (RFC 9110: an HTTP/1.0
    // Upgrade is ignored), and only a `Connection: upgrade` asks for it.
    if parts.version != Version::HTTP_11
        || !headers::connection_options(&parts.headers).any(|o| o == header::UPGRADE)
    {
        return Ok(None);
    }
    let Some(protocol) = asked.to_str().ok().and_then(|v| config.tunnelled(v)) else {
        return Ok(None);
    };
    if protocol == "websocket" && parts.method != Method::GET {
        return Err(ProxyError::BadRequest(format!(
            "a WebSocket handshake is a GET, not {} (RFC 6455 section 4.1)",
            parts.method
        )));
    }
    refuse_body(&parts.headers)?;
    let (Some(client), Some(ticket)) = (
        parts.extensions.remove::<OnUpgrade>(),
        parts.extensions.remove::<TunnelTicket>(),
    ) else {
        return Ok(None);
    };
    Ok(Some(UpgradeRequest {
        protocol: HeaderValue::from_str(&protocol)
            .map_err(|_| ProxyError::BadRequest("bad Upgrade".into()))?,
        client,
        ticket,
        h2: false,
    }))
}

/// An HTTP/2 CONNECT: a WebSocket (`:protocol = websocket`) when tunnels
/// are on, refused otherwise.
fn extended_connect(
    parts: &mut Parts,
    config: &WebSocketConfig,
) -> Result<UpgradeRequest, ProxyError> {
    let protocol = parts
        .extensions
        .get::<hyper::ext::Protocol>()
        .map(|p| p.as_str().to_ascii_lowercase());
    let tunnel = (
        parts.extensions.remove::<OnUpgrade>(),
        parts.extensions.remove::<TunnelTicket>(),
    );
    match (protocol.as_deref(), tunnel) {
        (Some("websocket"), (Some(client), Some(ticket)))
            if config.enabled && parts.version == Version::HTTP_2 =>
        {
            refuse_body(&parts.headers)?;
            parts.method = Method::GET;
            let protocol = HeaderValue::from_static("websocket");
            parts.headers.insert(header::UPGRADE, protocol.clone());
            Ok(UpgradeRequest {
                protocol,
                client,
                ticket,
                h2: true,
            })
        }
        (Some(p), _) => Err(ProxyError::MethodNotAllowed(format!(
            "CONNECT for {p:?}: Inlay tunnels WebSockets only (RFC 8441), when websocket.enabled is true"
        ))),
        (None, _) => Err(ProxyError::MethodNotAllowed(
            "CONNECT: Inlay is a reverse proxy, not a forward proxy".into(),
        )),
    }
}

/// A 400 for an upgrade request with a body: the tunnel starts where the
/// head ends, so a body would be read as the new protocol's bytes.
fn refuse_body(h: &http::HeaderMap) -> Result<(), ProxyError> {
    let length = h.get(header::CONTENT_LENGTH).map(|v| v.as_bytes());
    if h.contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|l| l != b"0") {
        return Err(ProxyError::BadRequest(
            "an upgrade request carries no body".into(),
        ));
    }
    Ok(())
}

/// What the backend made of the upgrade.
pub(super) enum Tunnelled {
    /// It switched: the response that opens the tunnel, which runs on.
    Open(Response<ProxyBody>),
    /// It answered something else, which goes on as a passed response.
    NotSwitched(Outcome),
}

/// tunnel: the upgrade sent to the backend; a tunnel opened when it
/// switches protocols.
pub(super) async fn run(
    p: &Pipeline,
    ctx: &mut RequestCtx,
    up: UpgradeRequest,
) -> Result<Tunnelled, ProxyError> {
    ctx.release_policy();
    let limits = &p.config.websocket;
    let Some(slot) = p.tunnels.try_open(limits.max_tunnels) else {
        return Err(ProxyError::TooManyTunnels {
            limit: limits.max_tunnels,
        });
    };
    let routed = ctx.timing.now();
    let backend = p.through.upstreams().for_pass(&ctx.head)?;
    if backend.backend().config().http2 {
        return Err(ProxyError::BackendProtocol {
            backend: backend.name().to_owned(),
            reason: "it is configured with http2 = true: a tunnel needs HTTP/1.1".into(),
        });
    }
    let mut head = ctx.head.clone();
    let h = &mut head.headers;
    h.insert(header::UPGRADE, up.protocol.clone());
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if up.h2 && !h.contains_key(SEC_WEBSOCKET_KEY) {
        // RFC 8441 has no key; the HTTP/1.1 handshake needs one.
        h.insert(SEC_WEBSOCKET_KEY, websocket_key());
    }
    ctx.body = None;
    let mut resp = fetch::pass(&backend, &head, body::empty()).await?;
    ctx.timing.phase("fetch", routed);
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // A 2xx to an HTTP/2 CONNECT opens a tunnel at the client: only a
        // backend that switched may.
        if up.h2 && resp.status().is_success() {
            return Err(not_switched(backend.name(), resp.status()));
        }
        return pass::answered(p, ctx, resp)
            .await
            .map(Tunnelled::NotSwitched);
    }
    let upstream =
        hyper::upgrade::on(&mut resp)
            .await
            .map_err(|e| ProxyError::BackendProtocol {
                backend: backend.name().to_owned(),
                reason: format!("its connection could not be taken over after its 101: {e}"),
            })?;
    let (parts, held) = resp.into_parts();
    let mut resp = switched(parts, &up);
    ctx.record.cache = CacheStatus::Pass;
    let (line, handed) = TunnelLog::new();
    resp.extensions_mut().insert(line);
    let open = Open {
        guard: up.ticket.open(),
        _slot: slot,
        retired: p.retired.clone(),
        tunnels: Arc::clone(&p.tunnels),
        idle: limits.idle_timeout,
        _backend_body: held,
    };
    tokio::spawn(open.carry(up.client, upstream, handed));
    Ok(Tunnelled::Open(resp))
}

fn not_switched(backend: &str, status: StatusCode) -> ProxyError {
    ProxyError::BackendProtocol {
        backend: backend.to_owned(),
        reason: format!("answered a WebSocket upgrade with {status}, not 101 Switching Protocols"),
    }
}

/// A `Sec-WebSocket-Key`: 16 random bytes in base64 (RFC 6455 section 4.1).
fn websocket_key() -> HeaderValue {
    use base64::Engine as _;
    let nonce: [u8; 16] = rand::random();
    let key = base64::engine::general_purpose::STANDARD.encode(nonce);
    HeaderValue::from_str(&key).expect("base64 is a header value")
}

/// The client's response from the backend's 101: its fields as they are
/// (a `Sec-WebSocket-Accept` that does not match is the client's to find,
/// as nginx passes it), the hop-by-hop ones but the switch removed, `Via`
/// added. HTTP/2: a 200 without the HTTP/1.1 handshake's fields.
fn switched(backend: http::response::Parts, up: &UpgradeRequest) -> Response<ProxyBody> {
    let mut h = backend.headers;
    let upgrade = h.get(header::UPGRADE).cloned();
    headers::strip_hop_by_hop(&mut h);
    h.remove(header::CONTENT_LENGTH);
    let mut resp = Response::new(body::empty());
    if up.h2 {
        h.remove(SEC_WEBSOCKET_ACCEPT);
        *resp.status_mut() = StatusCode::OK;
    } else {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, upgrade.unwrap_or(up.protocol.clone()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    }
    headers::add_via(&mut h);
    h.insert(inlay_core::CACHE_STATUS, CacheStatus::Pass.field());
    *resp.headers_mut() = h;
    resp
}

/// What an open tunnel holds until it ends.
struct Open {
    /// The client's connection, counted open.
    guard: TunnelGuard,
    /// Its place among `websocket.max_tunnels`.
    _slot: TunnelSlot,
    /// Cancelled `server.shutdown_timeout` after a reload replaced the
    /// generation that opened it.
    retired: tokio_util::sync::CancellationToken,
    tunnels: Arc<tunnels::Tunnels>,
    idle: std::time::Duration,
    /// The backend response's body: it holds the backend's connection
    /// slot (`max_connections`).
    _backend_body: ProxyBody,
}

impl Open {
    /// Carry the bytes until the tunnel ends, then write its access-log line.
    async fn carry(
        self,
        client: OnUpgrade,
        upstream: hyper::upgrade::Upgraded,
        line: tokio::sync::oneshot::Receiver<super::log::PendingLine>,
    ) {
        let client = match client.await {
            Ok(io) => io,
            Err(e) => {
                // The client went before its 101 was sent.
                debug!(error = %e, "tunnel: the client's connection was not handed over");
                if let Ok(line) = line.await {
                    line.tunnel_done(Default::default(), Some(e.to_string()));
                }
                return;
            }
        };
        let closing = async {
            tokio::select! {
                () = self.guard.closing() => "closed at the end of the drain (server.shutdown_timeout)",
                () = self.retired.cancelled() => "closed server.shutdown_timeout after a reload",
            }
        };
        let (end, moved) = tunnels::carry(
            TokioIo::new(client),
            TokioIo::new(upstream),
            &self.tunnels,
            self.idle,
            closing,
        )
        .await;
        let error = match end {
            TunnelEnd::Ended(None) => None,
            TunnelEnd::Ended(Some(e)) => Some(format!("tunnel failed: {e}")),
            TunnelEnd::Idle(d) => Some(format!(
                "tunnel idle for {}s (websocket.idle_timeout)",
                d.as_secs()
            )),
            TunnelEnd::Stopped(why) => Some(format!("tunnel {why}")),
        };
        // Written before the connection counts as closed: a drain waits for it.
        if let Ok(line) = line.await {
            line.tunnel_done(moved, error);
        }
        drop(self);
    }
}

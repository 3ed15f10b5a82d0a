//! `/ws`: a WebSocket echo (RFC 6455, by tokio-tungstenite). Every text
//! and binary message comes back as it went, pings get their pong, a
//! close is answered with a close. Knobs: `accept=wrong` answers the
//! handshake with a `Sec-WebSocket-Accept` that does not match the key
//! (what a proxy must pass on as it is, as nginx does); `protocol=P`
//! answers with `Sec-WebSocket-Protocol: P`.

use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::body::OriginBody;
use crate::query::{BadRequest, Params};

/// The answer to a WebSocket handshake on `/ws` (101), the echo served
/// on the upgraded connection by a task of its own.
pub(crate) fn accept(req: &Parts, p: &Params<'_>) -> Result<Response<OriginBody>, BadRequest> {
    let asks = req
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = req.headers.get(header::SEC_WEBSOCKET_KEY);
    let (true, Some(key), Some(on_upgrade)) = (asks, key, req.extensions.get::<OnUpgrade>()) else {
        return Err(BadRequest(
            "/ws is a WebSocket echo: send a GET with Upgrade: websocket, Connection: upgrade and Sec-WebSocket-Key".into(),
        ));
    };
    let accept = match p.get("accept") {
        Some("wrong") => "d3Jvbmcgd3Jvbmcgd3Jvbmc=".to_owned(),
        _ => derive_accept_key(key.as_bytes()),
    };
    let mut resp = Response::new(OriginBody::full(""));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    let value = |v: &str| HeaderValue::from_str(v).map_err(|_| BadRequest(format!("{v:?}")));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, value(&accept)?);
    if let Some(protocol) = p.get("protocol") {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, value(protocol)?);
    }
    let on_upgrade = on_upgrade.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        echo(ws).await;
    });
    Ok(resp)
}

/// Send every message back until the client closes (the library answers
/// pings, and a close with a close, sent by the read that follows it).
async fn echo<S>(mut ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(Ok(msg)) = ws.next().await {
        if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
            return;
        }
    }
}

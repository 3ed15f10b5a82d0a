//! A small HTTP client for the tests: whole responses, raw bytes, and what
//! the test origin's `/echo` received.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub version: http::Version,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn get(url: &str) -> Reply {
    request("GET", url, &[], Bytes::new()).await
}

/// A GET with `Host: www.example.com`, so that cache keys match across
/// restarts on other ports.
pub async fn get_site(url: &str) -> Reply {
    request("GET", url, &[("host", "www.example.com")], Bytes::new()).await
}

pub async fn request(method: &str, url: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {url} timed out"))
        .unwrap_or_else(|e| panic!("{method} {url} failed: {e}"));
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
        version: parts.version,
    }
}

/// The header fields the test origin's `/echo` says it received (lower-case names).
pub fn echo_headers(r: &Reply) -> Vec<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_lowercase(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// One header `/echo` received, if any.
pub fn echoed(r: &Reply, name: &str) -> Option<String> {
    echo_headers(r)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// Percent-encode everything but unreserved characters, for a query value.
pub fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A test-origin `/resp` URL whose body is `markup`: an uncacheable page,
/// opted in to ESI unless `opt_in` is false.
pub fn esi_page(markup: &str, opt_in: bool) -> String {
    let mut q = format!("/resp?ct=text/html&cc=no-store&body={}", urlencode(markup));
    if opt_in {
        q.push_str("&sc=content%3D%22ESI/1.0%22");
    }
    q
}

/// Send raw bytes on a fresh connection and read until the server closes or
/// `timeout`; what was read, and whether the server closed.
pub async fn raw(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> (String, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(_)) | Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// Sends `head` on the keep-alive connection `s` and reads its whole
/// answer (up to `body`, then the last chunk when it is chunked). Panics when the connection
/// closes first or the answer takes over 10 s.
pub async fn ask(s: &mut TcpStream, head: &str, body: &[u8]) -> String {
    s.write_all(head.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let whole = |seen: &[u8]| {
        let text = String::from_utf8_lossy(seen).to_ascii_lowercase();
        seen.windows(body.len()).any(|w| w == body)
            && (!text.contains("transfer-encoding: chunked") || text.ends_with("0\r\n\r\n"))
    };
    while !whole(&seen) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// `GET /resp` with `Connection: close` on a new connection from `source`
/// (another loopback address is another client to Inlay's per-address
/// limits): the whole answer, as text. Panics when it takes over
/// `timeout`, with `what` in the message.
pub async fn get_resp_from(
    source: &str,
    addr: SocketAddr,
    timeout: Duration,
    what: &str,
) -> String {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(b"GET /resp HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(timeout, s.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("no answer within {timeout:?}: {what}"))
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A WebSocket over HTTP/2 extended CONNECT (RFC 8441) to `uri` on `io`
/// (TCP with prior knowledge, or TLS whose ALPN chose h2); the response
/// must be a 200 without the HTTP/1.1 handshake's `Sec-WebSocket-Accept`.
pub async fn h2_websocket<I>(
    io: I,
    uri: &str,
) -> tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(uri)
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "{resp:?}");
    assert!(!resp.headers().contains_key("sec-websocket-accept"));
    let upgraded = hyper::upgrade::on(&mut resp).await.unwrap();
    tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(upgraded),
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await
}

//! Spawns the `inlay-origin` binary and talks to it with a hyper client.

use std::io::{BufRead, BufReader};
use std::pin::Pin;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The request body type of the test clients.
pub type ReqBody = BoxBody<Bytes, std::io::Error>;

/// A running origin process, killed on drop.
pub struct Origin {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub child: Child,
    /// The rest of the origin's stdout, after the listening line.
    pub stdout: BufReader<ChildStdout>,
    http1: Client<HttpConnector, ReqBody>,
    h2c: Client<HttpConnector, ReqBody>,
}

/// A fully read response.
pub struct Reply {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// A header as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Every value of a header.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

impl Origin {
    /// Spawns the binary on a free port and waits for its `listening on` line.
    pub fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inlay-origin"))
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn inlay-origin");
        let stdout = child.stdout.take().expect("stdout");
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the listening line");
        let base = line
            .strip_prefix("listening on ")
            .expect("listening line")
            .trim_end()
            .to_string();
        Self {
            base,
            child,
            stdout,
            http1: Client::builder(TokioExecutor::new()).build_http(),
            h2c: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
        }
    }

    /// The full URL of `path_and_query`.
    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    /// A GET request builder for `path_and_query`.
    pub fn get_req(&self, path_and_query: &str) -> http::request::Builder {
        Request::get(self.url(path_and_query))
    }

    /// Sends over HTTP/1.1 and returns the response with its body unread.
    pub async fn send_raw(&self, req: Request<ReqBody>) -> http::Response<Incoming> {
        self.http1.request(req).await.expect("request")
    }

    /// Sends over HTTP/1.1 and reads the whole response.
    pub async fn send(&self, req: Request<ReqBody>) -> Reply {
        read(self.send_raw(req).await).await
    }

    /// Sends over h2c (HTTP/2 prior knowledge) and reads the whole response.
    pub async fn send_h2(&self, req: Request<ReqBody>) -> Reply {
        read(self.h2c.request(req).await.expect("h2c request")).await
    }

    /// GET over HTTP/1.1.
    pub async fn get(&self, path_and_query: &str) -> Reply {
        self.send(self.get_req(path_and_query).body(empty()).expect("request"))
            .await
    }

    /// The origin's count for `path`.
    pub async fn count(&self, path: &str) -> u64 {
        self.get(&format!("/__count?path={path}"))
            .await
            .text()
            .parse()
            .expect("a count")
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a response body to its end.
pub async fn read(resp: http::Response<Incoming>) -> Reply {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Reply {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body,
    }
}

/// An empty request body.
pub fn empty() -> ReqBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A request body known in full.
pub fn full(data: impl Into<Bytes>) -> ReqBody {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The origin's body pattern: `abc..zabc..` from offset 0.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A request body of `left` bytes sent as repeats of `frame`, with no
/// length announced (chunked), so nothing on either side holds it whole.
pub struct Generated {
    pub left: u64,
    pub frame: Bytes,
}

impl Generated {
    /// The CRC-32 of the whole body, computed the same way it is sent.
    pub fn crc32(&self) -> u32 {
        let mut crc = crc32fast::Hasher::new();
        let mut left = self.left;
        while left > 0 {
            let len = (left as usize).min(self.frame.len());
            crc.update(&self.frame[..len]);
            left -= len as u64;
        }
        crc.finalize()
    }
}

impl Body for Generated {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let len = (self.left as usize).min(self.frame.len());
        let data = self.frame.slice(..len);
        self.left -= len as u64;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

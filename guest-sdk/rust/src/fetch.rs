//! Subrequests to configured backends, through the host's native fetcher
//! (pooled connections, timeouts, the per-request subrequest cap).
//!
//! ```
//! use inlay_policy::fetch::{self, FetchRequest, FetchResponse};
//! use inlay_policy::testing;
//!
//! // In a unit test, answer subrequests with a closure.
//! testing::on_fetch(|req| Ok(FetchResponse::new(200, format!("hi from {}", req.url))));
//!
//! let resp = fetch::send(&FetchRequest::get("/api/user").backend("api")).unwrap();
//! assert_eq!(resp.body, b"hi from /api/user");
//!
//! let all = fetch::send_many(&[FetchRequest::get("/a"), FetchRequest::get("/b")]);
//! assert_eq!(all.len(), 2);
//! assert_eq!(testing::fetched().len(), 3);
//! ```

use crate::Headers;

/// A subrequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// Backend name from the config; `None` means the request's backend.
    pub backend: Option<String>,
    /// Method (`GET` if empty).
    pub method: String,
    /// Path and query, starting with `/`.
    pub url: String,
    /// Header fields to send.
    pub headers: Headers,
    /// Request body.
    pub body: Vec<u8>,
}

impl FetchRequest {
    /// A request with this method and URL, no headers and an empty body.
    pub fn new(method: &str, url: &str) -> Self {
        FetchRequest {
            backend: None,
            method: method.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A `GET` request.
    pub fn get(url: &str) -> Self {
        FetchRequest::new("GET", url)
    }

    /// Send it to this configured backend.
    pub fn backend(mut self, name: &str) -> Self {
        self.backend = Some(name.to_owned());
        self
    }

    /// Add a header field (the name is lower-cased).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }

    /// Replace the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}

/// A subrequest's response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResponse {
    /// Status code.
    pub status: u16,
    /// Header fields.
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
}

impl FetchResponse {
    /// A response with this status and body and no headers (for tests).
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        FetchResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// The first value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::http::first(&self.headers, name)
    }

    /// The body as text, if it is UTF-8.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }
}

/// Why a subrequest failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No backend of that name is configured.
    #[error("unknown backend: {0}")]
    UnknownBackend(String),
    /// The request was malformed.
    #[error("invalid subrequest: {0}")]
    InvalidRequest(String),
    /// Connecting to the backend failed.
    #[error("connect failed: {0}")]
    ConnectFailed(String),
    /// The backend did not answer in time.
    #[error("subrequest timed out")]
    Timeout,
    /// The body was larger than the host allows a policy to buffer.
    #[error("subrequest body too large")]
    BodyTooLarge,
    /// The per-request cap on subrequests was reached.
    #[error("per-request subrequest limit reached")]
    LimitExceeded,
}

/// Send one subrequest and wait for the whole response.
pub fn send(req: &FetchRequest) -> Result<FetchResponse, FetchError> {
    crate::sys::fetch_send(req)
}

/// Send several subrequests at once, in parallel; results come back in the
/// same order.
pub fn send_many(reqs: &[FetchRequest]) -> Vec<Result<FetchResponse, FetchError>> {
    crate::sys::fetch_send_many(reqs)
}

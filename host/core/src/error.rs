//! Every failure of a request, and the one place where it becomes an HTTP status.

use std::time::Duration;

use http::{Response, StatusCode, header};

use crate::body::{self, ProxyBody};

/// Whose fault a failure is: decides the status family and the log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The client sent something we cannot serve (4xx).
    Client,
    /// The origin failed (502/503/504), or a bound on what Inlay holds
    /// open for it was reached (`websocket.max_tunnels`).
    Origin,
    /// The policy failed (500/503).
    Policy,
    /// Inlay itself failed (500).
    Inlay,
}

/// A request that could not be served normally.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request is malformed (bad URI, bad Host).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The method is not allowed here (for example PURGE from outside `purge_allow`).
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// The backend refused the connection or could not be reached.
    #[error("backend {backend} unreachable: {reason}")]
    BackendDown {
        /// Backend name.
        backend: String,
        /// What the connector said.
        reason: String,
    },
    /// The backend has `max_connections` requests in flight already.
    #[error("backend {backend} is at max_connections")]
    BackendBusy {
        /// Backend name.
        backend: String,
    },
    /// `websocket.max_tunnels` tunnels are open already.
    #[error("{limit} tunnels are open already (websocket.max_tunnels)")]
    TooManyTunnels {
        /// The configured limit.
        limit: usize,
    },
    /// The backend did not send a response head within `first_byte_timeout`.
    #[error("backend {backend} sent no response within {timeout:?} (first_byte_timeout)")]
    BackendTimeout {
        /// Backend name.
        backend: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The backend answered with something that is not valid HTTP, or closed early.
    #[error("backend {backend} failed: {reason}")]
    BackendProtocol {
        /// Backend name.
        backend: String,
        /// What went wrong.
        reason: String,
    },
    /// The policy trapped, ran out of time or memory, or broke a limit.
    #[error("policy failed: {message}")]
    Policy {
        /// The status the client gets.
        status: StatusCode,
        /// What happened, for the log.
        message: String,
    },
    /// The request body is larger than `server.max_request_body`.
    #[error("request body over the {limit}-byte limit")]
    RequestTooLarge {
        /// The configured limit in bytes.
        limit: u64,
    },
    /// An ESI page failed before any of it was sent: an include failed with
    /// nothing to fall back on and `esi.on_include_error = "fail"`.
    #[error("ESI page failed: {0}")]
    Esi(String),
    /// A bug or resource failure inside Inlay.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProxyError {
    /// The status the client sees. The only place this mapping is made.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::RequestTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BackendDown { .. } | Self::BackendBusy { .. } | Self::TooManyTunnels { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::BackendTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BackendProtocol { .. } | Self::Esi(_) => StatusCode::BAD_GATEWAY,
            Self::Policy { status, .. } => *status,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Whose fault it is.
    pub fn blame(&self) -> Blame {
        match self {
            Self::BadRequest(_) | Self::MethodNotAllowed(_) | Self::RequestTooLarge { .. } => {
                Blame::Client
            }
            Self::BackendDown { .. }
            | Self::BackendBusy { .. }
            | Self::TooManyTunnels { .. }
            | Self::BackendTimeout { .. }
            | Self::BackendProtocol { .. }
            | Self::Esi(_) => Blame::Origin,
            Self::Policy { .. } => Blame::Policy,
            Self::Internal(_) => Blame::Inlay,
        }
    }

    /// The response the client gets: a short plain-text body, like Varnish's
    /// "Guru Meditation" but without internals.
    pub fn to_response(&self) -> Response<ProxyBody> {
        let status = self.status();
        let reason = status.canonical_reason().unwrap_or("Error");
        let mut resp = Response::new(body::full(format!("{} {reason}\n", status.as_u16())));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_whose_fault_it_is() {
        let down = ProxyError::BackendDown {
            backend: "a".into(),
            reason: "refused".into(),
        };
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(down.blame(), Blame::Origin);
        let slow = ProxyError::BackendTimeout {
            backend: "a".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(slow.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            ProxyError::BadRequest("x".into()).to_response().status(),
            400
        );
        let esi = ProxyError::Esi("include /x failed: status 500".into());
        assert_eq!(esi.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(esi.blame(), Blame::Origin);
    }
}

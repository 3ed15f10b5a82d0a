//! The error type of request and response edits.

/// Why the host (or the local test double) refused an edit of a request or
/// response. The text is the host's explanation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The header name or value is not valid HTTP (for example a newline).
    #[error("invalid header: {0}")]
    InvalidHeader(String),
    /// The URL is not a path and query starting with `/`.
    #[error("invalid url: {0}")]
    InvalidUrl(String),
    /// No backend of that name is configured.
    #[error("unknown backend: {0}")]
    UnknownBackend(String),
    /// The status code is outside 100-999.
    #[error("invalid status: {0}")]
    InvalidStatus(String),
}

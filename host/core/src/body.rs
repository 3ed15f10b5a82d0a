//! The one body type every layer streams: boxed, unsynchronised, with a
//! boxed error, and the constructors for it.

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Empty, Full};

/// Errors carried inside bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every request and response inside Inlay: streaming, boxed.
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A body of the given bytes.
pub fn full(data: impl Into<Bytes>) -> ProxyBody {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Box any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

//! The request's way through the host, one phase per file, in the order
//! they run (see DESIGN.md):
//!
//! 1. [`recv`]: normalise the request; the policy may rewrite it, answer it,
//!    pick a backend, or choose pass / lookup.
//! 2. [`fetch`]: the backend request, with Via / X-Forwarded-For.
//! 3. [`deliver`]: the response headers for the client.
//! 4. [`log`]: always runs: one access-log line when the body is done.

pub mod deliver;
pub mod fetch;
pub mod log;
pub mod recv;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use tracing::{Instrument, debug_span};

use crate::access_log::{AccessLog, AccessRecord};
use crate::backend::Backends;
use crate::body::{self, ProxyBody};
use crate::config::Config;
use crate::error::ProxyError;

/// The client request as the phases see it: the head only; the body travels separately.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Method.
    pub method: Method,
    /// Path and query only.
    pub uri: Uri,
    /// Header fields, hop-by-hop ones removed.
    pub headers: HeaderMap,
    /// The client's address.
    pub client_ip: std::net::IpAddr,
    /// The backend the request goes to.
    pub backend: String,
    /// Data the policy added to the cache key.
    pub cache_key_extra: Vec<String>,
}

/// What recv decided.
#[derive(Debug)]
pub enum Route {
    /// Go to the backend; do not use the cache.
    Pass,
    /// Answer at once.
    Synthetic(Response<ProxyBody>),
}

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct Pipeline {
    config: Arc<Config>,
    backends: Backends,
    access_log: AccessLog,
}

impl Pipeline {
    /// Build the pipeline from a validated config.
    pub fn new(config: Arc<Config>, access_log: AccessLog) -> Self {
        let backends = Backends::new(&config);
        Self {
            config,
            backends,
            access_log,
        }
    }

    /// The configured backends.
    pub fn backends(&self) -> &Backends {
        &self.backends
    }

    /// Serve one request. Never fails: errors become responses here.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
        let started = Instant::now();
        let (parts, body) = req.into_parts();
        let mut record = log::start(&parts, peer);
        let span = debug_span!("request", method = %parts.method, uri = %parts.uri, client = %peer);
        let result = self
            .process(parts, body::boxed(body), peer, &mut record)
            .instrument(span)
            .await;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                log::failure(&e, &record);
                record.error = Some(e.to_string());
                if record.cache.is_empty() {
                    record.cache = "error";
                }
                e.to_response()
            }
        };
        log::finish(resp, record, started, self.access_log.clone())
    }

    async fn process(
        &self,
        parts: http::request::Parts,
        body: ProxyBody,
        peer: SocketAddr,
        record: &mut AccessRecord,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let head = recv::normalise(parts, peer, self.backends.default_name())?;
        record.backend = Some(head.backend.clone());
        match recv::route(&head) {
            Route::Synthetic(resp) => {
                record.cache = "synth";
                Ok(resp)
            }
            Route::Pass => {
                record.cache = "pass";
                let backend = self.backends.get(&head.backend).ok_or_else(|| {
                    ProxyError::Internal(format!("backend {} vanished", head.backend))
                })?;
                let resp = fetch::send(backend, &head, body).await?;
                Ok(deliver::finish(resp, &head, StatusCode::OK))
            }
        }
    }

    /// The validated config this pipeline runs.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

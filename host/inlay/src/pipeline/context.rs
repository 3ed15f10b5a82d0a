//! The request's context: one value made when the request arrives and
//! handed to every phase in turn (as Pingora's per-request `CTX`), and the
//! outcome the cache or the backend gives the phases after them.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http::{HeaderValue, Response};
use inlay_core::body::ProxyBody;
use inlay_core::{CacheStatus, RequestHead};
use inlay_runtime::PolicyCall;
use inlay_storage::StoredObject;

use crate::access_log::AccessRecord;
use inlay_core::server_timing::{self, IncludeTimings};

/// Everything one request carries from phase to phase.
pub struct RequestCtx {
    /// When the request head arrived; read only for what times the whole
    /// request (an access-log line, `Server-Timing`, which a policy may
    /// turn on): others do not read the clock for it.
    pub(super) started: Option<Instant>,
    /// The client's address (the PROXY header's, when there is one).
    pub(super) peer: SocketAddr,
    /// HTTP/1.x: after a malformed request the connection is closed.
    pub(super) http1: bool,
    /// The request as recv left it (until recv has run, an empty `GET /`).
    pub(super) head: RequestHead,
    /// The client's body: a passed request sends it on, a lookup drops it.
    pub(super) body: Option<ProxyBody>,
    /// Set when the client's body failed (past `server.max_request_body`,
    /// malformed, cut), so that the failed fetch it causes is the client's
    /// 413 or 400, not a 502. None for a request without a body.
    pub(super) body_fault: Option<Arc<OnceLock<BodyFault>>>,
    /// `server.max_request_body` when the request came.
    pub(super) body_limit: u64,
    /// This request's policy instance, when the generation runs a policy.
    pub(super) policy: Option<PolicyCall>,
    /// The tunnel the request asks for (a WebSocket), found by recv.
    pub(super) upgrade: Option<super::tunnel::UpgradeRequest>,
    /// A peer's fetch for its cache (`[cluster] shard`): it gets the edge
    /// fields and ESI templates unassembled.
    pub(super) for_peer: bool,
    /// The request's id (`server.request_id_header`), when ids are on.
    pub(super) request_id: Option<HeaderValue>,
    /// The access-log line, filled as the request goes.
    pub(super) record: AccessRecord,
    /// `Server-Timing`, when it is on.
    pub(super) timing: RequestTiming,
}

/// How the client's body failed, recorded as it is read (by the backend
/// fetch, which then fails too) so that the request's failure is the
/// client's, not the backend's 502.
#[derive(Debug)]
pub(super) enum BodyFault {
    /// More than `server.max_request_body` bytes (413).
    TooLarge,
    /// Malformed framing (a chunk line ended by a bare LF, say) or a client
    /// that went away mid-body (400).
    Broken(String),
}

impl RequestCtx {
    /// The context of a request that just arrived from `peer`: with
    /// `Server-Timing` when `server_timing` (a `policy` may turn it on for
    /// the request too); `logged`: an access-log line will be written for
    /// it.
    pub(super) fn new(
        parts: &http::request::Parts,
        peer: SocketAddr,
        server_timing: bool,
        policy: bool,
        logged: bool,
    ) -> Self {
        // Server-Timing is on only by the config or a policy.
        let timed = server_timing || policy;
        Self {
            started: (logged || timed).then(Instant::now),
            peer,
            http1: parts.version < http::Version::HTTP_2,
            head: RequestHead::default(),
            body: None,
            body_fault: None,
            body_limit: u64::MAX,
            policy: None,
            upgrade: None,
            for_peer: false,
            request_id: None,
            record: super::log::start(parts, peer, logged),
            timing: RequestTiming {
                on: server_timing,
                trailers: timed && server_timing::trailers_allowed(parts.version, &parts.headers),
                ..RequestTiming::default()
            },
        }
    }

    /// Gives the request's policy instance back to the pool before the
    /// request waits on I/O (the backend, another request's fill), so that
    /// slow requests do not keep policy requests, hits included, from
    /// getting one; the next hook catches a new instance up
    /// (`PolicyCall::release`).
    pub(super) fn release_policy(&mut self) {
        if let Some(call) = &mut self.policy {
            call.release();
        }
    }
}

/// A response on its way to deliver, with what deliver must know about it.
pub struct Outcome {
    pub(super) resp: Response<ProxyBody>,
    /// How it was served.
    pub(super) status: CacheStatus,
    /// The complete cached object the response was made from (for
    /// conditional and Range answers, and the template of an ESI page).
    pub(super) object: Option<StoredObject>,
    /// A cached response whose body is still coming (joined while another
    /// request stores it): conditional and Range answers cut the stream.
    pub(super) joined: bool,
    /// The body is an ESI template to assemble.
    pub(super) esi: bool,
    /// The backend's time to the response head, when this request fetched.
    pub(super) fetched: Option<Duration>,
}

impl Outcome {
    pub(super) fn new(resp: Response<ProxyBody>, status: CacheStatus) -> Self {
        Self {
            resp,
            status,
            object: None,
            joined: false,
            esi: false,
            fetched: None,
        }
    }

    pub(super) fn with_esi(mut self, esi: bool) -> Self {
        self.esi = esi;
        self
    }

    pub(super) fn with_fetch_time(mut self, took: Duration) -> Self {
        self.fetched = Some(took);
        self
    }
}

/// `Server-Timing` for one request: whether it is on (config, or the
/// policy's request flag), the head's entries, and an ESI page's include
/// entries for the trailer.
#[derive(Debug, Default)]
pub(super) struct RequestTiming {
    pub(super) on: bool,
    /// The client can take a trailer (HTTP/2, or HTTP/1.1 with `TE: trailers`).
    pub(super) trailers: bool,
    pub(super) head: server_timing::Timing,
    pub(super) includes: Option<Arc<IncludeTimings>>,
}

impl RequestTiming {
    /// `Some(now)` when timing is on, so that requests without it do not
    /// read the clock.
    pub(super) fn now(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    /// Record phase `name` as having run since `since`, when timing is on.
    pub(super) fn phase(&mut self, name: &str, since: Option<Instant>) {
        if let Some(since) = since.filter(|_| self.on) {
            self.head.phase(name, since.elapsed());
        }
    }
}

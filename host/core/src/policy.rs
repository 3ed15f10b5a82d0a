//! What a policy decides: the route of a request, how a response is cached,
//! and what ESI does with it. The defaults come from the host (the cache's
//! rules); a policy's hooks return these.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

/// What to do with a request after `on-request`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestAction {
    /// Use the cache (look up, fetch on a miss).
    Lookup,
    /// Go to the backend; neither use nor fill the cache.
    Pass,
    /// Answer at once with this response.
    Synthetic(SyntheticResponse),
}

/// A complete response made by the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntheticResponse {
    /// Status code.
    pub status: StatusCode,
    /// Header fields.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// How a backend response is stored; the host's defaults go in, the
/// policy's choice comes out of `on-backend-response`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct CacheSettings {
    /// Store the response at all.
    pub cacheable: bool,
    /// Time fresh.
    pub ttl: Duration,
    /// Time after expiry it may be served stale while refreshing.
    pub grace: Duration,
    /// Time after ttl+grace it is kept for revalidation and stale-if-error.
    pub keep: Duration,
    /// Surrogate keys for purging by key.
    pub surrogate_keys: Vec<String>,
    /// Process the body as ESI.
    pub esi: bool,
}

/// What the policy asked of ESI through the `esi` interface.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct EsiOverrides {
    /// `Some` when the policy switched ESI on or off for this response.
    pub enabled: Option<bool>,
    /// Variables set by the policy, in the order first set (a second
    /// `set-var` of the same name replaces the value).
    pub vars: Vec<(String, String)>,
}

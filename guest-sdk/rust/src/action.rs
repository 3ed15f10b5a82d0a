//! What the hooks return: [`Action`] after `on_request`, [`CacheSettings`]
//! after `on_backend_response`.

use crate::Headers;

/// What to do with a request after [`Policy::on_request`](crate::Policy::on_request)
/// (Varnish's `return (hash)`, `return (pass)` and `synth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Look the request up in the cache; fetch and maybe store on a miss.
    Lookup,
    /// Go to the backend; do not use or fill the cache.
    Pass,
    /// Answer at once with this response; the backend is not contacted.
    Synthetic(SyntheticResponse),
}

impl Action {
    /// Start a synthetic response with `status`; finish it with
    /// [`header`](SyntheticResponse::header) and [`body`](SyntheticResponse::body)
    /// and turn it into an action with `.into()`.
    ///
    /// ```
    /// use inlay_policy::Action;
    ///
    /// let action: Action = Action::synthetic(403)
    ///     .header("content-type", "text/plain")
    ///     .body("forbidden\n")
    ///     .into();
    /// assert!(matches!(action, Action::Synthetic(ref r) if r.status == 403));
    /// ```
    pub fn synthetic(status: u16) -> SyntheticResponse {
        SyntheticResponse {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A redirect answered at the edge: `status` (301, 302, 303, 307 or
    /// 308) with a `Location` header and an empty body.
    ///
    /// ```
    /// use inlay_policy::Action;
    ///
    /// let Action::Synthetic(resp) = Action::redirect(301, "/new") else { unreachable!() };
    /// assert_eq!(resp.header_value("location"), Some("/new"));
    /// ```
    pub fn redirect(status: u16, location: &str) -> Action {
        Action::synthetic(status)
            .header("location", location)
            .into()
    }
}

/// A complete response made by the policy (Varnish's `synth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticResponse {
    /// Status code.
    pub status: u16,
    /// Header fields, in order; names should be lower-case.
    pub headers: Headers,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl SyntheticResponse {
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

    /// The first value of a header (case-insensitive name).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        crate::http::first(&self.headers, name)
    }
}

impl From<SyntheticResponse> for Action {
    fn from(response: SyntheticResponse) -> Self {
        Action::Synthetic(response)
    }
}

/// How the host will store a backend response. The host fills it from the
/// response headers (RFC 9111, `Surrogate-Control`) before
/// [`Policy::on_backend_response`](crate::Policy::on_backend_response);
/// the policy may change any field. Durations are whole seconds.
///
/// ```
/// use inlay_policy::CacheSettings;
///
/// let settings = CacheSettings { cacheable: true, ttl: 60, ..Default::default() }
///     .with_surrogate_key("product-42");
/// assert_eq!(settings.surrogate_keys, ["product-42"]);
/// assert!(!settings.uncacheable().cacheable);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheSettings {
    /// Store the response at all.
    pub cacheable: bool,
    /// Seconds the object is fresh.
    pub ttl: u32,
    /// Seconds after expiry it may be served stale while one background
    /// fetch refreshes it (stale-while-revalidate).
    pub grace: u32,
    /// Seconds after ttl+grace it is kept for revalidation and
    /// stale-if-error.
    pub keep: u32,
    /// Surrogate keys for purging by key.
    pub surrogate_keys: Vec<String>,
    /// Process the body as ESI.
    pub esi: bool,
}

impl CacheSettings {
    /// Do not store this response (Varnish's `beresp.uncacheable = true`).
    pub fn uncacheable(mut self) -> Self {
        self.cacheable = false;
        self
    }

    /// Store it, fresh for `ttl` seconds.
    pub fn with_ttl(mut self, ttl: u32) -> Self {
        self.cacheable = true;
        self.ttl = ttl;
        self
    }

    /// Add a surrogate key for purging.
    pub fn with_surrogate_key(mut self, key: &str) -> Self {
        self.surrogate_keys.push(key.to_owned());
        self
    }
}

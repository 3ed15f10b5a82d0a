//! ESI: when a response opted in (`Surrogate-Control: content="ESI/1.0"`, or
//! a policy turned it on), its body is assembled by [`inlay_esi::assemble()`]:
//! every include is fetched at once, through the cache, and the page streams
//! in document order.
//!
//! Includes go only to configured backends: a relative `src` goes to the
//! page's backend with the page's Host; an absolute `http://host[:port]/...`
//! must name a backend's address or `host_header`; anything else is refused
//! and logged. Include requests are GET without a body and carry only the
//! client headers listed in `esi.forward_headers` (no Cookie or
//! Authorization by default). Includes do not run the policy.
//!
//! A template in gzip, br or zstd is decoded as it streams; the page goes
//! out uncoded from here, and deliver compresses it as it streams.
//!
//! A failed include that nothing in the page handles is left out
//! (`esi.on_include_error = "omit"`, the default), counted for the page's
//! access-log line (`esi_omitted`). With `"fail"` the page ends there: a
//! 502 when nothing was sent yet (the response head then waits for the
//! page's first bytes), a cut body otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use http::{HeaderMap, HeaderValue, Method, Response, Uri, header};
use http_body_util::{BodyExt, StreamBody};
use inlay_cache::ESI_MARK;
use inlay_cache::coding::{self, Coding};
use inlay_core::body::{self, BoxError, ProxyBody};
use inlay_core::{ProxyError, RequestHead};
use inlay_esi::{
    EsiError, EsiLimits, EsiVars, FailureReason, Fetch, Fragment, FragmentError, FragmentFetcher,
    OnIncludeError,
};
use tracing::{debug, warn};

use super::lookup::ThroughCache;
use super::{Outcome, Pipeline, RequestCtx};
use crate::config::EsiConfig;
use inlay_core::server_timing::IncludeTimings;

/// esi: a response that opted in (or that the policy turned ESI on for) is
/// assembled; a peer's fetch gets the template as it is (the peer caches it
/// and assembles it itself), and a HEAD no length (unknown without
/// assembling).
pub(super) async fn run(
    p: &Pipeline,
    ctx: &mut RequestCtx,
    mut out: Outcome,
) -> Result<Outcome, ProxyError> {
    let mut vars = Vec::new();
    if let Some(call) = &ctx.policy {
        let o = call.esi_overrides();
        if let Some(enabled) = o.enabled {
            out.esi = enabled;
        }
        vars.clone_from(&o.vars);
    }
    if !out.esi || ctx.for_peer {
        return Ok(out);
    }
    if ctx.head.method == Method::HEAD {
        out.resp.headers_mut().remove(header::CONTENT_LENGTH);
        return Ok(out);
    }
    let object = out.object.take();
    let omitted = Arc::new(AtomicU32::new(0));
    ctx.record.esi_omitted = Some(Arc::clone(&omitted));
    if ctx.timing.on && ctx.timing.trailers {
        ctx.timing.includes = Some(Arc::default());
    }
    let includes = ctx.timing.includes.clone();
    let resp = std::mem::replace(&mut out.resp, Response::new(body::empty()));
    let template = object.as_ref().map(inlay_cache::coding::identity_body);
    out.resp = process(
        p,
        &ctx.head,
        resp,
        template.as_ref(),
        &vars,
        omitted,
        includes,
    )
    .await?;
    out.joined = false;
    Ok(out)
}

/// The limits of the config, in the assembler's terms.
pub fn limits(cfg: &EsiConfig) -> EsiLimits {
    EsiLimits {
        max_depth: cfg.max_depth,
        max_includes: cfg.max_includes,
        max_concurrency: cfg.max_concurrency,
        include_timeout: cfg.include_timeout,
        page_deadline: cfg.page_deadline,
        on_include_error: cfg.on_include_error,
        max_buffered_bytes: cfg.max_buffered_bytes,
    }
}

/// Whether a body of this type may be parsed: text only (HTML, XML, plain
/// text, JSON); a missing Content-Type is taken as text.
fn is_text(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return true;
    };
    let ct = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    ct.starts_with("text/") || ct.ends_with("+xml") || ct.ends_with("/xml") || ct.ends_with("/json")
}

/// The body as a stream of decoded bytes (gzip, br and zstd are decoded in
/// bounded pieces), or `None` when it cannot be decoded (another coding).
fn decoded(
    headers: &HeaderMap,
    body: ProxyBody,
) -> Option<BoxStream<'static, Result<Bytes, BoxError>>> {
    let stream = body.into_data_stream().boxed();
    match Coding::of_response(headers).ok()? {
        None => Some(stream),
        Some(c) => Some(coding::decode_stream(stream, c)),
    }
}

/// Assemble `resp` as an ESI page for the client request `head`: the page
/// goes out uncoded, and deliver compresses it as it streams for the
/// clients that take a coding. A body that is not text, or in a coding
/// Inlay cannot read, is passed through untouched.
/// `template` is the whole body when it came from the cache: it is then
/// parsed once for every request that assembles it. `omitted` counts the
/// includes left out of this page; `timings`, when given, gets each
/// include's time and outcome (for `Server-Timing`). An error only with
/// `esi.on_include_error = "fail"`, when the page fails before its first byte.
async fn process(
    pipeline: &Pipeline,
    head: &RequestHead,
    resp: Response<ProxyBody>,
    template: Option<&Bytes>,
    custom_vars: &[(String, String)],
    omitted: Arc<AtomicU32>,
    timings: Option<Arc<IncludeTimings>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if !decodable(resp.headers()) {
        debug!("ESI requested for a non-text or undecodable body; passed through");
        return Ok(resp);
    }
    pipeline.metrics.esi_page();
    let (mut parts, body) = resp.into_parts();
    let coded = !matches!(Coding::of_response(&parts.headers), Ok(None));
    // A coded template is decoded as it streams; a plain one is parsed once.
    let input = match template.filter(|_| !coded) {
        Some(t) => PageInput::Parsed(pipeline.templates.nodes(t)),
        None => match decoded(&parts.headers, body) {
            Some(input) => PageInput::Stream(input),
            // `decodable` was checked above.
            None => return Ok(Response::from_parts(parts, body::empty())),
        },
    };
    let mut vars = EsiVars::from_request(head.host(), head.path_and_query(), &head.headers);
    for (k, v) in custom_vars {
        vars.set(k.clone(), v.clone());
    }
    let fetcher = Arc::new(IncludeFetcher {
        through: pipeline.through.clone(),
        page: include_head(head, &pipeline.config().esi, pipeline.request_ids.header()),
        omitted,
        timings,
    });
    let (vars, limits) = (Arc::new(vars), limits(&pipeline.config().esi));
    let fail = limits.on_include_error == OnIncludeError::Fail;
    let mut assembled = match input {
        PageInput::Stream(body) => inlay_esi::assemble(body, vars, fetcher, limits),
        PageInput::Parsed(nodes) => inlay_esi::assemble_parsed(nodes, vars, fetcher, limits),
    };
    if fail {
        // Before the head is sent, a failure can still be an error status.
        assembled = match assembled.next().await {
            Some(Err(e)) => {
                if matches!(e, EsiError::Include { .. }) {
                    pipeline.metrics.esi_include_failed();
                }
                return Err(ProxyError::Esi(e.to_string()));
            }
            Some(Ok(first)) => futures_util::stream::once(async { Ok(first) })
                .chain(assembled)
                .boxed(),
            None => futures_util::stream::empty().boxed(),
        };
    }
    let metrics = Arc::clone(&pipeline.metrics);
    let assembled = assembled
        .map(move |r| {
            r.map_err(|e| {
                // Not the page's own errors (its body, its deadline).
                if matches!(e, EsiError::Include { .. }) {
                    metrics.esi_include_failed();
                }
                Box::new(e) as BoxError
            })
        })
        .boxed();
    let h = &mut parts.headers;
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::ACCEPT_RANGES);
    // The assembled page is not the stored template: its validators do not apply.
    h.remove(header::ETAG);
    h.remove(header::LAST_MODIFIED);
    h.remove(header::CONTENT_ENCODING);
    let body = StreamBody::new(assembled.map(|r| r.map(http_body::Frame::data)));
    Ok(Response::from_parts(parts, body::boxed(body)))
}

/// What a page is assembled from.
enum PageInput {
    /// The body as it streams (decoded).
    Stream(BoxStream<'static, Result<Bytes, BoxError>>),
    /// A cached template, parsed once.
    Parsed(Arc<[inlay_esi::Node]>),
}

/// Whether a body in this coding (none, gzip, br or zstd) can be assembled.
pub fn decodable(headers: &HeaderMap) -> bool {
    Coding::of_response(headers).is_ok() && is_text(headers)
}

/// The request head every include of a page starts from; it carries the
/// page's request id (`request_id`, the configured field) as the page's
/// backend request does.
fn include_head(
    page: &RequestHead,
    cfg: &EsiConfig,
    request_id: Option<&http::HeaderName>,
) -> RequestHead {
    let mut headers = HeaderMap::new();
    for name in &cfg.forward_headers {
        for v in page.headers.get_all(name.as_str()) {
            if let Ok(n) = http::HeaderName::from_bytes(name.as_bytes()) {
                headers.append(n, v.clone());
            }
        }
    }
    if let Some(h) = page.headers.get(header::HOST) {
        headers.insert(header::HOST, h.clone());
    }
    if let Some(name) = request_id
        && let Some(id) = page.headers.get(name)
    {
        headers.insert(name.clone(), id.clone());
    }
    RequestHead {
        method: Method::GET,
        uri: page.uri.clone(),
        headers,
        client_ip: page.client_ip,
        backend: page.backend.clone(),
        cache_key_extra: Vec::new(),
    }
}

/// Fetches includes through the cache and the configured backends only.
struct IncludeFetcher {
    through: ThroughCache,
    page: RequestHead,
    /// Includes of this page left out.
    omitted: Arc<AtomicU32>,
    /// Each include's time and outcome, when `Server-Timing` wants them.
    timings: Option<Arc<IncludeTimings>>,
}

impl IncludeFetcher {
    /// Resolve `src` to a request head, refusing anything that is not a
    /// configured backend (ESI must not become an open proxy).
    fn resolve(&self, src: &str) -> Result<RequestHead, FragmentError> {
        let mut head = self.page.clone();
        let src = src.trim();
        if src.starts_with('/') && !src.starts_with("//") {
            head.uri = src
                .parse()
                .map_err(|_| FragmentError::InvalidSrc(src.to_owned()))?;
            return Ok(head);
        }
        // The backend that serves the authority decides between TCP and
        // TLS, whichever scheme the page wrote.
        let absolute = src
            .strip_prefix("http://")
            .or_else(|| src.strip_prefix("https://"));
        if let Some(rest) = absolute {
            let uri: Uri = format!("http://{rest}")
                .parse()
                .map_err(|_| FragmentError::InvalidSrc(src.to_owned()))?;
            let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
            let page_host = self
                .page
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok());
            let backend = if page_host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
                Some(self.page.backend.clone())
            } else {
                self.through.upstreams().backend_serving(authority)
            };
            let Some(backend) = backend else {
                return Err(FragmentError::NotAllowed(format!(
                    "{src}: {authority} is not a configured backend"
                )));
            };
            head.backend = backend;
            head.uri = uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
                .parse()
                .map_err(|_| FragmentError::InvalidSrc(src.to_owned()))?;
            if let Ok(v) = HeaderValue::from_str(authority) {
                head.headers.insert(header::HOST, v);
            }
            return Ok(head);
        }
        if src.contains("://") || src.starts_with("//") {
            return Err(FragmentError::NotAllowed(format!(
                "{src}: only http:// or https:// to configured backends and relative paths are allowed"
            )));
        }
        // Relative to the page's directory.
        let path = self.page.uri.path();
        let dir = &path[..path.rfind('/').map(|i| i + 1).unwrap_or(0)];
        head.uri = format!("{dir}{src}")
            .parse()
            .map_err(|_| FragmentError::InvalidSrc(src.to_owned()))?;
        Ok(head)
    }
}

impl IncludeFetcher {
    /// The body of a fresh cache hit that is a plain 2xx fragment. Anything
    /// else (a failure that may fall back to `alt`, a nested ESI fragment,
    /// an encoded body, a miss) is fetched through the cache.
    fn at_hand(&self, head: &RequestHead) -> Option<Bytes> {
        let obj = self.through.get_fresh(head)?;
        let plain = obj.meta.headers.iter().all(|(name, _)| {
            name != ESI_MARK && !name.eq_ignore_ascii_case(header::CONTENT_ENCODING.as_str())
        });
        ((200..300).contains(&obj.meta.status) && plain)
            .then(|| inlay_cache::coding::identity_body(&obj))
    }
}

impl FragmentFetcher for IncludeFetcher {
    fn fetch(&self, src: &str) -> Fetch {
        let metrics = self.through.metrics();
        let started = metrics.esi_include();
        let timed = self.timings.as_ref().map(|_| Instant::now());
        let head = match self.resolve(src) {
            Ok(h) => h,
            Err(e) => {
                warn!(src = %src, "ESI include refused: {e}");
                metrics.esi_include_done(started);
                if let (Some(t), Some(timed)) = (&self.timings, timed) {
                    t.failed(src, timed.elapsed(), "refused");
                }
                return Fetch::failed(e);
            }
        };
        if let Some(body) = self.at_hand(&head) {
            metrics.esi_include_done(started);
            if let (Some(t), Some(timed)) = (&self.timings, timed) {
                t.fetched(src, timed.elapsed(), "hit");
            }
            return Fetch::Ready(body);
        }
        let through = self.through.clone();
        let src = src.to_owned();
        let timings = self.timings.clone();
        Fetch::Pending(Box::pin(async move {
            // Without the client's conditional or Range fields (they are
            // not forwarded to includes), and without the policy.
            let mut head = head;
            let out = through.serve(&mut head, None).await;
            // The time to the include's response head, as for a backend.
            through.metrics().esi_include_done(started);
            if let (Some(t), Some(timed)) = (&timings, timed) {
                match &out {
                    Ok(o) if o.resp.status().is_success() => {
                        t.fetched(&src, timed.elapsed(), o.status.log_name())
                    }
                    Ok(o) => t.fetched(
                        &src,
                        timed.elapsed(),
                        &format!("{} {}", o.status.log_name(), o.resp.status().as_u16()),
                    ),
                    Err(e) => t.failed(&src, timed.elapsed(), &e.to_string()),
                }
            }
            let out = out.map_err(|e| FragmentError::Fetch(Box::new(e)))?;
            let status = out.resp.status().as_u16();
            let esi = out.esi && decodable(out.resp.headers());
            let (parts, body) = out.resp.into_parts();
            let body = decoded(&parts.headers, body).ok_or_else(|| {
                FragmentError::InvalidSrc(format!("{src}: undecodable Content-Encoding"))
            })?;
            Ok(Fragment { status, body, esi })
        }))
    }

    fn omitted(&self, src: &str, reason: &FailureReason) {
        // The assembler has logged the src and the reason.
        self.omitted.fetch_add(1, Ordering::Relaxed);
        self.through.metrics().esi_include_omitted();
        if let Some(t) = &self.timings {
            t.omitted(src, &reason.to_string());
        }
    }
}

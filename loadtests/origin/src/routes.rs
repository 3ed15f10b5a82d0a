//! Request dispatch and the endpoints (ESI ones live in `esi.rs`).
//!
//! Every request goes: counters -> route -> delay -> handler -> shared knobs
//! (`knobs::finish`). Bad input becomes a 400 with the reason as body.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::{OriginBody, PATTERN_SPAN, PatternStream, html_page, pattern_bytes};
use crate::counters::Counters;
use crate::esi;
use crate::knobs;
use crate::query::{BadRequest, MAX_DELAY, Params};

/// Largest `/bytes/{n}` and `/slow-body` body (streamed, so memory is flat).
pub const MAX_BYTES: u64 = 16 << 30;
/// Largest `/static/{n}` body.
pub const MAX_STATIC: u64 = 64 << 20;
/// Largest `chunk=` and `first=` size.
pub const MAX_CHUNK: u64 = 16 << 20;
/// How long `/hang` holds a request by default.
pub const HANG_CAP: Duration = Duration::from_secs(120);
/// Default delay of `/dynamic`, a slow page rendered per request.
pub const DYNAMIC_DELAY: Duration = Duration::from_millis(150);

/// State shared by all connections.
#[derive(Default)]
pub struct State {
    /// Per-path request counts.
    pub counters: Counters,
    /// Sequence number of `/dynamic` renders, so each render differs.
    dynamic_renders: AtomicU64,
}

enum Route<'a> {
    Bytes(&'a str),
    Resp,
    Static(&'a str),
    Html(&'a str),
    EsiPage,
    EsiFragment(&'a str),
    Echo,
    Upload,
    Hang,
    SlowBody,
    Dynamic,
    NotFound,
}

fn route(path: &str) -> Route<'_> {
    if let Some(n) = path.strip_prefix("/static/") {
        return Route::Static(n);
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        return Route::Bytes(n);
    }
    if let Some(n) = path.strip_prefix("/html/") {
        return Route::Html(n);
    }
    if let Some(id) = path.strip_prefix("/esi/fragment/") {
        return Route::EsiFragment(id);
    }
    match path {
        "/resp" | "/" | "" => Route::Resp,
        "/esi/page" => Route::EsiPage,
        "/echo" => Route::Echo,
        "/upload" => Route::Upload,
        "/hang" => Route::Hang,
        "/slow-body" => Route::SlowBody,
        "/dynamic" => Route::Dynamic,
        _ => Route::NotFound,
    }
}

/// Answers one request; never fails (errors become 4xx responses).
pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<OriginBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let params = Params::parse(parts.uri.query());
    // Counter endpoints are not counted, so reading counts cannot skew them.
    match path {
        "/__counts" => return Ok(counts(&state)),
        "/__count" => return Ok(count(&state, &params)),
        "/__reset" => {
            state.counters.reset();
            return Ok(text(StatusCode::OK, "reset\n"));
        }
        _ => state.counters.hit(path),
    }
    if path == "/ws" {
        let resp = crate::ws::accept(&parts, &params);
        return Ok(resp.unwrap_or_else(|e| text(StatusCode::BAD_REQUEST, format!("{}\n", e.0))));
    }
    let (path, force_gzip) = match path.strip_prefix("/gzip") {
        Some("" | "/") => ("/resp", true),
        Some(rest) if rest.starts_with('/') => (rest, true),
        _ => (path, false),
    };
    let resp = match respond(&state, route(path), &params, &parts, body).await {
        Ok(resp) => knobs::finish(resp, &params, &parts, force_gzip),
        Err(e) => Err(e),
    };
    Ok(resp.unwrap_or_else(|e| text(StatusCode::BAD_REQUEST, format!("{}\n", e.0))))
}

async fn respond(
    state: &State,
    route: Route<'_>,
    p: &Params<'_>,
    req: &Parts,
    body: Incoming,
) -> Result<Response<OriginBody>, BadRequest> {
    let delay = match &route {
        Route::EsiPage => p.millis("page_delay_ms")?,
        Route::EsiFragment(id) => Some(esi::fragment_delay(id, p)?),
        Route::Dynamic => Some(p.millis("delay_ms")?.unwrap_or(DYNAMIC_DELAY)),
        Route::Hang => Some(p.millis("max_ms")?.unwrap_or(HANG_CAP)),
        _ => p.millis("delay_ms")?,
    };
    // Validate before waiting, so a bad request fails fast.
    if let Route::EsiFragment(id) = &route {
        esi::check_fragment_id(id)?;
    }
    if let Some(delay) = delay.filter(|d| !d.is_zero()) {
        tokio::time::sleep(delay.min(MAX_DELAY)).await;
    }
    match route {
        Route::Static(n) => static_object(n),
        Route::Html(n) => html(n),
        Route::Bytes(n) => bytes(n, p),
        Route::Resp => Ok(resp(p)),
        Route::EsiPage => esi::page(p),
        Route::EsiFragment(id) => esi::fragment(id, p),
        Route::Echo => echo(req, body).await,
        Route::Upload => upload(req, body).await,
        Route::Hang => Ok(text(StatusCode::OK, "hang over\n")),
        Route::SlowBody => slow_body(p),
        Route::Dynamic => dynamic(state, p),
        Route::NotFound => Ok(text(
            StatusCode::NOT_FOUND,
            format!("no such endpoint: {}\n", req.uri.path()),
        )),
    }
}

pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<OriginBody> {
    let mut resp = Response::new(OriginBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

fn json(value: &serde_json::Value) -> Response<OriginBody> {
    // Serialising a `Value` cannot fail; the fallback is for form's sake.
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(OriginBody::full(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn size(raw: &str, max: u64) -> Result<u64, BadRequest> {
    match raw.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        Ok(n) => Err(BadRequest(format!("size {n} is above the limit {max}"))),
        Err(_) => Err(BadRequest(format!("{raw:?} is not a byte count"))),
    }
}

fn octets(body: OriginBody) -> Response<OriginBody> {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp
}

/// `n` pattern bytes, from the static table when they fit in one frame.
fn pattern_body(n: u64) -> OriginBody {
    if n <= PATTERN_SPAN as u64 {
        OriginBody::full(pattern_bytes(0, n as usize))
    } else {
        OriginBody::pattern(PatternStream::chunked(n, PATTERN_SPAN, Duration::ZERO))
    }
}

/// `GET /static/{n}`: the cached object of the benchmarks.
fn static_object(n: &str) -> Result<Response<OriginBody>, BadRequest> {
    let n = size(n, MAX_STATIC)?;
    let mut resp = octets(pattern_body(n));
    let headers = resp.headers_mut();
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    // Digits and quotes only: always a valid header value.
    if let Ok(etag) = HeaderValue::try_from(format!("\"static-{n}\"")) {
        headers.insert(header::ETAG, etag);
    }
    Ok(resp)
}

/// `GET /html/{n}`: an HTML page of `n` bytes that compresses as real ones
/// do, cacheable for an hour, never encoded by the origin (unless `gzip=1`).
fn html(n: &str) -> Result<Response<OriginBody>, BadRequest> {
    let n = size(n, MAX_STATIC)?;
    let mut resp = Response::new(OriginBody::full(html_page(n as usize)));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    if let Ok(etag) = HeaderValue::try_from(format!("\"html-{n}\"")) {
        headers.insert(header::ETAG, etag);
    }
    Ok(resp)
}

/// `GET /bytes/{n}`: `n` pattern bytes, optionally streamed in `chunk`s
/// `chunk_delay_ms` apart.
fn bytes(n: &str, p: &Params<'_>) -> Result<Response<OriginBody>, BadRequest> {
    let n = size(n, MAX_BYTES)?;
    let chunk = p.u64("chunk", MAX_CHUNK)?;
    let chunk_delay = p.millis("chunk_delay_ms")?.unwrap_or(Duration::ZERO);
    let body = match chunk {
        None => pattern_body(n),
        Some(0) => return Err(BadRequest("chunk=0: chunks need at least 1 byte".into())),
        Some(chunk) => OriginBody::pattern(PatternStream::chunked(n, chunk as usize, chunk_delay)),
    };
    Ok(octets(body))
}

/// `GET /slow-body`: headers at once, `first` bytes, a stall of `after_ms`,
/// then the rest of `n` bytes.
fn slow_body(p: &Params<'_>) -> Result<Response<OriginBody>, BadRequest> {
    let n = p.u64("n", MAX_BYTES)?.unwrap_or(1024);
    let first = p.u64("first", MAX_CHUNK)?.unwrap_or(0);
    let stall = p.millis("after_ms")?.unwrap_or(Duration::from_millis(1000));
    Ok(octets(OriginBody::pattern(PatternStream::stalled(
        n, first, stall,
    ))))
}

/// `GET /resp`: `ok\n` or the `body=` text.
fn resp(p: &Params<'_>) -> Response<OriginBody> {
    match p.get("body") {
        Some(body) => text(StatusCode::OK, body.to_string()),
        None => text(StatusCode::OK, "ok\n"),
    }
}

/// `GET /dynamic`: a page rendered per request, never cacheable.
fn dynamic(state: &State, p: &Params<'_>) -> Result<Response<OriginBody>, BadRequest> {
    let pad_to = p.u64("size", MAX_CHUNK)?.unwrap_or(0) as usize;
    let render = state.dynamic_renders.fetch_add(1, Ordering::Relaxed) + 1;
    let mut html = format!(
        "<!DOCTYPE html>\n<html><head><title>dynamic page</title></head><body>\n\
         <h1>dynamic page</h1>\n<p>render #{render}</p>\n"
    );
    let tail = "</body></html>\n";
    if pad_to > html.len() + tail.len() {
        let pad = pad_to - html.len() - tail.len();
        html.push_str(&"x".repeat(pad.saturating_sub(1)));
        html.push('\n');
    }
    html.push_str(tail);
    let mut resp = Response::new(OriginBody::full(html));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// `/echo`: the request as JSON (the body is read and counted, not kept).
async fn echo(req: &Parts, body: Incoming) -> Result<Response<OriginBody>, BadRequest> {
    let (body_len, _) = drain(body).await?;
    let headers: Vec<[String; 2]> = req
        .headers
        .iter()
        .map(|(name, value)| {
            [
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ]
        })
        .collect();
    Ok(json(&serde_json::json!({
        "method": req.method.as_str(),
        "version": format!("{:?}", req.version),
        "uri": req.uri.to_string(),
        "path": req.uri.path(),
        "query": req.uri.query(),
        "headers": headers,
        "body_len": body_len,
    })))
}

/// `POST|PUT /upload`: streams the body through a CRC-32, keeping none of it.
async fn upload(req: &Parts, body: Incoming) -> Result<Response<OriginBody>, BadRequest> {
    if req.method != Method::POST && req.method != Method::PUT {
        let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "use POST or PUT\n");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST, PUT"));
        return Ok(resp);
    }
    let (bytes, crc32) = drain(body).await?;
    Ok(json(&serde_json::json!({ "bytes": bytes, "crc32": crc32 })))
}

/// Reads a request body to its end: (length, CRC-32).
async fn drain(mut body: Incoming) -> Result<(u64, u32), BadRequest> {
    let mut len = 0u64;
    let mut crc = crc32fast::Hasher::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BadRequest(format!("reading the request body: {e}")))?;
        if let Some(data) = frame.data_ref() {
            len += data.len() as u64;
            crc.update(data);
        }
    }
    Ok((len, crc.finalize()))
}

fn counts(state: &State) -> Response<OriginBody> {
    let map: serde_json::Map<String, serde_json::Value> = state
        .counters
        .snapshot()
        .into_iter()
        .map(|(path, n)| (path, n.into()))
        .collect();
    json(&serde_json::Value::Object(map))
}

fn count(state: &State, p: &Params<'_>) -> Response<OriginBody> {
    match p.get("path") {
        Some(path) => text(StatusCode::OK, state.counters.get(path).to_string()),
        None => text(StatusCode::BAD_REQUEST, "give ?path=/some/path\n"),
    }
}

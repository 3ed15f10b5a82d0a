//! Filling the cache: a task of the fill's own reads the backend body at
//! the backend's speed into an object being filled ([`Filling`]) and then
//! into the store; the client that fetched it and every coalesced waiter
//! read that object at their own pace.

pub(crate) mod flight;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use inlay_core::CacheSettings;
use inlay_core::body::{self, BoxError, ProxyBody};
use inlay_storage::ObjectMeta;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::HttpCache;
use crate::ban::FillTicket;
use crate::coding::{self, Coding};
use crate::key::{ContentCodings, PrimaryKey};
use crate::object::object_meta;

use flight::Flight;

/// The longest an uncacheable key stays hit-for-miss.
const MAX_HIT_FOR_MISS: Duration = Duration::from_secs(120);

/// Where a fetched response is stored.
pub(crate) struct FillTarget {
    pub(crate) cache: HttpCache,
    pub(crate) primary: PrimaryKey,
    /// The request's headers (they select the Vary variant).
    pub(crate) req_headers: HeaderMap,
    /// The fetch slot other requests wait on; released after storing.
    pub(crate) flight: Option<Flight>,
}

/// Why a body read from an object being filled was cut.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// The backend body failed midway; nothing was stored.
    #[error("backend body failed while it was being stored: {0}")]
    Backend(Arc<str>),
    /// The body grew past `max_object_size` before this reader started: it
    /// is not stored, and only the readers that had started get the rest.
    #[error("response grew past max_object_size before this coalesced request joined")]
    TooBig,
    /// The fill ended without saying why (its task was cancelled).
    #[error("the fill of this response was abandoned")]
    Abandoned,
}

/// How far a fill is: the chunks read from the backend so far, and how it ended.
#[derive(Default)]
struct Progress {
    chunks: Vec<Bytes>,
    end: Option<End>,
}

#[derive(Clone)]
enum End {
    /// The whole body is in `chunks`.
    Complete,
    /// The backend failed.
    Failed(Arc<str>),
    /// Over `max_object_size`: every reader that had started gets the rest
    /// through its own channel ([`Overflow`]); nobody else does.
    TooBig,
}

/// The rest of a body too big to store, for each reader that had started
/// before it grew too big: one channel per reader, so each gets every byte,
/// and the fill goes on at the pace of the slowest (it is no longer stored,
/// only passed through, as a pass is).
#[derive(Default)]
struct Overflow {
    readers: Vec<mpsc::Sender<Result<Bytes, BoxError>>>,
    /// Set when the body grew too big: readers that start later get
    /// [`FillError::TooBig`].
    closed: bool,
}

impl Overflow {
    /// The channel a new reader gets the rest through, if it is not too late.
    fn join(
        overflow: &parking_lot::Mutex<Overflow>,
    ) -> Option<mpsc::Receiver<Result<Bytes, BoxError>>> {
        let mut o = overflow.lock();
        if o.closed {
            return None;
        }
        let (tx, rx) = mpsc::channel(8);
        o.readers.push(tx);
        Some(rx)
    }

    /// Every reader's channel; no reader joins after this.
    fn close(
        overflow: &parking_lot::Mutex<Overflow>,
    ) -> Vec<mpsc::Sender<Result<Bytes, BoxError>>> {
        let mut o = overflow.lock();
        o.closed = true;
        std::mem::take(&mut o.readers)
    }
}

/// A response being stored, which coalesced requests stream while it grows.
/// Its memory is the object being stored (at most `max_object_size`).
pub(crate) struct Filling {
    status: StatusCode,
    headers: HeaderMap,
    meta: Arc<ObjectMeta>,
    /// The storage key of the variant it fills.
    variant: String,
    esi: bool,
    progress: watch::Receiver<Progress>,
    overflow: Arc<parking_lot::Mutex<Overflow>>,
}

impl Filling {
    /// Whether a request with `req_headers` for `primary` selects the
    /// variant being filled.
    pub(crate) fn serves(
        &self,
        primary: &PrimaryKey,
        req_headers: &HeaderMap,
        codings: &ContentCodings,
    ) -> bool {
        primary.storage_key(&self.meta.vary, req_headers, codings) == self.variant
    }

    /// The metadata the object will be stored with.
    pub(crate) fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    /// Whether the whole body has been read from the backend.
    pub(crate) fn is_complete(&self) -> bool {
        matches!(self.progress.borrow().end, Some(End::Complete))
    }

    /// Whether the body is an ESI template.
    pub(crate) fn esi(&self) -> bool {
        self.esi
    }

    /// The response as the client that fetched it got it, its body read
    /// from the start of the object being filled.
    pub(crate) fn response(&self) -> Response<ProxyBody> {
        let rest = Overflow::join(&self.overflow);
        let mut resp = Response::new(reader(self.progress.clone(), rest));
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers.clone();
        resp
    }
}

/// Stores `resp` if `settings` allow; returns the response to send and
/// whether it is being stored. An uncacheable response marks its key
/// hit-for-miss instead.
///
/// A stored body is read by a task of its own at the backend's speed, so
/// a slow client neither slows the fill nor holds the waiters, and the
/// object is completed and stored even if the client goes away (as Varnish
/// does). A body that turns out larger than `max_object_size` is not
/// stored: from then on it is passed through to every client reading it at
/// the pace of the slowest, and the fill stops when they have all gone.
pub(crate) fn fill(
    resp: Response<ProxyBody>,
    settings: &CacheSettings,
    target: FillTarget,
) -> (Response<ProxyBody>, bool) {
    let max_object_size = target.cache.max_object_size();
    if !settings.cacheable {
        // Later requests go straight to the backend instead of queueing.
        let hfm = if settings.ttl.is_zero() {
            MAX_HIT_FOR_MISS
        } else {
            settings.ttl.min(MAX_HIT_FOR_MISS)
        };
        target.cache.mark_hit_for_miss(&target.primary, hfm);
        return (resp, false);
    }
    let declared = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_object_size) {
        debug!(
            len = declared,
            "response larger than max_object_size: streamed, not stored"
        );
        return (resp, false);
    }
    // Bans compare against the time the response arrived: a ban added
    // while the body streams still covers it.
    let ticket = target.cache.fill_ticket();
    let codings = codings_to_store(&target.cache, &resp, settings);
    let mut meta = object_meta(resp.status().as_u16(), resp.headers(), settings);
    meta.created_ms = ticket.since_ms;
    if !codings.is_empty() {
        // It came uncoded and will hold every coding: whatever coding a
        // request negotiates, this object serves it, so Accept-Encoding
        // selects no variant of its own (an origin that says `Vary:
        // Accept-Encoding` and sends identity is fetched once, not once
        // per coding).
        meta.vary.retain(|name| name != "accept-encoding");
    }
    let (parts, body) = resp.into_parts();
    let (progress, progress_rx) = watch::channel(Progress::default());
    let overflow = Arc::new(parking_lot::Mutex::new(Overflow::default()));
    let rest_rx = Overflow::join(&overflow);
    let filling = Arc::new(Filling {
        status: parts.status,
        headers: parts.headers.clone(),
        variant: target.primary.storage_key(
            &meta.vary,
            &target.req_headers,
            &target.cache.rules().accept_encoding,
        ),
        meta: Arc::new(meta.clone()),
        esi: settings.esi,
        progress: progress_rx.clone(),
        overflow: overflow.clone(),
    });
    if let Some(flight) = &target.flight {
        flight.publish(filling);
    }
    tokio::spawn(drive(
        body,
        progress,
        overflow,
        (meta, ticket, codings),
        max_object_size,
        target,
    ));
    (
        Response::from_parts(parts, reader(progress_rx, rest_rx)),
        true,
    )
}

/// The codings a fill of `resp` stores beside its identity body: those
/// Inlay makes of `cache.accept_encoding`, when `[compression]` applies
/// to the response. Not for an ESI template: its page is what is sent,
/// assembled (and compressed) per request.
fn codings_to_store(
    cache: &HttpCache,
    resp: &Response<ProxyBody>,
    settings: &CacheSettings,
) -> Vec<Coding> {
    let rules = cache.rules();
    match &rules.compression {
        Some(c) if !settings.esi && c.applies(resp.status(), resp.headers()) => {
            coding::made_codings(&rules.accept_encoding)
        }
        _ => Vec::new(),
    }
}

/// The fill's task: reads the backend body into `progress` and stores it
/// (with `codings` made beside it).
async fn drive(
    mut body: ProxyBody,
    progress: watch::Sender<Progress>,
    overflow: Arc<parking_lot::Mutex<Overflow>>,
    (mut meta, ticket, codings): (ObjectMeta, FillTicket, Vec<Coding>),
    max_object_size: u64,
    target: FillTarget,
) {
    let FillTarget {
        cache,
        primary,
        req_headers,
        mut flight,
    } = target;
    let mut size: u64 = 0;
    let mut storing = true;
    // The readers' channels once the body is too big to store.
    let mut rest = Vec::new();
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if storing && size + data.len() as u64 > max_object_size {
                    debug!(
                        key = primary.as_str(),
                        "response grew past max_object_size: passed through, not stored"
                    );
                    storing = false;
                    rest = Overflow::close(&overflow);
                    progress.send_modify(|p| p.end = Some(End::TooBig));
                    // Later requests fetch for themselves.
                    flight = None;
                }
                if storing {
                    size += data.len() as u64;
                    progress.send_modify(|p| p.chunks.push(data));
                } else {
                    let mut alive = Vec::with_capacity(rest.len());
                    for tx in rest {
                        if tx.send(Ok(data.clone())).await.is_ok() {
                            alive.push(tx);
                        }
                    }
                    rest = alive;
                    if rest.is_empty() {
                        // Not stored, and every client reading it went away.
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                warn!(key = primary.as_str(), error = %e, "backend body failed; object not stored");
                if storing {
                    let why: Arc<str> = e.to_string().into();
                    progress.send_modify(|p| p.end = Some(End::Failed(why)));
                } else {
                    let why: Arc<str> = e.to_string().into();
                    for tx in rest {
                        let err = BoxError::from(FillError::Backend(why.clone()));
                        let _ = tx.send(Err(err)).await;
                    }
                }
                return;
            }
        }
    }
    drop(body);
    if !storing {
        return;
    }
    progress.send_modify(|p| p.end = Some(End::Complete));
    let mut whole = concat(&progress.borrow().chunks, size);
    if let Some(rules) = cache.rules().compression.clone()
        && !codings.is_empty()
        && size >= rules.min_size
    {
        // Once, here, for every hit to come: CPU-bound, so on the blocking
        // pool, and no more at once than there are cores.
        let _permit = cache.compressing().acquire().await;
        let identity = whole.clone();
        let made = tokio::task::spawn_blocking(move || {
            coding::store_codings(&identity, &codings, &rules.store_levels, max_object_size)
        })
        .await;
        match made {
            Ok((body, index)) => {
                whole = body;
                meta.codings = index;
            }
            Err(e) => warn!(key = primary.as_str(), error = %e, "compressing for the store failed"),
        }
    }
    match cache
        .insert_filled(&primary, &req_headers, meta, whole, &ticket)
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_full() => {
            warn!(
                key = primary.as_str(),
                "cache disk is full: response served uncached"
            )
        }
        Err(e) => {
            warn!(key = primary.as_str(), error = %e, "cache write failed: response served uncached")
        }
    }
    // Waiters that did not join look the key up again once it is stored.
    drop(flight);
}

/// The chunks as one buffer (no copy for a body of one chunk).
fn concat(chunks: &[Bytes], size: u64) -> Bytes {
    if let [one] = chunks {
        return one.clone();
    }
    let mut buf = BytesMut::with_capacity(usize::try_from(size).unwrap_or(0));
    for c in chunks {
        buf.extend_from_slice(c);
    }
    buf.freeze()
}

/// What a reader does next.
enum Step {
    Chunk(Bytes),
    End(End),
    Wait,
}

/// A body read from an object being filled, from its first byte. `rest`
/// (this reader's channel) carries the body on when it grows too big to
/// store.
fn reader(
    progress: watch::Receiver<Progress>,
    rest: Option<mpsc::Receiver<Result<Bytes, BoxError>>>,
) -> ProxyBody {
    struct Reader {
        progress: watch::Receiver<Progress>,
        next: usize,
        rest: Option<mpsc::Receiver<Result<Bytes, BoxError>>>,
        done: bool,
    }
    let start = Reader {
        progress,
        next: 0,
        rest,
        done: false,
    };
    let stream = futures_util::stream::unfold(start, |mut r| async move {
        if r.done {
            return None;
        }
        loop {
            let step = {
                let p = r.progress.borrow_and_update();
                match (p.chunks.get(r.next), &p.end) {
                    (Some(c), _) => Step::Chunk(c.clone()),
                    (None, Some(end)) => Step::End(end.clone()),
                    (None, None) => Step::Wait,
                }
            };
            let err = match step {
                Step::Chunk(c) => {
                    r.next += 1;
                    return Some((Ok(c), r));
                }
                Step::End(End::Complete) => return None,
                Step::End(End::Failed(why)) => FillError::Backend(why),
                Step::End(End::TooBig) => match r.rest.as_mut() {
                    Some(rest) => {
                        let item = rest.recv().await?;
                        return Some((item, r));
                    }
                    None => FillError::TooBig,
                },
                Step::Wait => {
                    if r.progress.changed().await.is_ok() {
                        continue;
                    }
                    FillError::Abandoned
                }
            };
            r.done = true;
            return Some((Err(BoxError::from(err)), r));
        }
    });
    body::boxed(StreamBody::new(
        stream.map(|r| r.map(http_body::Frame::data)),
    ))
}

//! Parallel page assembly: parse the page as it streams, start every
//! include's fetch as soon as its tag is parsed, and write the output in
//! document order as soon as each piece and everything before it is ready.
//!
//! Structure: one *driver* per document (the page, each ESI fragment, each
//! `esi:attempt`/`esi:except`) keeps an ordered queue of slots: ready bytes,
//! or a child task (an include, a try block) that streams its output through
//! a channel. The driver reads its input and the head slot at the same time;
//! children run in their own tasks, so their fetches (and their own nested
//! includes) proceed while earlier slots are still being written. Dropping a
//! slot aborts its task, so dropping the output stream cancels everything.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};
use tracing::{debug, warn};

use super::BoxError;
use super::parser::{EsiParser, Node, Try};
use super::vars::EsiVars;

/// Output chunks buffered between the page driver and the consumer.
const OUTPUT_BUFFER: usize = 16;

/// Ready pieces smaller than this together are written as one chunk.
const COALESCE_BYTES: usize = 16 * 1024;

/// Page text read ahead of a pending include: past it the page body is not
/// read further until the include ahead of it is written (backpressure on
/// the page's origin, or on a gzip page's decoding).
pub const MAX_PAGE_AHEAD: usize = 16 * 1024 * 1024;

/// Limits applied to one page (counting its nested fragments).
#[derive(Debug, Clone)]
pub struct EsiLimits {
    /// Deepest fragment nesting: the page is depth 0, its includes depth 1.
    /// An include that would go deeper fails.
    pub max_depth: u32,
    /// Most fetches per page, counting nested includes and `alt` fetches.
    /// Further includes fail.
    pub max_includes: usize,
    /// Concurrent fragment fetches per page (1 = serial; 0 is taken as 1).
    pub max_concurrency: usize,
    /// Time allowed for one fragment, from when it may start (after waiting
    /// for a concurrency slot) to the end of its own body.
    pub include_timeout: Duration,
    /// Time allowed for the whole page, from the call to [`assemble`].
    pub page_deadline: Duration,
    /// What an include failure that nothing handles does to the page.
    pub on_include_error: OnIncludeError,
    /// Fragment output held per page before its turn (bytes of includes
    /// that are not at the front of the page, and `esi:attempt` content).
    /// A fragment that is ahead waits for room (giving back its concurrency
    /// slot; its include timeout is extended by the wait); output at the
    /// front of the page waits only for the client (up to as many bytes
    /// not yet written to the page output), never for output behind it. One chunk may pass it when nothing
    /// else is held. An `esi:attempt` holding more fails (to `esi:except`).
    pub max_buffered_bytes: usize,
}

/// What happens when an include fails and neither its `alt`, its
/// `onerror="continue"`, an enclosing `esi:try` nor the fallback of an
/// enclosing include handles the failure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnIncludeError {
    /// Leave the failed include out and go on with the page, as if it had
    /// `onerror="continue"`; the failure is logged and reported to
    /// [`FragmentFetcher::omitted`]. The page is never cut.
    #[default]
    Omit,
    /// ESI 1.0: the page ends there; the output stream yields an
    /// [`EsiError`] after what was already sent.
    Fail,
}

impl Default for EsiLimits {
    fn default() -> Self {
        EsiLimits {
            max_depth: 5,
            max_includes: 256,
            max_concurrency: 16,
            include_timeout: Duration::from_secs(5),
            page_deadline: Duration::from_secs(30),
            on_include_error: OnIncludeError::Omit,
            max_buffered_bytes: 16 * 1024 * 1024,
        }
    }
}

/// A fetched fragment.
pub struct Fragment {
    /// HTTP status; anything but 2xx is a failure of the include.
    pub status: u16,
    /// The fragment body.
    pub body: BoxStream<'static, Result<Bytes, BoxError>>,
    /// Process this fragment's body as ESI too (nested includes).
    pub esi: bool,
}

impl std::fmt::Debug for Fragment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fragment")
            .field("status", &self.status)
            .field("esi", &self.esi)
            .finish_non_exhaustive()
    }
}

/// Why a fetcher could not produce a fragment.
#[derive(Debug, thiserror::Error)]
pub enum FragmentError {
    /// The src maps to no configured backend (includes go nowhere else).
    #[error("include source not allowed: {0}")]
    NotAllowed(String),
    /// The src is not a URL the fetcher understands.
    #[error("invalid include source: {0}")]
    InvalidSrc(String),
    /// The backend could not be reached or did not answer properly.
    #[error("fetch failed: {0}")]
    Fetch(#[source] BoxError),
}

/// What a [`FragmentFetcher`] gives for a source.
pub enum Fetch {
    /// The whole body of a plain 2xx fragment (not ESI itself), at hand now,
    /// such as a fresh cache hit: written in place, with no task.
    Ready(Bytes),
    /// A fetch to await. Its work must start when it is first polled: the
    /// assembler may create it before a concurrency slot is free.
    Pending(BoxFuture<'static, Result<Fragment, FragmentError>>),
}

impl Fetch {
    /// A fetch that fails with `e` when awaited.
    pub fn failed(e: FragmentError) -> Self {
        Fetch::Pending(Box::pin(std::future::ready(Err(e))))
    }
}

/// Fetches include sources. The host implements it with its backend
/// fetcher; tests use fakes.
pub trait FragmentFetcher: Send + Sync + 'static {
    /// Fetch `src` (after variable substitution, as written in the page:
    /// relative or absolute).
    fn fetch(&self, src: &str) -> Fetch;

    /// Called once for every include that failed and was left out of the
    /// page (nothing in its place): by `onerror="continue"`, by
    /// [`OnIncludeError::Omit`], or because it would nest deeper than
    /// [`EsiLimits::max_depth`]. `src` is the include's src. The host counts
    /// these; the default does nothing (the failure is logged anyway).
    fn omitted(&self, src: &str, reason: &FailureReason) {
        let _ = (src, reason);
    }
}

/// Why one include failed.
#[derive(Debug, thiserror::Error)]
pub enum FailureReason {
    /// The fragment answered with a non-2xx status.
    #[error("status {0}")]
    Status(u16),
    /// The fetcher failed.
    #[error(transparent)]
    Fetch(FragmentError),
    /// The fragment body stream failed.
    #[error("reading the body failed: {0}")]
    Body(#[source] BoxError),
    /// The fragment took longer than the include timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The page deadline passed.
    #[error("page deadline reached")]
    PageDeadline,
    /// The include would nest deeper than the depth limit.
    #[error("include depth limit {0} exceeded")]
    DepthExceeded(u32),
    /// The page already used its include budget.
    #[error("limit of {0} includes per page exceeded")]
    TooManyIncludes(usize),
    /// The fragment failed after part of it had been sent; the rest of the
    /// page cannot be trusted.
    #[error("failed after part of the fragment was sent")]
    Truncated,
    /// An include inside this (ESI) fragment failed without fallback.
    #[error("nested include {src:?} failed: {reason}")]
    Nested {
        /// The nested include's src.
        src: String,
        /// Why it failed.
        reason: Box<FailureReason>,
    },
    /// The task serving the include ended without an answer (a panic).
    #[error("include task ended unexpectedly")]
    TaskLost,
    /// An `esi:attempt` held more than [`EsiLimits::max_buffered_bytes`].
    #[error("esi:attempt content larger than {0} bytes")]
    TooLarge(usize),
}

/// Why the assembled page ended early. The output stream yields this after
/// the bytes already sent; the host then aborts the response, so the client
/// sees a truncated page (or answers with an error status when nothing was
/// sent yet). Include failures end the page only with [`OnIncludeError::Fail`].
#[derive(Debug, thiserror::Error)]
pub enum EsiError {
    /// An include failed with no `alt` success, no `onerror="continue"` and
    /// no enclosing `esi:try` to fall back on ([`OnIncludeError::Fail`] only).
    #[error("include {src:?} failed: {reason}")]
    Include {
        /// The include's src (after variable substitution).
        src: String,
        /// Why it failed.
        reason: FailureReason,
    },
    /// The page body stream failed.
    #[error("reading the page body failed: {0}")]
    Body(#[source] BoxError),
    /// The page deadline passed before the page body was fully read.
    #[error("page deadline reached while reading the page body")]
    PageDeadline,
}

/// A failure that ends a document (page, fragment, attempt).
#[derive(Debug)]
struct Failed {
    src: String,
    reason: FailureReason,
}

/// What a child task sends to its slot.
#[derive(Debug)]
enum Ev {
    /// Output bytes, with what they are charged to the page's budget.
    Data(Bytes, Option<Charge>),
    /// Discard the data sent so far: the source failed, a fallback follows.
    Reset,
    /// The child is complete.
    End,
    /// The child failed and is left out of the page: discard what was not
    /// written yet; the child is complete.
    Omitted(Failed),
    /// The child failed without fallback.
    Fail(Failed),
}

/// Why a driver stopped early.
#[derive(Debug)]
enum DriveError {
    /// Nobody reads the output any more.
    Closed,
    /// The document's own body failed or timed out.
    Source(FailureReason),
    /// An include in the document failed without fallback.
    Include(Failed),
}

/// Shared per-page state.
struct Page {
    vars: Arc<EsiVars>,
    fetcher: Arc<dyn FragmentFetcher>,
    limits: EsiLimits,
    permits: Arc<Semaphore>,
    includes: AtomicUsize,
    deadline: Instant,
    /// Output held before its turn.
    budget: Arc<Budget>,
    /// Output at the front of the page not written to the page output yet
    /// (it waits for the client, never for output behind it).
    front: Arc<Budget>,
}

/// The bytes a page holds before their turn (see
/// [`EsiLimits::max_buffered_bytes`]). Hand-written rather than a tokio
/// `Semaphore` because `esi:attempt` buffers are charged past the limit.
struct Budget {
    limit: usize,
    used: Mutex<usize>,
    /// Signalled when bytes are released or a slot reaches the head of its
    /// queue (either may let a waiting fragment go on).
    changed: Notify,
    /// The most ever charged at once (for tests).
    peak: AtomicUsize,
}

impl Budget {
    fn new(limit: usize) -> Self {
        Budget {
            limit,
            used: Mutex::new(0),
            changed: Notify::new(),
            peak: AtomicUsize::new(0),
        }
    }

    /// Charge `n` bytes if they fit (or nothing else is held).
    fn try_charge(self: &Arc<Self>, n: usize) -> Option<Charge> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if *used != 0 && used.saturating_add(n) > self.limit {
            return None;
        }
        *used += n;
        self.peak.fetch_max(*used, Ordering::Relaxed);
        Some(Charge {
            budget: Arc::clone(self),
            n,
        })
    }

    /// Charge `n` bytes whatever is held.
    /// Whether more may be charged now.
    fn has_room(&self) -> bool {
        *self.used.lock().unwrap_or_else(|e| e.into_inner()) < self.limit
    }

    fn force(self: &Arc<Self>, n: usize) -> Charge {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_add(n);
        self.peak.fetch_max(*used, Ordering::Relaxed);
        Charge {
            budget: Arc::clone(self),
            n,
        }
    }
}

/// Bytes charged to a page's [`Budget`], released when dropped (when the
/// bytes are written to the page output or thrown away).
struct Charge {
    budget: Arc<Budget>,
    n: usize,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({})", self.n)
    }
}

impl Charge {
    /// Charge `k` more, whatever is held.
    fn grow(&mut self, k: usize) {
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_add(k);
        self.budget.peak.fetch_max(*used, Ordering::Relaxed);
        self.n = self.n.saturating_add(k);
    }

    /// Release `k` of it.
    fn shrink(&mut self, k: usize) {
        let k = k.min(self.n);
        self.n -= k;
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(k);
        drop(used);
        self.budget.changed.notify_waiters();
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(self.n);
        drop(used);
        self.budget.changed.notify_waiters();
    }
}

/// Where a document's output stands: at the front of the page when it and
/// every document it is nested in are at the head of their parent's queue.
/// An `esi:attempt` is always at the head of its try block (it fills the
/// block's buffer).
struct Position {
    head: AtomicBool,
    parent: Option<Arc<Position>>,
}

impl Position {
    fn root() -> Arc<Self> {
        Arc::new(Position {
            head: AtomicBool::new(true),
            parent: None,
        })
    }

    fn child(parent: &Arc<Position>) -> Arc<Self> {
        Arc::new(Position {
            head: AtomicBool::new(false),
            parent: Some(Arc::clone(parent)),
        })
    }

    fn at_front(&self) -> bool {
        let mut p = self;
        loop {
            if !p.head.load(Ordering::Acquire) {
                return false;
            }
            match &p.parent {
                Some(parent) => p = parent,
                None => return true,
            }
        }
    }
}

/// A fragment's time limit and concurrency slot, shared by its body reader
/// and its output (which gives the slot back while it waits for budget, and
/// extends the time limit by the wait).
struct Lease {
    until: Instant,
    expiry: Expiry,
    permit: Option<OwnedSemaphorePermit>,
    /// The body is not read for want of budget: since when, and whether the
    /// slot was given back.
    paused: Option<(Instant, bool)>,
}

impl Lease {
    fn new(until: Instant, expiry: Expiry, permit: Option<OwnedSemaphorePermit>) -> SharedLease {
        Arc::new(Mutex::new(Lease {
            until,
            expiry,
            permit,
            paused: None,
        }))
    }

    /// Extend the time limit by `waited`, up to the page deadline.
    fn extend(&mut self, waited: Duration, deadline: Instant) {
        match self.until.checked_add(waited) {
            Some(t) if t < deadline => self.until = t,
            _ => {
                self.until = deadline;
                self.expiry = Expiry::Page;
            }
        }
    }
}

type SharedLease = Arc<Mutex<Lease>>;

fn lock(lease: &SharedLease) -> std::sync::MutexGuard<'_, Lease> {
    lease.lock().unwrap_or_else(|e| e.into_inner())
}

/// Aborts a task when dropped, so dropping a slot cancels its fetch.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where a driver writes.
enum Out {
    /// The page output (bounded: a slow client holds the page driver back).
    Page(mpsc::Sender<Result<Bytes, EsiError>>),
    /// A slot of the parent document; `sent` records whether data went out
    /// since the last reset. Data is charged (to the front budget at the
    /// front of the page, else to the budget of held output), waiting for
    /// room, before it is sent.
    Slot {
        tx: mpsc::UnboundedSender<Ev>,
        sent: bool,
        pos: Arc<Position>,
        page: Arc<Page>,
        /// The fragment being served, if it holds a time limit and a slot.
        lease: Option<SharedLease>,
    },
    /// An `esi:attempt`, released only when all of it succeeded; every
    /// chunk is charged to the budget of held output (waiting for room
    /// while the try block is not at the front of the page, charged past
    /// the limit once it is), and more than the limit fails it.
    Buffer {
        chunks: Vec<(Bytes, Option<Charge>)>,
        len: usize,
        budget: Arc<Budget>,
        /// Where the attempt's output stands (at the front when its try
        /// block is).
        pos: Arc<Position>,
    },
}

impl Out {
    fn slot(tx: mpsc::UnboundedSender<Ev>, pos: Arc<Position>, page: Arc<Page>) -> Self {
        Out::Slot {
            tx,
            sent: false,
            pos,
            page,
            lease: None,
        }
    }

    async fn data(&mut self, b: Bytes) -> Result<(), DriveError> {
        self.put(b, None).await
    }

    /// Write `b`, keeping `charge` (if any) with it until it is written to
    /// the page output.
    async fn put(&mut self, b: Bytes, charge: Option<Charge>) -> Result<(), DriveError> {
        if b.is_empty() {
            return Ok(());
        }
        match self {
            Out::Page(tx) => {
                let r = tx.send(Ok(b)).await.map_err(|_| DriveError::Closed);
                drop(charge);
                r
            }
            Out::Slot {
                tx,
                sent,
                pos,
                page,
                lease,
            } => {
                let charge = match charge {
                    Some(c) => c,
                    None => wait_for_budget(page, pos, lease.as_ref(), b.len()).await,
                };
                *sent = true;
                tx.send(Ev::Data(b, Some(charge)))
                    .map_err(|_| DriveError::Closed)
            }
            Out::Buffer {
                chunks,
                len,
                budget,
                pos,
            } => {
                let n = b.len();
                // Charged to the budget of held output, not the front's: the
                // buffer is not written until the attempt is complete.
                let charge = match charge {
                    Some(c) if Arc::ptr_eq(&c.budget, budget) => c,
                    _ => charge_attempt(budget, pos, n).await,
                };
                chunks.push((b, Some(charge)));
                *len = len.saturating_add(n);
                if *len > budget.limit {
                    chunks.clear();
                    return Err(DriveError::Source(FailureReason::TooLarge(budget.limit)));
                }
                Ok(())
            }
        }
    }

    /// Was data sent to a slot since the last call? Resets the flag.
    fn take_sent(&mut self) -> bool {
        match self {
            Out::Slot { sent, .. } => std::mem::take(sent),
            _ => false,
        }
    }
}

/// Charge `n` bytes of an attempt's buffer at `pos`: wait for room while
/// the attempt is not at the front of the page; at the front, charge them
/// whatever is held (output behind it cannot go before it; the attempt
/// fails when its own buffer is over the limit).
async fn charge_attempt(budget: &Arc<Budget>, pos: &Position, n: usize) -> Charge {
    loop {
        let changed = budget.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if pos.at_front() {
            return budget.force(n);
        }
        if let Some(c) = budget.try_charge(n) {
            return c;
        }
        changed.await;
    }
}

/// Charge `n` bytes at `pos` to the page's budget, waiting until they fit:
/// at the front of the page, to the front budget (which only the client's
/// reading frees); else to the budget of output held before its turn
/// (which the front's progress frees). While waiting,
/// the fragment's concurrency slot is given back (a fragment ahead may need
/// it) and its time limit is extended by the wait.
async fn wait_for_budget(
    page: &Page,
    pos: &Position,
    lease: Option<&SharedLease>,
    n: usize,
) -> Charge {
    let mut waiting_since = None;
    let mut gave_back = false;
    let charge = loop {
        // At the front: wait only for front output to be written (for the
        // client). Else for room in the budget, or for reaching the front.
        let at_front = pos.at_front();
        let budget = if at_front { &page.front } else { &page.budget };
        let changed = budget.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if !at_front && pos.at_front() {
            continue;
        }
        if let Some(c) = budget.try_charge(n) {
            break c;
        }
        if waiting_since.is_none() {
            waiting_since = Some(Instant::now());
            if let Some(lease) = lease {
                gave_back = lock(lease).permit.take().is_some();
            }
        }
        changed.await;
    };
    if let (Some(since), Some(lease)) = (waiting_since, lease) {
        let permit = if gave_back {
            Arc::clone(&page.permits).acquire_owned().await.ok()
        } else {
            None
        };
        let waited = since.elapsed();
        let mut l = lock(lease);
        if gave_back {
            l.permit = permit;
        }
        l.extend(waited, page.deadline);
    }
    charge
}

/// A child whose output is not fully written yet.
struct Child {
    rx: mpsc::UnboundedReceiver<Ev>,
    /// Its position, marked head when it reaches the head of the queue.
    pos: Arc<Position>,
    _task: AbortOnDrop,
    /// The include src (or `esi:try`), for logs.
    label: String,
    /// A failure leaves it out instead of failing the document
    /// (`onerror="continue"`, or [`OnIncludeError::Omit`] with nothing
    /// above to handle it).
    onerror_continue: bool,
    /// Where omissions are reported.
    page: Arc<Page>,
    /// Some of its data was written.
    forwarded: bool,
    /// It failed after data was written and `onerror="continue"` applies:
    /// ignore the rest of it.
    broken: bool,
}

impl Child {
    /// Apply a batch of events; returns the data to write and whether the
    /// child is complete.
    #[allow(clippy::type_complexity)]
    fn apply(
        &mut self,
        events: Vec<Ev>,
    ) -> Result<(Vec<(Bytes, Option<Charge>)>, bool), DriveError> {
        let mut data = Vec::new();
        if events.is_empty() {
            // The channel closed without End or Fail: the task died (a
            // panic), so alt cannot be tried; onerror="continue" still applies.
            if self.broken {
                return Ok((data, true));
            }
            if self.onerror_continue {
                self.omit(&FailureReason::TaskLost);
                return Ok((data, true));
            }
            return Err(DriveError::Include(Failed {
                src: self.label.clone(),
                reason: FailureReason::TaskLost,
            }));
        }
        for ev in events {
            if self.broken {
                if matches!(ev, Ev::End | Ev::Fail(_) | Ev::Omitted(_)) {
                    return Ok((data, true));
                }
                continue;
            }
            match ev {
                Ev::Data(b, c) => data.push((b, c)),
                Ev::Reset if !self.forwarded => data.clear(),
                Ev::Reset if self.onerror_continue => {
                    self.omit(&FailureReason::Truncated);
                    self.broken = true;
                }
                Ev::Reset => {
                    return Err(DriveError::Include(Failed {
                        src: self.label.clone(),
                        reason: FailureReason::Truncated,
                    }));
                }
                Ev::End => return Ok((data, true)),
                Ev::Omitted(f) => {
                    if !self.forwarded {
                        data.clear();
                    }
                    self.omit(&f.reason);
                    return Ok((data, true));
                }
                Ev::Fail(f) => return Err(DriveError::Include(f)),
            }
        }
        Ok((data, false))
    }

    /// Log and report that the child is left out (the rest of it, when part
    /// of it was written already).
    fn omit(&self, reason: &FailureReason) {
        if self.forwarded {
            warn!(src = %self.label, reason = %reason, "esi include failed after part of it was sent; rest of it left out");
        } else {
            warn!(src = %self.label, reason = %reason, "esi include failed; left out");
        }
        self.page.fetcher.omitted(&self.label, reason);
    }
}

enum Slot {
    Ready(Bytes),
    Child(Child),
}

impl Slot {
    fn ready_len(&self) -> usize {
        match self {
            Slot::Ready(b) => b.len(),
            Slot::Child(_) => 0,
        }
    }
}

/// What the document's time limit means when it expires.
#[derive(Debug, Clone, Copy)]
enum Expiry {
    Include(Duration),
    Page,
}

impl Expiry {
    fn reason(self) -> FailureReason {
        match self {
            Expiry::Include(d) => FailureReason::Timeout(d),
            Expiry::Page => FailureReason::PageDeadline,
        }
    }
}

/// Nodes to evaluate: parsed from a chunk just now, or parsed earlier and
/// shared (a cached template, attempt/except content).
enum Nodes {
    Owned(Vec<Node>),
    Shared(Arc<[Node]>),
}

impl std::ops::Deref for Nodes {
    type Target = [Node];

    fn deref(&self) -> &[Node] {
        match self {
            Nodes::Owned(v) => v,
            Nodes::Shared(a) => a,
        }
    }
}

/// Where a driver's nodes come from.
enum Source {
    /// Already parsed.
    Nodes(Option<Nodes>),
    /// A body to parse as it arrives.
    Stream {
        body: BoxStream<'static, Result<Bytes, BoxError>>,
        parser: Option<EsiParser>,
        /// The time limit, and the concurrency slot held while this
        /// fragment's body is read.
        lease: SharedLease,
    },
}

impl Source {
    /// Stop reading for want of budget: give back the concurrency slot
    /// (until [`Source::next`] reads again) and stop the clock.
    fn pause(&mut self) {
        if let Source::Stream { lease, parser, .. } = self
            && parser.is_some()
        {
            let mut l = lock(lease);
            if l.paused.is_none() {
                let gave_back = l.permit.take().is_some();
                l.paused = Some((Instant::now(), gave_back));
            }
        }
    }

    /// The next nodes; `None` at the end. Cancel-safe: the await points are
    /// taking back the concurrency slot after a pause and the body read.
    async fn next(&mut self, page: &Page) -> Result<Option<Nodes>, FailureReason> {
        if let Source::Stream { lease, .. } = self {
            let paused = lock(lease).paused;
            if let Some((since, gave_back)) = paused {
                let permit = if gave_back {
                    Arc::clone(&page.permits).acquire_owned().await.ok()
                } else {
                    None
                };
                let mut l = lock(lease);
                l.permit = permit;
                l.paused = None;
                l.extend(since.elapsed(), page.deadline);
            }
        }
        match self {
            Source::Nodes(n) => Ok(n.take()),
            Source::Stream {
                body,
                parser,
                lease,
            } => {
                let Some(p) = parser.as_mut() else {
                    return Ok(None);
                };
                let until = lock(lease).until;
                let r = timeout_at(until, body.next()).await;
                let mut lease = lock(lease);
                match r {
                    Ok(Some(Ok(chunk))) => Ok(Some(Nodes::Owned(p.feed_bytes(chunk)))),
                    Ok(None) => {
                        lease.permit = None;
                        Ok(parser.take().map(|p| Nodes::Owned(p.finish())))
                    }
                    Ok(Some(Err(e))) => {
                        lease.permit = None;
                        *parser = None;
                        Err(FailureReason::Body(e))
                    }
                    Err(_) => {
                        lease.permit = None;
                        *parser = None;
                        Err(lease.expiry.reason())
                    }
                }
            }
        }
    }
}

enum Step {
    Input(Result<Option<Nodes>, FailureReason>),
    Head(Vec<Ev>),
    /// The budget changed while the input was paused.
    Retry,
}

/// Wait for whichever comes first: new input nodes or events of the head slot.
async fn next_step(
    head: Option<&mut mpsc::UnboundedReceiver<Ev>>,
    source: &mut Source,
    input_open: bool,
    page: &Page,
    budget_changed: Option<Pin<&mut tokio::sync::futures::Notified<'_>>>,
) -> Step {
    let head_events = async move {
        let Some(rx) = head else {
            return std::future::pending().await;
        };
        let Some(first) = rx.recv().await else {
            return Vec::new();
        };
        // Take everything already queued so a reset can cancel data that
        // was never written.
        let mut evs = vec![first];
        while let Ok(e) = rx.try_recv() {
            evs.push(e);
        }
        evs
    };
    let input = async {
        if input_open {
            source.next(page).await
        } else {
            std::future::pending().await
        }
    };
    let changed = async move {
        match budget_changed {
            Some(n) => n.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = input => Step::Input(r),
        evs = head_events => Step::Head(evs),
        () = changed => Step::Retry,
    }
}

/// Assemble one document into `out`. `handled`: a failure in this document
/// has a fallback above it (an enclosing `alt`, `onerror="continue"` or
/// `esi:attempt`), so [`OnIncludeError::Omit`] does not apply to its includes.
/// `pos`: where the document's output stands (its children are placed under it).
fn drive<'a>(
    mut source: Source,
    page: Arc<Page>,
    pos: Arc<Position>,
    depth: u32,
    handled: bool,
    out: &'a mut Out,
) -> BoxFuture<'a, Result<(), DriveError>> {
    Box::pin(async move {
        let mut slots: VecDeque<Slot> = VecDeque::new();
        let mut input_open = true;
        // Bytes of the ready slots, all behind a child once the head ones are written.
        let mut ready_bytes = 0usize;
        let is_page = matches!(out, Out::Page(_));
        // Below the page, the ready slots are charged to the budget of held
        // output (the page has MAX_PAGE_AHEAD).
        let mut held = page.budget.force(0);
        loop {
            while let Some(b) = take_ready(&mut slots) {
                let n = b.len();
                ready_bytes -= n;
                out.data(b).await?;
                if !is_page {
                    held.shrink(n);
                }
            }
            if !input_open && slots.is_empty() {
                return Ok(());
            }
            if let Some(Slot::Child(c)) = slots.front()
                && !c.pos.head.swap(true, Ordering::AcqRel)
            {
                // It may be at the front of the page now: wake it if it waits.
                page.budget.changed.notify_waiters();
            }
            // Text behind a pending include is held: the page reads at most
            // MAX_PAGE_AHEAD ahead; a fragment reads on only while the budget
            // has room, and gives back its concurrency slot while it does not
            // (the include ahead of it may need the slot).
            let budget_changed = page.budget.changed.notified();
            tokio::pin!(budget_changed);
            budget_changed.as_mut().enable();
            let read_input = input_open
                && if is_page {
                    ready_bytes < MAX_PAGE_AHEAD
                } else {
                    slots.is_empty() || page.budget.has_room()
                };
            let paused = input_open && !read_input && !is_page;
            if paused {
                source.pause();
            }
            let head = match slots.front_mut() {
                Some(Slot::Child(c)) => Some(&mut c.rx),
                _ => None,
            };
            let step = next_step(
                head,
                &mut source,
                read_input,
                &page,
                paused.then_some(budget_changed.as_mut()),
            )
            .await;
            match step {
                Step::Retry => {}
                Step::Input(Ok(Some(nodes))) => {
                    let before = slots.len();
                    eval_nodes(&nodes, &page, &pos, depth, handled, &mut slots);
                    let added = slots.range(before..).map(Slot::ready_len).sum::<usize>();
                    ready_bytes += added;
                    if !is_page {
                        held.grow(added);
                    }
                }
                Step::Input(Ok(None)) => input_open = false,
                Step::Input(Err(reason)) => return Err(DriveError::Source(reason)),
                Step::Head(events) => {
                    let Some(Slot::Child(child)) = slots.front_mut() else {
                        continue;
                    };
                    let (data, done) = child.apply(events)?;
                    if !data.is_empty() {
                        child.forwarded = true;
                    }
                    if done {
                        slots.pop_front();
                    }
                    for (b, charge) in data {
                        out.put(b, charge).await?;
                    }
                }
            }
        }
    })
}

/// The ready slots at the head of the queue, as one piece: consecutive small
/// pieces are copied together (one channel message and one body frame
/// instead of many), a large one goes alone.
fn take_ready(slots: &mut VecDeque<Slot>) -> Option<Bytes> {
    let Some(Slot::Ready(first)) = slots.front() else {
        return None;
    };
    let mut len = first.len();
    let mut n = 1;
    while let Some(Slot::Ready(b)) = slots.get(n) {
        if len + b.len() > COALESCE_BYTES {
            break;
        }
        len += b.len();
        n += 1;
    }
    let mut pieces = slots.drain(..n).filter_map(|s| match s {
        Slot::Ready(b) => Some(b),
        Slot::Child(_) => None,
    });
    if n == 1 {
        return pieces.next();
    }
    let mut joined = BytesMut::with_capacity(len);
    pieces.for_each(|b| joined.extend_from_slice(&b));
    Some(joined.freeze())
}

/// Turn parsed nodes into slots: text is ready, includes and try blocks
/// start their tasks now, choose picks its branch now.
fn eval_nodes(
    nodes: &[Node],
    page: &Arc<Page>,
    pos: &Arc<Position>,
    depth: u32,
    handled: bool,
    slots: &mut VecDeque<Slot>,
) {
    let omit = page.limits.on_include_error == OnIncludeError::Omit && !handled;
    for node in nodes {
        match node {
            Node::Text(b) => {
                if !b.is_empty() {
                    slots.push_back(Slot::Ready(b.clone()));
                }
            }
            Node::Vars(t) => {
                let b = t.render(&page.vars);
                if !b.is_empty() {
                    slots.push_back(Slot::Ready(b));
                }
            }
            Node::Include(inc) => {
                let src = inc.src.render_string(&page.vars);
                if depth + 1 > page.limits.max_depth {
                    // Too deep: left out whatever the mode, as Varnish does.
                    let reason = FailureReason::DepthExceeded(page.limits.max_depth);
                    warn!(src = %src, reason = %reason, "esi include failed; left out");
                    page.fetcher.omitted(&src, &reason);
                    continue;
                }
                let first = match start_include(&src, page) {
                    Ok(body) => {
                        debug!(src = %src, depth = depth + 1, "esi include served in place");
                        if !body.is_empty() {
                            slots.push_back(Slot::Ready(body));
                        }
                        continue;
                    }
                    Err(first) => first,
                };
                let job = IncludeJob {
                    src: src.clone(),
                    alt: inc.alt.as_ref().map(|a| a.render_string(&page.vars)),
                    onerror_continue: inc.onerror_continue || omit,
                    src_handled: handled || inc.alt.is_some() || inc.onerror_continue,
                    alt_handled: handled || inc.onerror_continue,
                };
                let (tx, rx) = mpsc::unbounded_channel();
                debug!(src = %src, depth = depth + 1, "esi include seen");
                let child_pos = Position::child(pos);
                let out = Out::slot(tx, Arc::clone(&child_pos), Arc::clone(page));
                let task = tokio::spawn(include_task(job, first, Arc::clone(page), depth + 1, out));
                slots.push_back(Slot::Child(Child {
                    rx,
                    pos: child_pos,
                    _task: AbortOnDrop(task),
                    label: src,
                    onerror_continue: inc.onerror_continue || omit,
                    page: Arc::clone(page),
                    forwarded: false,
                    broken: false,
                }));
            }
            Node::Choose(c) => {
                eval_nodes(
                    c.selected_body(&page.vars),
                    page,
                    pos,
                    depth,
                    handled,
                    slots,
                );
            }
            Node::Try(t) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let child_pos = Position::child(pos);
                let out = Out::slot(tx, Arc::clone(&child_pos), Arc::clone(page));
                let task = tokio::spawn(try_task(
                    t.clone(),
                    Arc::clone(page),
                    depth,
                    handled,
                    omit,
                    out,
                ));
                slots.push_back(Slot::Child(Child {
                    rx,
                    pos: child_pos,
                    _task: AbortOnDrop(task),
                    label: "esi:try".to_owned(),
                    onerror_continue: omit,
                    page: Arc::clone(page),
                    forwarded: false,
                    broken: false,
                }));
            }
        }
    }
}

/// Asks the fetcher for an include as soon as its tag is parsed. `Ok`: the
/// body was at hand and the page's limits allow it (it counts against the
/// include budget like a fetched one). `Err`: what [`include_task`] starts
/// from (`None` when a limit already stops the include there).
fn start_include(src: &str, page: &Page) -> Result<Bytes, Option<Fetch>> {
    if Instant::now() >= page.deadline {
        return Err(None);
    }
    match page.fetcher.fetch(src) {
        Fetch::Ready(body)
            if page.includes.fetch_add(1, Ordering::Relaxed) < page.limits.max_includes =>
        {
            Ok(body)
        }
        other => Err(Some(other)),
    }
}

/// One include, as [`include_task`] serves it.
struct IncludeJob {
    src: String,
    alt: Option<String>,
    /// A failure of both src and alt leaves the include out.
    onerror_continue: bool,
    /// Whether a failure inside the src fragment has a fallback here or above.
    src_handled: bool,
    /// The same for the alt fragment.
    alt_handled: bool,
}

/// Serve one include into its slot: src, else alt, else continue or fail.
async fn include_task(
    job: IncludeJob,
    first_fetch: Option<Fetch>,
    page: Arc<Page>,
    depth: u32,
    mut out: Out,
) {
    let IncludeJob {
        src,
        alt,
        onerror_continue,
        src_handled,
        alt_handled,
    } = job;
    let Out::Slot { tx, .. } = &out else {
        return;
    };
    let tx = tx.clone();
    let first = match serve(&src, first_fetch, &page, depth, src_handled, &mut out).await {
        Ok(()) => {
            let _ = tx.send(Ev::End);
            return;
        }
        Err(DriveError::Closed) => return,
        Err(e) => failure_reason(e),
    };
    warn!(src = %src, reason = %first, "esi include failed");
    if let Some(alt) = alt {
        if out.take_sent() {
            let _ = tx.send(Ev::Reset);
        }
        match serve(&alt, None, &page, depth, alt_handled, &mut out).await {
            Ok(()) => {
                let _ = tx.send(Ev::End);
                return;
            }
            Err(DriveError::Closed) => return,
            Err(e) => {
                warn!(src = %alt, reason = %failure_reason(e), "esi include alt failed");
            }
        }
    }
    let failed = Failed { src, reason: first };
    let _ = tx.send(if onerror_continue {
        Ev::Omitted(failed)
    } else {
        Ev::Fail(failed)
    });
}

fn failure_reason(e: DriveError) -> FailureReason {
    match e {
        DriveError::Source(r) => r,
        DriveError::Include(f) => FailureReason::Nested {
            src: f.src,
            reason: Box::new(f.reason),
        },
        // Callers handle Closed before; keep a reason anyway.
        DriveError::Closed => FailureReason::TaskLost,
    }
}

/// Fetch one source (or await `fetch`, already asked for it) and write its
/// (possibly assembled) body to `out`.
async fn serve(
    src: &str,
    fetch: Option<Fetch>,
    page: &Arc<Page>,
    depth: u32,
    handled: bool,
    out: &mut Out,
) -> Result<(), DriveError> {
    let fail = |r| Err(DriveError::Source(r));
    if depth > page.limits.max_depth {
        return fail(FailureReason::DepthExceeded(page.limits.max_depth));
    }
    if page.includes.fetch_add(1, Ordering::Relaxed) >= page.limits.max_includes {
        return fail(FailureReason::TooManyIncludes(page.limits.max_includes));
    }
    if Instant::now() >= page.deadline {
        return fail(FailureReason::PageDeadline);
    }
    // A body at hand needs no concurrency slot.
    let pending = match fetch.unwrap_or_else(|| page.fetcher.fetch(src)) {
        Fetch::Ready(body) => return out.data(body).await,
        Fetch::Pending(f) => f,
    };
    let r = serve_pending(src, pending, page, depth, handled, out).await;
    if let Out::Slot { lease, .. } = out {
        *lease = None;
    }
    r
}

/// The part of [`serve`] that holds a concurrency slot.
async fn serve_pending(
    src: &str,
    pending: BoxFuture<'static, Result<Fragment, FragmentError>>,
    page: &Arc<Page>,
    depth: u32,
    handled: bool,
    out: &mut Out,
) -> Result<(), DriveError> {
    let fail = |r| Err(DriveError::Source(r));
    let permit = match timeout_at(page.deadline, Arc::clone(&page.permits).acquire_owned()).await {
        Ok(Ok(p)) => p,
        Ok(Err(_)) => return fail(FailureReason::TaskLost),
        Err(_) => return fail(FailureReason::PageDeadline),
    };
    let started = Instant::now();
    let (until, expiry) = match started.checked_add(page.limits.include_timeout) {
        Some(t) if t < page.deadline => (t, Expiry::Include(page.limits.include_timeout)),
        _ => (page.deadline, Expiry::Page),
    };
    debug!(src, depth, "esi fragment fetch started");
    let frag = match timeout_at(until, pending).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return fail(FailureReason::Fetch(e)),
        Err(_) => return fail(expiry.reason()),
    };
    if !(200..300).contains(&frag.status) {
        return fail(FailureReason::Status(frag.status));
    }
    let lease = Lease::new(until, expiry, Some(permit));
    let pos = match out {
        Out::Slot { lease: l, pos, .. } => {
            *l = Some(Arc::clone(&lease));
            Arc::clone(pos)
        }
        // An attempt serves its includes through slots; keep a root anyway.
        _ => Position::root(),
    };
    if frag.esi {
        let source = Source::Stream {
            body: frag.body,
            parser: Some(EsiParser::new()),
            lease,
        };
        return drive(source, Arc::clone(page), pos, depth, handled, out).await;
    }
    let mut body = frag.body;
    loop {
        let until = lock(&lease).until;
        match timeout_at(until, body.next()).await {
            Ok(Some(Ok(b))) => out.data(b).await?,
            Ok(None) => break,
            Ok(Some(Err(e))) => return fail(FailureReason::Body(e)),
            Err(_) => return fail(lock(&lease).expiry.reason()),
        }
    }
    lock(&lease).permit = None;
    Ok(())
}

/// Run `esi:attempt` into a buffer; on any failure run `esi:except` instead.
/// `handled` is the try block's own (its attempt is always handled);
/// `omit`: a failure of `esi:except` leaves the block out.
async fn try_task(t: Try, page: Arc<Page>, depth: u32, handled: bool, omit: bool, mut out: Out) {
    let Out::Slot { tx, pos, .. } = &out else {
        return;
    };
    let (tx, pos) = (tx.clone(), Arc::clone(pos));
    // The attempt stands where its try block does: its head output is at
    // the front of the page when the try block is.
    let attempt_pos = Arc::new(Position {
        head: AtomicBool::new(true),
        parent: Some(Arc::clone(&pos)),
    });
    let mut buf = Out::Buffer {
        chunks: Vec::new(),
        len: 0,
        budget: Arc::clone(&page.budget),
        pos: Arc::clone(&attempt_pos),
    };
    let attempt = drive(
        Source::Nodes(Some(Nodes::Owned(t.attempt))),
        Arc::clone(&page),
        attempt_pos,
        depth,
        true,
        &mut buf,
    )
    .await;
    match attempt {
        Ok(()) => {
            if let Out::Buffer { chunks, .. } = buf {
                for (b, charge) in chunks {
                    if tx.send(Ev::Data(b, charge)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(Ev::End);
        }
        Err(DriveError::Closed) => {}
        Err(e) => {
            warn!(reason = %failure_reason(e), "esi:attempt failed; using esi:except");
            drop(buf);
            let failed = match drive(
                Source::Nodes(Some(Nodes::Owned(t.except))),
                page,
                pos,
                depth,
                handled,
                &mut out,
            )
            .await
            {
                Ok(()) => {
                    let _ = tx.send(Ev::End);
                    return;
                }
                Err(DriveError::Closed) => return,
                Err(DriveError::Include(f)) => f,
                Err(DriveError::Source(reason)) => Failed {
                    src: "esi:except".to_owned(),
                    reason,
                },
            };
            let _ = tx.send(if omit {
                Ev::Omitted(failed)
            } else {
                Ev::Fail(failed)
            });
        }
    }
}

/// The assembled page.
struct Assembled {
    rx: mpsc::Receiver<Result<Bytes, EsiError>>,
    _driver: AbortOnDrop,
}

impl Stream for Assembled {
    type Item = Result<Bytes, EsiError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx)
    }
}

/// Assemble an ESI page.
///
/// Text before the first include is yielded at once; every include's fetch
/// starts (in its own task, at most `max_concurrency` at a time per page) as
/// soon as its tag is parsed; ESI fragments are assembled recursively and
/// eagerly; output is in document order, each piece as soon as it and
/// everything before it is ready. Failures (non-2xx, fetch error, timeout,
/// limits) fall back to `alt`, then `onerror="continue"`, then an enclosing
/// `esi:try`; otherwise the include is left out
/// ([`OnIncludeError::Omit`]) or, with [`OnIncludeError::Fail`], the stream
/// yields an [`EsiError`] after what was already sent and ends. Dropping the
/// stream cancels outstanding fetches.
///
/// Must be called within a tokio runtime.
pub fn assemble(
    input: BoxStream<'static, Result<Bytes, BoxError>>,
    vars: Arc<EsiVars>,
    fetcher: Arc<dyn FragmentFetcher>,
    limits: EsiLimits,
) -> BoxStream<'static, Result<Bytes, EsiError>> {
    start(PageInput::Stream(input), vars, fetcher, limits)
}

/// [`assemble`] a page parsed earlier (a cached template parsed once, see
/// [`super::ParsedTemplates`]): the same output as assembling its body.
///
/// Must be called within a tokio runtime.
pub fn assemble_parsed(
    nodes: Arc<[Node]>,
    vars: Arc<EsiVars>,
    fetcher: Arc<dyn FragmentFetcher>,
    limits: EsiLimits,
) -> BoxStream<'static, Result<Bytes, EsiError>> {
    start(PageInput::Parsed(nodes), vars, fetcher, limits)
}

enum PageInput {
    Stream(BoxStream<'static, Result<Bytes, BoxError>>),
    Parsed(Arc<[Node]>),
}

fn start(
    input: PageInput,
    vars: Arc<EsiVars>,
    fetcher: Arc<dyn FragmentFetcher>,
    limits: EsiLimits,
) -> BoxStream<'static, Result<Bytes, EsiError>> {
    start_page(input, vars, fetcher, limits).0
}

/// [`start`], also giving the page's budget (tests watch its peak).
fn start_page(
    input: PageInput,
    vars: Arc<EsiVars>,
    fetcher: Arc<dyn FragmentFetcher>,
    limits: EsiLimits,
) -> (BoxStream<'static, Result<Bytes, EsiError>>, Arc<Budget>) {
    let now = Instant::now();
    let deadline = now
        .checked_add(limits.page_deadline)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
    let permits = limits.max_concurrency.clamp(1, Semaphore::MAX_PERMITS);
    let budget = Arc::new(Budget::new(limits.max_buffered_bytes));
    let page = Arc::new(Page {
        budget: Arc::clone(&budget),
        front: Arc::new(Budget::new(limits.max_buffered_bytes)),
        vars,
        fetcher,
        permits: Arc::new(Semaphore::new(permits)),
        includes: AtomicUsize::new(0),
        deadline,
        limits,
    });
    let (tx, rx) = mpsc::channel(OUTPUT_BUFFER);
    let driver = tokio::spawn(page_task(input, page, tx));
    let out = Box::pin(Assembled {
        rx,
        _driver: AbortOnDrop(driver),
    });
    (out, budget)
}

async fn page_task(input: PageInput, page: Arc<Page>, tx: mpsc::Sender<Result<Bytes, EsiError>>) {
    let source = match input {
        PageInput::Stream(body) => Source::Stream {
            body,
            parser: Some(EsiParser::new()),
            lease: Lease::new(page.deadline, Expiry::Page, None),
        },
        PageInput::Parsed(nodes) => Source::Nodes(Some(Nodes::Shared(nodes))),
    };
    let mut out = Out::Page(tx.clone());
    let err = match drive(source, page, Position::root(), 0, false, &mut out).await {
        Ok(()) | Err(DriveError::Closed) => return,
        Err(DriveError::Source(FailureReason::Body(e))) => EsiError::Body(e),
        Err(DriveError::Source(_)) => EsiError::PageDeadline,
        Err(DriveError::Include(f)) => EsiError::Include {
            src: f.src,
            reason: f.reason,
        },
    };
    warn!(error = %err, "esi page ended early");
    let _ = tx.send(Err(err)).await;
}

#[cfg(test)]
mod tests;

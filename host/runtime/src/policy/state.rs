//! One request's store data: the heads lent to the guest, the services, the
//! caps and their counters. Every interface's `Host` trait is implemented on it, one
//! file per interface.

use std::sync::Arc;

use inlay_core::EsiOverrides;
use inlay_core::{RequestHead, ResponseHead};

use super::{PolicyHandle, PolicyShared};
use crate::errors::{Hook, HostLimitTrap};
use crate::limits::LogQuota;
use crate::limits::{CpuClock, MemoryLimiter};
use crate::memo::{self, Recordable, Recorded, Reply, Tape};
use crate::services::{BodyBudget, PolicyServices};

/// The replay tree and its parts, over this store state.
pub(crate) type Cursor = memo::Cursor<StoreState>;
pub(crate) type Memo = memo::Memo<StoreState>;
pub(crate) type Recording = memo::Recording<StoreState>;
pub(crate) type Start = memo::Start<StoreState>;
pub(crate) type Step = memo::Step<StoreState>;

/// The `T` of `Store<T>` for one request.
pub(crate) struct StoreState {
    /// Request and response heads lent to the guest during a hook.
    pub(crate) heads: LentHeads,
    /// The policy (name, config, limits) and the host's cache, kv and
    /// fetcher.
    handle: Arc<PolicyHandle>,
    /// Memory cap.
    pub(crate) limiter: MemoryLimiter,
    /// CPU budget of the current hook.
    pub(crate) clock: CpuClock,
    /// The hook running now.
    pub(crate) hook: Hook,
    /// Host calls made so far in this request.
    host_calls: u32,
    /// Subrequests made so far in this request.
    subrequests: u32,
    /// What this request's subrequests may still buffer of their bodies.
    pub(crate) subrequest_bytes: BodyBudget,
    /// Log lines written so far in this request.
    pub(crate) log_lines: LogQuota,
    /// Set when a cap was reached (the trap that follows is a limit).
    pub(crate) limit_hit: Option<HostLimitTrap>,
    /// What the policy asked of ESI.
    pub(crate) esi: EsiOverrides,
    /// The hook's calls so far, while they are being recorded.
    pub(crate) recorder: Option<Recording>,
    /// Replies to give without making the calls again (catching up).
    pub(crate) tape: Tape,
    /// Every reply the guest of the current instance got, to bring a new
    /// instance to the same point after this one is released.
    pub(crate) journal: Journal,
    /// When the current hook's waits on the host's I/O must have ended.
    wait_deadline: tokio::time::Instant,
}

/// The heads a hook is lent: the guest holds borrows of them, by the reps
/// [`REQUEST_REP`] and [`RESPONSE_REP`]. (Two slots rather than wasmtime's
/// `ResourceTable`, which boxes each entry: three allocations and as many
/// downcasts per request for the only two resources there are.)
#[derive(Default)]
pub(crate) struct LentHeads {
    pub(crate) req: Option<RequestHead>,
    pub(crate) resp: Option<ResponseHead>,
}

/// The rep of the request head a hook is lent.
pub(crate) const REQUEST_REP: u32 = 1;
/// The rep of the response head a hook is lent.
pub(crate) const RESPONSE_REP: u32 = 2;

/// The error of a guest call on a head not lent to it (a stale handle): a
/// trap.
fn not_lent(what: &str, rep: u32) -> wasmtime::Error {
    wasmtime::format_err!("invalid {what} handle {rep}: not lent to this hook")
}

/// The replies an instance got, in order (from the tape or live): with
/// the hooks it ran, enough to bring a fresh instance to the same point
/// (see `PolicyCall::release`).
#[derive(Default)]
pub(crate) struct Journal {
    replies: Vec<(&'static str, Reply)>,
    bytes: usize,
    /// Set when the replies cannot stand in for the instance: the guest
    /// made a call whose reply depends on the world (clock, kv, cache,
    /// fetch), or the journal outgrew [`JOURNAL_MAX_BYTES`]. The instance
    /// is then kept until the request ends.
    pub(crate) incomplete: bool,
}

/// The most a request's journal holds; a policy that reads more than this
/// keeps its instance instead.
pub(crate) const JOURNAL_MAX_BYTES: usize = 1 << 20;

impl Journal {
    fn push(&mut self, name: &'static str, reply: Reply) {
        if self.incomplete {
            return;
        }
        self.bytes += memo::reply_bytes(&reply) + 32;
        if self.bytes > JOURNAL_MAX_BYTES {
            self.give_up();
            return;
        }
        self.replies.push((name, reply));
    }

    fn give_up(&mut self) {
        self.incomplete = true;
        self.replies = Vec::new();
    }

    /// How many replies it holds.
    pub(crate) fn len(&self) -> usize {
        self.replies.len()
    }

    /// The replies, to answer a new instance's calls from a tape; the
    /// journal starts over (the tape's answers are journaled again).
    pub(crate) fn take(&mut self) -> Vec<(&'static str, Reply)> {
        self.bytes = 0;
        std::mem::take(&mut self.replies)
    }
}

impl StoreState {
    pub(crate) fn new(handle: Arc<PolicyHandle>, tick: std::time::Duration) -> Self {
        let limits = &handle.policy().shared().limits;
        Self {
            heads: LentHeads::default(),
            limiter: MemoryLimiter::new(limits.memory),
            clock: CpuClock::new(limits.cpu_time(), tick),
            hook: Hook::Instantiate,
            host_calls: 0,
            subrequests: 0,
            subrequest_bytes: BodyBudget::new(limits.max_subrequest_bytes),
            log_lines: LogQuota::new(limits.log_max_lines),
            limit_hit: None,
            esi: EsiOverrides::default(),
            recorder: None,
            tape: Tape::default(),
            journal: Journal::default(),
            // Set when guest code starts (`begin_guest_call`).
            wait_deadline: tokio::time::Instant::from_std(crate::limits::clock_origin()),
            handle,
        }
    }

    /// Guest code is about to run (a hook, or instantiation): it gets a
    /// whole CPU budget and its whole `host_wait` for I/O, from one reading
    /// of the clock. Returns the first epoch deadline, in ticks.
    pub(crate) fn begin_guest_call(&mut self) -> u64 {
        let now = std::time::Instant::now();
        self.wait_deadline = wait_deadline(
            tokio::time::Instant::from_std(now),
            self.policy().limits.host_wait(),
        );
        self.clock.restart(now)
    }

    /// `future`, ending at the hook's I/O deadline with `None` if it is
    /// still waiting then.
    pub(crate) fn bounded<F: std::future::Future>(
        &self,
        future: F,
    ) -> impl std::future::Future<Output = Option<F::Output>> + use<F> {
        let deadline = self.wait_deadline;
        async move { tokio::time::timeout_at(deadline, future).await.ok() }
    }

    /// The policy generation and services this request runs with.
    pub(crate) fn handle(&self) -> &Arc<PolicyHandle> {
        &self.handle
    }

    /// The host's cache, kv and fetcher.
    pub(crate) fn services(&self) -> &dyn PolicyServices {
        self.handle.services()
    }

    /// The policy's name, config and limits.
    pub(crate) fn policy(&self) -> &PolicyShared {
        self.handle.policy().shared()
    }

    /// Makes a repeatable host call: `call` must depend only on its
    /// captured arguments and on this state, so that it can be recorded
    /// and made again on another request (see `runtime::memo`). While an
    /// instance catches up, the reply comes from the tape instead.
    pub(crate) fn call<R, F>(&mut self, name: &'static str, call: F) -> wasmtime::Result<R>
    where
        R: Recordable,
        F: Fn(&mut StoreState) -> wasmtime::Result<R> + Send + Sync + 'static,
    {
        if let Some(answer) = self.tape.answer(name) {
            let result = answer
                .ok()
                .and_then(|reply| Some((R::from_reply(reply.clone())?, reply)));
            let Some((result, reply)) = result else {
                return Err(wasmtime::format_err!("{}", not_repeated(name)));
            };
            self.journal.push(name, reply);
            return Ok(result);
        }
        let _span = self.hostcall(name)?;
        let result = call(self)?;
        if !self.journal.incomplete {
            self.journal.push(name, result.clone().into_reply());
        }
        if let Some(recording) = self.recorder.as_mut().filter(|r| !r.opaque) {
            recording.calls.push(Recorded {
                name,
                reply: result.clone().into_reply(),
                op: std::sync::Arc::new(move |state| call(state).map(R::into_reply)),
            });
        }
        Ok(result)
    }

    /// Counts a host call whose reply depends on the world (clock, kv,
    /// cache, fetch): the path recorded so far ends here. `false` once the
    /// cap is reached, or when an instance that is catching up makes it
    /// (it should have made a recorded call).
    pub(crate) fn count_unrepeatable(&mut self) -> bool {
        if !self.tape.is_empty() {
            self.tape.broken = true;
            return false;
        }
        if let Some(recording) = self.recorder.as_mut() {
            recording.opaque = true;
        }
        self.journal.give_up();
        self.count_call()
    }

    /// The request head lent as `rep`.
    pub(crate) fn request(&mut self, rep: u32) -> wasmtime::Result<&mut RequestHead> {
        match (rep, self.heads.req.as_mut()) {
            (REQUEST_REP, Some(req)) => Ok(req),
            _ => Err(not_lent("request", rep)),
        }
    }

    /// The response head lent as `rep`.
    pub(crate) fn response(&mut self, rep: u32) -> wasmtime::Result<&mut ResponseHead> {
        match (rep, self.heads.resp.as_mut()) {
            (RESPONSE_REP, Some(resp)) => Ok(resp),
            _ => Err(not_lent("response", rep)),
        }
    }

    /// Counts a host call; `false` once the cap is reached. Calls made in
    /// replay count as the guest's own would.
    pub(crate) fn count_call(&mut self) -> bool {
        let limit = self.policy().limits.max_host_calls;
        if self.host_calls >= limit {
            self.limit_hit.get_or_insert(HostLimitTrap {
                what: "host calls",
                limit,
            });
            return false;
        }
        self.host_calls += 1;
        true
    }

    /// Gives back a call counted in replay that the instance taking over
    /// makes (and counts) again.
    pub(crate) fn uncount_call(&mut self) {
        self.host_calls = self.host_calls.saturating_sub(1);
    }

    /// Counts a host call for a function without an error variant: over the
    /// cap the guest traps. Returns the call's tracing span, entered.
    pub(crate) fn hostcall(
        &mut self,
        name: &'static str,
    ) -> wasmtime::Result<tracing::span::EnteredSpan> {
        if !self.count_call() {
            return Err(wasmtime::Error::new(HostLimitTrap {
                what: "host calls",
                limit: self.policy().limits.max_host_calls,
            }));
        }
        Ok(tracing::debug_span!("hostcall", call = name).entered())
    }

    /// Takes up to `wanted` subrequests from the cap; returns how many may go.
    pub(crate) fn take_subrequests(&mut self, wanted: usize) -> usize {
        let limit = self.policy().limits.max_subrequests;
        let left = usize::try_from(limit.saturating_sub(self.subrequests)).unwrap_or(usize::MAX);
        let granted = wanted.min(left);
        // `granted <= left <= u32::MAX`, so this cannot saturate.
        self.subrequests = self
            .subrequests
            .saturating_add(u32::try_from(granted).unwrap_or(u32::MAX));
        if granted < wanted {
            self.limit_hit.get_or_insert(HostLimitTrap {
                what: "subrequests",
                limit,
            });
        }
        granted
    }

    /// The header fields of the request being handled (none between hooks).
    pub(crate) fn current_headers(&self) -> http::HeaderMap {
        self.heads
            .req
            .as_ref()
            .map(|r| r.headers.clone())
            .unwrap_or_default()
    }

    /// The backend of the request being handled, for subrequests without one.
    pub(crate) fn default_backend(&self) -> String {
        self.heads
            .req
            .as_ref()
            .map(|r| r.backend.clone())
            .unwrap_or_default()
    }
}

/// `wait` from `now` (a day from then if that overflows).
fn wait_deadline(now: tokio::time::Instant, wait: std::time::Duration) -> tokio::time::Instant {
    now.checked_add(wait)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(86_400))
}

/// The error of an instance that, brought to where an earlier request's
/// policy was, made a different call than it did.
pub(crate) fn not_repeated(name: &str) -> String {
    format!(
        "the policy did not repeat its recorded calls (at {name}); it must not depend on anything but the host's replies"
    )
}

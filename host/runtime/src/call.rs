//! One request's policy: an instance and its three hooks, called in the
//! order a request lives: `on-request`, `on-backend-response`,
//! `on-deliver`. With replay on, [`crate::replay`] answers hooks from
//! recorded paths first; a plain call never meets the memo. A hook the
//! policy does not implement (its SDK said so) is the built-in rules,
//! which the host runs itself, without an instance.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use inlay_core::{CacheSettings, EsiOverrides, RequestAction, RequestHead, ResponseHead};
use tracing::Instrument;

use crate::engine::EPOCH_TICK;
use crate::errors::{Hook, PolicyError};
use crate::limits::MemoryLimiter;
use crate::memo::{Chosen, Entries, Entry, Returned, Tape, Way};
use crate::policy::instance::{Lent, LiveCall, lend, take_back};
use crate::policy::state::{StoreState, not_repeated};
use crate::policy::{LoadedPolicy, PolicyHandle};
use crate::replay::Replay;
use crate::services::PolicyServices;

/// How a request's hooks are answered.
enum Run {
    /// By the request's own instance.
    Live(Box<LiveCall>),
    /// From the policy's recorded paths, then by an instance.
    Replayed(Box<Replay>),
    /// No instance now: none was needed yet (the policy does not
    /// implement `on-request`), or it was released while the request waits
    /// (see [`PolicyCall::release`]). The state, with the journal of the
    /// replies its instance got, brings the next one to the same point.
    NoInstance(Box<StoreState>),
    /// Between two of the above while an instance is being created; a
    /// request whose hook was cancelled then stays here.
    Gone,
}

/// One request's policy, called in the order a request lives:
/// `on-request`, `on-backend-response`, `on-deliver`.
///
/// A plain call is an instance and its hooks: a fresh one, or when the
/// policy reuses instances, the one this worker thread's previous request
/// finished with. With replay, while the request follows a path an
/// earlier request of the same policy generation recorded, its hooks are
/// answered from that path without an instance (see `memo`); from the
/// first hook that leaves the recorded paths on, it has an instance of its
/// own, brought to the same point first. A hook the policy does not
/// implement runs the built-in rules in the host. After a hook fails, the
/// request is unusable and later hooks return
/// [`PolicyError::AlreadyFailed`]. Dropping it gives its instance, if it
/// had one, back: kept for the thread's next request when the policy
/// reuses instances and nothing went wrong in it, otherwise its slot
/// returns to the pool; [`PolicyCall::release`] does the same while the
/// request waits, and the next hook catches an instance up.
pub struct PolicyCall {
    handle: Arc<PolicyHandle>,
    run: Run,
    failed: bool,
    /// The hooks that returned so far, to call again in a new instance
    /// after a release.
    entries: Entries,
    /// Whether a hook of this request ran in an instance.
    ran_guest: bool,
    /// The way the memo chose for this request (see `Memo::start`).
    chosen: Option<Chosen>,
    /// When the request is measured for that choice: the time spent so far
    /// in starting it and in its hooks.
    spent: Duration,
}

impl std::fmt::Debug for PolicyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyCall")
            .field("policy", self.handle.policy())
            .field("live", &self.is_live())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl PolicyCall {
    /// A request's policy; with `replay`, hooks may be answered from the
    /// policy's recorded paths, otherwise the instance is created now.
    pub(crate) async fn start(
        handle: Arc<PolicyHandle>,
        replay: bool,
    ) -> Result<Self, PolicyError> {
        let policy = handle.policy();
        let (recorded, chosen) = match policy.memo() {
            Some(memo) if replay => memo.start(),
            _ => (None, None),
        };
        let clock = chosen.is_some_and(|c| c.measured).then(Instant::now);
        let state = StoreState::new(Arc::clone(&handle), EPOCH_TICK);
        policy.counts().requests.fetch_add(1, Ordering::Relaxed);
        let run = match recorded {
            Some(start) => Run::Replayed(Box::new(Replay::new(state, start))),
            // The first hook the policy implements gets the instance.
            None if policy.runs_builtin(Hook::OnRequest) => Run::NoInstance(Box::new(state)),
            None => Run::Live(LiveCall::start(state).await.map_err(|(e, _)| e)?),
        };
        Ok(Self {
            handle,
            run,
            failed: false,
            entries: Entries::new(),
            ran_guest: false,
            chosen,
            spent: clock.map_or(Duration::ZERO, |c| c.elapsed()),
        })
    }

    fn state_mut(&mut self) -> Option<&mut StoreState> {
        match &mut self.run {
            Run::Live(live) => Some(live.state_mut()),
            Run::Replayed(replay) => replay.state_mut(),
            Run::NoInstance(state) => Some(state),
            Run::Gone => None,
        }
    }

    /// Gives the request's instance back before the request
    /// waits (on the backend, on another request's fill), so that waiting
    /// requests do not hold the pool: to the pool, or when the policy
    /// reuses instances, to the worker thread for its next request. The
    /// next hook gets an instance (a new one, or one kept for reuse) and
    /// first calls the hooks that already returned in it again, with
    /// every host call answered from the journal of the replies the first
    /// instance got (nothing is done twice): the guest's globals are
    /// rebuilt, not copied, which is sound for any language because a
    /// policy sees nothing but the host's replies (the assumption replay
    /// rests on too).
    ///
    /// Returns whether an instance was released. It is kept when there is
    /// none (replayed so far, or already released), after a failed hook,
    /// and when the guest made a call whose reply the host cannot give
    /// again (clock, kv, cache, fetch) or read more than the journal holds.
    pub fn release(&mut self) -> bool {
        if self.failed {
            return false;
        }
        let live = match std::mem::replace(&mut self.run, Run::Gone) {
            Run::Live(live) if !live.state().journal.incomplete => live,
            Run::Replayed(mut replay) => {
                let released = replay.release();
                self.run = Run::Replayed(replay);
                if released {
                    tracing::debug!(policy = %self.handle.policy().name(), "policy instance released while the request waits");
                }
                return released;
            }
            other => {
                self.run = other;
                return false;
            }
        };
        tracing::debug!(policy = %self.handle.policy().name(), "policy instance released while the request waits");
        self.run = Run::NoInstance(Box::new(self.handle.give_back(live)));
        true
    }

    /// Brings a new instance to where the released one was: the hooks
    /// that returned are called again, their host calls answered from
    /// the journal.
    async fn resume(&mut self, lent: Lent) -> Result<(), PolicyError> {
        let mut state = match std::mem::replace(&mut self.run, Run::Gone) {
            Run::NoInstance(state) => state,
            other => {
                self.run = other;
                return Ok(());
            }
        };
        let replies = state.journal.take();
        let expected = replies.len();
        state.tape = Tape::new(replies);
        // A new store: its memory is counted from nothing again.
        state.limiter = MemoryLimiter::new(state.policy().limits.memory);
        let mut live = match LiveCall::start(*state).await {
            Ok(live) => live,
            Err((error, state)) => {
                // The heads are in the state: keep it to give
                // them back.
                self.run = Run::NoInstance(state);
                return Err(error);
            }
        };
        let mut caught_up = Ok(());
        for past in &self.entries {
            if let Err(e) = live.call_hook(past, lent).await {
                caught_up = Err(e);
                break;
            }
        }
        let state = live.state();
        let repeated =
            !state.tape.broken && state.tape.is_empty() && state.journal.len() == expected;
        self.run = Run::Live(live);
        let hook = self.entries.last().map_or(Hook::Instantiate, |e| e.hook);
        match caught_up {
            // Cut short by a limit (a busy machine): not a different policy.
            Err(e) if e.is_limit() => Err(e),
            Err(e) => Err(PolicyError::Trap {
                hook: e.hook().unwrap_or(hook),
                message: format!("{} (an earlier hook failed: {e})", not_repeated("catch-up")),
            }),
            Ok(()) if !repeated => Err(PolicyError::Trap {
                hook,
                message: not_repeated("catch-up"),
            }),
            Ok(()) => Ok(()),
        }
    }

    /// Runs one hook with the heads lent to it and takes them back.
    async fn hook(
        &mut self,
        entry: Entry,
        req: &mut RequestHead,
        mut resp: Option<&mut ResponseHead>,
    ) -> Result<Returned, PolicyError> {
        let hook = entry.hook;
        if self.failed {
            return Err(PolicyError::AlreadyFailed { hook });
        }
        if self.handle.policy().runs_builtin(hook) {
            return Ok(builtin(entry, req));
        }
        // Failed until the hook returns: a cancelled call leaves the
        // request unusable.
        self.failed = true;
        let state = self
            .state_mut()
            .ok_or(PolicyError::AlreadyFailed { hook })?;
        let lent = lend(state, req, resp.as_deref_mut());
        // Boxed: only a released request resumes, and the instantiation in
        // it would make every hook's future kilobytes bigger.
        let resumed = match self.run {
            Run::NoInstance(_) => Box::pin(self.resume(lent)).await,
            _ => Ok(()),
        };
        let result = match (resumed, &mut self.run) {
            (Err(e), _) => Err(e),
            (Ok(()), Run::Live(live)) => {
                // A request that runs live by choice counts its hooks as
                // the memo's live ones, as a replayed request's are.
                if let (Some(c), Some(memo)) = (&self.chosen, self.handle.policy().memo())
                    && c.way == Way::Live
                {
                    memo.count_live(c.shard);
                }
                live.call_hook(&entry, lent).await
            }
            (Ok(()), Run::Replayed(replay)) => match self.handle.policy().memo() {
                Some(memo) => replay.hook(memo, &entry, lent).await,
                None => Err(PolicyError::AlreadyFailed { hook }),
            },
            (Ok(()), Run::NoInstance(_) | Run::Gone) => Err(PolicyError::AlreadyFailed { hook }),
        };
        if let Some(state) = self.state_mut() {
            take_back(state, lent, req, resp);
        }
        if result.is_ok() {
            self.failed = false;
            self.ran_guest |= self.is_live();
            self.entries.push(entry);
        }
        result
    }

    /// [`PolicyCall::hook`] in `span`; a disabled span (debug logging off)
    /// is not attached, which would move the hook's future once more.
    async fn hook_in(
        &mut self,
        span: tracing::Span,
        entry: Entry,
        req: &mut RequestHead,
        resp: Option<&mut ResponseHead>,
    ) -> Result<Returned, PolicyError> {
        let clock = self.chosen.is_some_and(|c| c.measured).then(Instant::now);
        let result = if span.is_disabled() {
            self.hook(entry, req, resp).await
        } else {
            self.hook(entry, req, resp).instrument(span).await
        };
        if let Some(clock) = clock {
            self.spent += clock.elapsed();
        }
        result
    }

    /// recv: lets the policy inspect and rewrite `req` and decide what to
    /// do with it. `req` is moved into the instance for the call and back.
    pub async fn on_request(
        &mut self,
        req: &mut RequestHead,
    ) -> Result<RequestAction, PolicyError> {
        let span = tracing::debug_span!("policy.on_request", policy = %self.handle.policy().name());
        let entry = Entry {
            hook: Hook::OnRequest,
            settings: None,
        };
        match self.hook_in(span, entry, req, None).await? {
            Returned::Action(action) => Ok(action),
            _ => Err(wrong_result(Hook::OnRequest)),
        }
    }

    /// The backend answered: the policy may edit `resp` (status and
    /// headers) and returns how to cache it, starting from `defaults`.
    pub async fn on_backend_response(
        &mut self,
        req: &mut RequestHead,
        resp: &mut ResponseHead,
        defaults: CacheSettings,
    ) -> Result<CacheSettings, PolicyError> {
        let span = tracing::debug_span!("policy.on_backend_response", policy = %self.handle.policy().name());
        let entry = Entry {
            hook: Hook::OnBackendResponse,
            settings: Some(Box::new(defaults)),
        };
        match self.hook_in(span, entry, req, Some(resp)).await? {
            Returned::Settings(settings) => Ok(settings),
            _ => Err(wrong_result(Hook::OnBackendResponse)),
        }
    }

    /// The response is about to go to the client: the policy may edit its
    /// status and headers.
    pub async fn on_deliver(
        &mut self,
        req: &mut RequestHead,
        resp: &mut ResponseHead,
    ) -> Result<(), PolicyError> {
        let span = tracing::debug_span!("policy.on_deliver", policy = %self.handle.policy().name());
        let entry = Entry {
            hook: Hook::OnDeliver,
            settings: None,
        };
        match self.hook_in(span, entry, req, Some(resp)).await? {
            Returned::Unit => Ok(()),
            _ => Err(wrong_result(Hook::OnDeliver)),
        }
    }

    /// The live instance, for the snapshot tool; `None` while replaying.
    pub(crate) fn live_mut(&mut self) -> Option<&mut LiveCall> {
        match &mut self.run {
            Run::Live(live) => Some(live),
            Run::Replayed(_) | Run::NoInstance(_) | Run::Gone => None,
        }
    }

    /// Whether this request has an instance of its own (it left the
    /// recorded paths, or replaying is off).
    pub fn is_live(&self) -> bool {
        match &self.run {
            Run::Live(_) => true,
            Run::Replayed(replay) => replay.is_live(),
            Run::NoInstance(_) | Run::Gone => false,
        }
    }

    /// What the policy asked of ESI so far in this request.
    pub fn esi_overrides(&self) -> &EsiOverrides {
        static NONE: EsiOverrides = EsiOverrides {
            enabled: None,
            vars: Vec::new(),
        };
        let state = match &self.run {
            Run::Live(live) => Some(live.state()),
            Run::Replayed(replay) => replay.state(),
            Run::NoInstance(state) => Some(&**state),
            Run::Gone => None,
        };
        state.map_or(&NONE, |s| &s.esi)
    }

    /// The policy this request runs.
    pub fn policy(&self) -> &LoadedPolicy {
        self.handle.policy()
    }
}

impl Drop for PolicyCall {
    fn drop(&mut self) {
        if self.ran_guest {
            let counts = self.handle.policy().counts();
            counts.ran_guest.fetch_add(1, Ordering::Relaxed);
        }
        // After a failed or cancelled hook the instance goes with `run`.
        if self.failed {
            return;
        }
        if let (Some(chosen), Some(memo)) = (self.chosen, self.handle.policy().memo())
            && chosen.measured
        {
            memo.spent(
                chosen,
                u64::try_from(self.spent.as_nanos()).unwrap_or(u64::MAX),
            );
        }
        let live = match std::mem::replace(&mut self.run, Run::Gone) {
            Run::Live(live) => Some(live),
            Run::Replayed(mut replay) => replay.take_live(),
            Run::NoInstance(_) | Run::Gone => None,
        };
        if let Some(live) = live {
            drop(self.handle.give_back(live));
        }
    }
}

/// What a hook the policy does not implement returns: the built-in rules
/// the SDKs' defaults follow (Varnish's built-in VCL).
fn builtin(entry: Entry, req: &RequestHead) -> Returned {
    match entry.hook {
        Hook::OnRequest => Returned::Action(builtin_recv(req)),
        Hook::OnBackendResponse => {
            Returned::Settings(entry.settings.map(|s| *s).unwrap_or_default())
        }
        Hook::OnDeliver | Hook::Instantiate => Returned::Unit,
    }
}

/// Built-in recv (the SDKs' `builtin.recv` and the host's own rules
/// without a policy say the same).
fn builtin_recv(req: &RequestHead) -> RequestAction {
    if req.builtin_lookup() {
        RequestAction::Lookup
    } else {
        RequestAction::Pass
    }
}

/// A recorded path whose hook result is of another hook's type: the tree
/// is keyed by hook, so only a bug could do this.
fn wrong_result(hook: Hook) -> PolicyError {
    PolicyError::InvalidResult {
        hook,
        message: "the recorded result is not this hook's".to_string(),
    }
}

impl LoadedPolicy {
    /// Creates one request's instance: a fresh store from the pool, with
    /// its limits, instantiated from the pre-instantiated component.
    pub async fn start(
        &self,
        services: Arc<dyn PolicyServices>,
    ) -> Result<PolicyCall, PolicyError> {
        PolicyHandle::new(self.clone(), services).start().await
    }

    /// Starts a request that runs its own instance from the first hook,
    /// without the recorded paths (for the snapshot tool and tests).
    pub(crate) async fn start_live(
        &self,
        services: Arc<dyn PolicyServices>,
    ) -> Result<PolicyCall, PolicyError> {
        PolicyCall::start(PolicyHandle::new(self.clone(), services), false).await
    }
}

impl PolicyHandle {
    /// Starts one request: hooks may be answered from the policy's
    /// recorded paths; the instance is created when one is needed.
    pub async fn start(self: &Arc<Self>) -> Result<PolicyCall, PolicyError> {
        PolicyCall::start(Arc::clone(self), true).await
    }
}

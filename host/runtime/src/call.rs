//! One request's policy: an instance and its three hooks, called in the
//! order a request lives: `on-request`, `on-backend-response`,
//! `on-deliver`. With replay on, [`crate::replay`] answers hooks from
//! recorded paths first; a plain call never meets the memo.

use std::sync::Arc;

use inlay_core::{CacheSettings, EsiOverrides, RequestAction, RequestHead, ResponseHead};
use tracing::Instrument;

use crate::engine::EPOCH_TICK;
use crate::errors::{Hook, PolicyError};
use crate::instance::{Lent, LiveCall, lend, take_back};
use crate::limits::MemoryLimiter;
use crate::memo::{Entry, Returned, Tape};
use crate::policy::{LoadedPolicy, PolicyHandle};
use crate::replay::Replay;
use crate::state::{StoreState, not_repeated};

/// How a request's hooks are answered.
enum Run {
    /// By the request's own instance.
    Live(Box<LiveCall>),
    /// From the policy's recorded paths, then by an instance.
    Replayed(Box<Replay>),
    /// The instance was released while the request waits (see
    /// [`PolicyCall::release`]): the state it left, with the journal of
    /// its replies, brings a new one to the same point.
    Released(Box<StoreState>),
    /// Between two of the above while an instance is being created; a
    /// request whose hook was cancelled then stays here.
    Gone,
}

/// One request's policy, called in the order a request lives:
/// `on-request`, `on-backend-response`, `on-deliver`.
///
/// A plain call is a fresh instance and its hooks. With replay, while the
/// request follows a path an earlier request of the same policy generation
/// recorded, its hooks are answered from that path without an instance
/// (see `memo`); from the first hook that leaves the recorded paths on, it
/// has a fresh instance of its own, brought to the same point first. After
/// a hook fails, the request is unusable and later hooks return
/// [`PolicyError::AlreadyFailed`]. Dropping it returns its instance's slot,
/// if it had one, to the pool; so does [`PolicyCall::release`] while the
/// request waits, and the next hook catches a new instance up.
pub struct PolicyCall {
    handle: Arc<PolicyHandle>,
    run: Run,
    failed: bool,
    /// The hooks that returned so far, to call again in a new instance
    /// after a release.
    entries: Vec<Entry>,
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
        let state = StoreState::new(Arc::clone(&handle), EPOCH_TICK);
        let recorded = replay
            .then(|| handle.policy().memo().and_then(|memo| memo.start()))
            .flatten();
        let run = match recorded {
            Some(start) => Run::Replayed(Box::new(Replay::new(state, start))),
            None => Run::Live(Box::new(LiveCall::start(state).await.map_err(|(e, _)| e)?)),
        };
        Ok(Self {
            handle,
            run,
            failed: false,
            entries: Vec::with_capacity(3),
        })
    }

    fn state_mut(&mut self) -> Option<&mut StoreState> {
        match &mut self.run {
            Run::Live(live) => Some(live.state_mut()),
            Run::Replayed(replay) => replay.state_mut(),
            Run::Released(state) => Some(state),
            Run::Gone => None,
        }
    }

    /// Gives the request's instance back to the pool before the request
    /// waits (on the backend, on another request's fill), so that waiting
    /// requests do not hold the pool. The next hook gets a new instance
    /// and first calls the hooks that already returned in it again, with
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
            Run::Live(live) if !live.state().journal.incomplete => *live,
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
        self.run = Run::Released(Box::new(live.into_state()));
        true
    }

    /// Brings a new instance to where the released one was: the hooks
    /// that returned are called again, their host calls answered from
    /// the journal.
    async fn resume(&mut self, lent: Lent) -> Result<(), PolicyError> {
        let mut state = match std::mem::replace(&mut self.run, Run::Gone) {
            Run::Released(state) => state,
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
                // The heads are in the state's table: keep it to give
                // them back.
                self.run = Run::Released(state);
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
        self.run = Run::Live(Box::new(live));
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
        // Failed until the hook returns: a cancelled call leaves the
        // request unusable.
        self.failed = true;
        let state = self
            .state_mut()
            .ok_or(PolicyError::AlreadyFailed { hook })?;
        let lent = lend(state, req, resp.as_deref_mut())?;
        let resumed = self.resume(lent).await;
        let result = match (resumed, &mut self.run) {
            (Err(e), _) => Err(e),
            (Ok(()), Run::Live(live)) => live.call_hook(&entry, lent).await,
            (Ok(()), Run::Replayed(replay)) => match self.handle.policy().memo() {
                Some(memo) => replay.hook(memo, &entry, lent).await,
                None => Err(PolicyError::AlreadyFailed { hook }),
            },
            (Ok(()), Run::Released(_) | Run::Gone) => Err(PolicyError::AlreadyFailed { hook }),
        };
        if let Some(state) = self.state_mut() {
            take_back(state, lent, req, resp);
        }
        if result.is_ok() {
            self.failed = false;
            self.entries.push(entry);
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
        match self.hook(entry, req, None).instrument(span).await? {
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
            settings: Some(defaults),
        };
        match self.hook(entry, req, Some(resp)).instrument(span).await? {
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
        match self.hook(entry, req, Some(resp)).instrument(span).await? {
            Returned::Unit => Ok(()),
            _ => Err(wrong_result(Hook::OnDeliver)),
        }
    }

    /// The live instance, for the snapshot tool; `None` while replaying.
    pub(crate) fn live_mut(&mut self) -> Option<&mut LiveCall> {
        match &mut self.run {
            Run::Live(live) => Some(live),
            Run::Replayed(_) | Run::Released(_) | Run::Gone => None,
        }
    }

    /// Whether this request has an instance of its own (it left the
    /// recorded paths, or replaying is off).
    pub fn is_live(&self) -> bool {
        match &self.run {
            Run::Live(_) => true,
            Run::Replayed(replay) => replay.is_live(),
            Run::Released(_) | Run::Gone => false,
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
            Run::Released(state) => Some(&**state),
            Run::Gone => None,
        };
        state.map_or(&NONE, |s| &s.esi)
    }

    /// The policy this request runs.
    pub fn policy(&self) -> &LoadedPolicy {
        self.handle.policy()
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

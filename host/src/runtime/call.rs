//! One request's policy instance and the three hooks, called in the order
//! a request lives: `on-request`, `on-backend-response`, `on-deliver`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tracing::Instrument;

use super::engine::EPOCH_TICK;
use super::errors::{Hook, PolicyError};
use super::instance::{Lent, LiveCall, lend, take_back};
use super::memo::{Entry, Key, Memo, Node, Recording, Reply, Returned, Step, Tape};
use super::policy::{LoadedPolicy, PolicyHandle};
use super::state::{StoreState, not_repeated};
use super::types::{RequestHead, ResponseHead};

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

/// Where a request's policy runs.
enum Run {
    /// No instance yet: hooks are answered from the recorded paths, with
    /// this state holding what the calls changed.
    Replay(Box<StoreState>),
    /// The request's own instance.
    Live(Box<LiveCall>),
    /// Between the two while an instance is being created; a request whose
    /// hook was cancelled then stays here.
    Gone,
}

/// One request's policy, called in the order a request lives:
/// `on-request`, `on-backend-response`, `on-deliver`.
///
/// While the request follows a path an earlier request of the same policy
/// generation recorded, its hooks are answered from that path without an
/// instance (see `runtime::memo`); from the first hook that leaves the
/// recorded paths on, it has a fresh instance of its own, brought to the
/// same point first. After a hook fails, the request is unusable and later
/// hooks return [`PolicyError::AlreadyFailed`]. Dropping it returns its
/// instance's slot, if it had one, to the pool.
pub struct PolicyCall {
    handle: Arc<PolicyHandle>,
    /// Whether hooks may be answered from the policy's recorded paths.
    replay: bool,
    /// Where this request is on the recorded paths; `None` once it left
    /// what can be recorded.
    cursor: Option<Arc<Node>>,
    /// The memo shard the cursor's tree belongs to.
    shard: usize,
    /// The hooks answered from recorded paths so far, and (in one list,
    /// in order) the replies the guest got in them, to bring an instance
    /// to the same point.
    entries: Vec<Entry>,
    replies: Vec<(&'static str, Reply)>,
    run: Run,
    failed: bool,
}

impl std::fmt::Debug for PolicyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyCall")
            .field("policy", self.handle.policy())
            .field("live", &matches!(self.run, Run::Live(_)))
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// How far a hook got on the recorded paths.
enum Walk {
    /// The hook's recorded result, and the node the request is at now.
    Returned(Returned, Arc<Node>),
    /// Off the recorded paths: an instance takes over. What it does next
    /// is recorded under the node and key given, if any.
    Left(Option<(Arc<Node>, Key)>),
}

/// Answers a hook from the recorded paths below `from`: makes each
/// recorded call on `state` and follows the child its reply leads to.
/// The replies given are pushed to `replies`.
fn replay(
    state: &mut StoreState,
    from: &Arc<Node>,
    entry: &Entry,
    replies: &mut Vec<(&'static str, Reply)>,
) -> Walk {
    let first = Key::Entry(entry.clone());
    let Some(mut node) = from.child(&first) else {
        return Walk::Left(Some((Arc::clone(from), first)));
    };
    loop {
        let (name, reply) = match &node.step {
            Step::Return(returned) => return Walk::Returned(returned.clone(), Arc::clone(node)),
            Step::Call { name, op } => {
                // Over the cap the guest must trap at this call: let it.
                if !state.count_call() {
                    return Walk::Left(None);
                }
                let _span =
                    tracing::debug_span!("hostcall", call = *name, replayed = true).entered();
                match op(state) {
                    Ok(reply) => (*name, reply),
                    Err(_) => {
                        // The instance makes (and counts) this call itself
                        // and gets the error as a trap.
                        state.uncount_call();
                        return Walk::Left(None);
                    }
                }
            }
            Step::Opaque | Step::Start => return Walk::Left(None),
        };
        let key = Key::Reply(reply);
        match node.child(&key) {
            Some(child) => {
                if let Key::Reply(reply) = key {
                    replies.push((name, reply));
                }
                node = child;
            }
            None => {
                if let Key::Reply(reply) = &key {
                    replies.push((name, reply.clone()));
                }
                return Walk::Left(Some((Arc::clone(node), key)));
            }
        }
    }
}

impl PolicyCall {
    /// A request's policy; with `replay`, hooks may be answered from the
    /// policy's recorded paths, otherwise the instance is created now.
    pub(crate) async fn start(
        handle: Arc<PolicyHandle>,
        replay: bool,
    ) -> Result<Self, PolicyError> {
        let start = if replay {
            handle.policy().memo().and_then(Memo::start)
        } else {
            None
        };
        let shard = start.as_ref().map_or(0, |s| s.shard);
        let cursor = start.map(|s| s.root);
        let state = StoreState::new(Arc::clone(&handle), EPOCH_TICK);
        let replaying = cursor.is_some();
        let run = if replaying {
            Run::Replay(Box::new(state))
        } else {
            let live = LiveCall::start(state).await.map_err(|(e, _)| e)?;
            Run::Live(Box::new(live))
        };
        Ok(Self {
            handle,
            replay,
            cursor,
            shard,
            // Room for a typical replayed request, so the walk does not
            // grow them call by call (a profile had that at 2% of a hit).
            entries: Vec::with_capacity(if replaying { 3 } else { 0 }),
            replies: Vec::with_capacity(if replaying { 16 } else { 0 }),
            run,
            failed: false,
        })
    }

    /// The policy generation's recorded paths, when this request may use
    /// them (borrowed: no reference count per request).
    fn memo(&self) -> Option<&Memo> {
        self.handle.policy().memo().filter(|_| self.replay)
    }

    fn state_mut(&mut self) -> Option<&mut StoreState> {
        match &mut self.run {
            Run::Replay(state) => Some(state),
            Run::Live(live) => Some(live.state_mut()),
            Run::Gone => None,
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
        let result = self.run_hook(&entry, lent).await;
        if let Some(state) = self.state_mut() {
            take_back(state, lent, req, resp);
        }
        if result.is_ok() {
            self.failed = false;
        }
        result
    }

    async fn run_hook(&mut self, entry: &Entry, lent: Lent) -> Result<Returned, PolicyError> {
        let branch = match &mut self.run {
            Run::Replay(state) => {
                state.hook = entry.hook;
                let walk = match &self.cursor {
                    Some(from) => replay(state, from, entry, &mut self.replies),
                    None => Walk::Left(None),
                };
                match walk {
                    Walk::Returned(returned, node) => {
                        self.cursor = Some(node);
                        self.entries.push(entry.clone());
                        if let Some(memo) = self.memo() {
                            memo.count_replayed(self.shard);
                        }
                        return Ok(returned);
                    }
                    Walk::Left(branch) => {
                        self.catch_up(lent).await?;
                        branch
                    }
                }
            }
            Run::Live(_) => self.cursor.take().map(|at| (at, Key::Entry(entry.clone()))),
            Run::Gone => return Err(PolicyError::AlreadyFailed { hook: entry.hook }),
        };
        self.cursor = None;
        if let Some(memo) = self.memo() {
            memo.count_live(self.shard);
        }
        let Run::Live(live) = &mut self.run else {
            return Err(PolicyError::AlreadyFailed { hook: entry.hook });
        };
        live.state_mut().recorder = branch.is_some().then(Recording::default);
        let result = live.call_hook(entry, lent).await;
        let state = live.state_mut();
        let recording = state.recorder.take();
        if state.tape.broken || !state.tape.is_empty() {
            return Err(self.not_repeated(entry.hook, "its recorded calls"));
        }
        let returned = result?;
        if let (Some((at, key)), Some(recording), Some(memo)) = (branch, recording, self.memo()) {
            self.cursor = memo.insert(self.shard, &at, key, recording, returned.clone());
        }
        Ok(returned)
    }

    /// Leaves the recorded paths: creates the request's instance with the
    /// replay state and calls the hooks replayed so far in it, ready for
    /// the current hook. The replies already given (in those hooks and so
    /// far in this one) come from a tape, so nothing is done twice.
    async fn catch_up(&mut self, lent: Lent) -> Result<(), PolicyError> {
        let mut state = match std::mem::replace(&mut self.run, Run::Gone) {
            Run::Replay(state) => state,
            other => {
                self.run = other;
                return Ok(());
            }
        };
        let entries = std::mem::take(&mut self.entries);
        state.tape = Tape::new(std::mem::take(&mut self.replies));
        let mut live = match LiveCall::start(*state).await {
            Ok(live) => live,
            Err((error, state)) => {
                // The heads are in the state's table: keep it to give
                // them back.
                self.run = Run::Replay(state);
                self.cursor = None;
                return Err(error);
            }
        };
        let mut caught_up = Ok(());
        for past in &entries {
            if let Err(e) = live.call_hook(past, lent).await {
                caught_up = Err(e);
                break;
            }
        }
        self.run = Run::Live(Box::new(live));
        caught_up.map_err(|e| {
            let hook = e.hook().unwrap_or(Hook::Instantiate);
            self.not_repeated(hook, &format!("an earlier hook failed: {e}"))
        })
    }

    /// The error of an instance that did not do what the recorded paths
    /// say it would; replaying is switched off for the policy generation.
    fn not_repeated(&self, hook: Hook, what: &str) -> PolicyError {
        if let Some(memo) = self.memo() {
            memo.disable();
        }
        PolicyError::Trap {
            hook,
            message: not_repeated(what),
        }
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
            Run::Replay(_) | Run::Gone => None,
        }
    }

    /// Whether this request has an instance of its own (it left the
    /// recorded paths, or replaying is off).
    pub fn is_live(&self) -> bool {
        matches!(self.run, Run::Live(_))
    }

    /// What the policy asked of ESI so far in this request.
    pub fn esi_overrides(&self) -> &EsiOverrides {
        static NONE: EsiOverrides = EsiOverrides {
            enabled: None,
            vars: Vec::new(),
        };
        match &self.run {
            Run::Replay(state) => &state.esi,
            Run::Live(live) => &live.state().esi,
            Run::Gone => &NONE,
        }
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

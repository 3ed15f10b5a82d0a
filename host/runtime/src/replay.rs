//! Replay: a request's hooks answered from the paths earlier requests of
//! the same policy generation recorded (see [`crate::memo`]), and the move
//! to a live instance at the first hook or reply nobody recorded.
//!
//! [`PolicyCall`](crate::PolicyCall) wraps this around the plain call
//! (an instance and its hooks) when replay is on; nothing else knows it.

use std::sync::Arc;

use crate::errors::{Hook, PolicyError};
use crate::limits::MemoryLimiter;
use crate::memo::{Entries, Entry, Key, Replies, Returned, Tape};
use crate::policy::instance::{Lent, LiveCall};
use crate::policy::state::{Cursor, Memo, Recording, Start, Step, StoreState, not_repeated};

/// Where a replayed request's policy runs.
// The state is inline on purpose: a `Replay` is boxed, and a replayed
// request should not allocate the state a second time.
#[allow(clippy::large_enum_variant)]
enum Run {
    /// No instance yet: hooks are answered from the recorded paths, with
    /// this state holding what the calls changed. (Not boxed: a `Replay`
    /// is.)
    Recorded(StoreState),
    /// The request left the recorded paths: its own instance.
    Live(Box<LiveCall>),
    /// Between the two while an instance is being created; a request whose
    /// hook was cancelled then stays here.
    Gone,
}

/// One request walking the recorded paths, and the instance it gets when
/// it leaves them.
pub(crate) struct Replay {
    /// Where this request is on the recorded paths; `None` once it left
    /// what can be recorded.
    cursor: Option<Cursor>,
    /// The memo shard the cursor's trees belong to.
    shard: usize,
    /// The hooks answered from recorded paths so far, and (in one list,
    /// in order) the replies the guest got in them, to bring an instance
    /// to the same point.
    entries: Entries,
    replies: Replies,
    run: Run,
    /// Whether this request records where it goes off the paths: it left
    /// them where another request had (see [`Memo::admit`]); its later
    /// hooks are recorded too, so the next request there replays them all.
    recording: bool,
}

/// How far a hook got on the recorded paths.
enum Walk {
    /// The hook's recorded result, and where the request is now.
    Returned(Returned, Cursor),
    /// Off the recorded paths: an instance takes over. What it does next
    /// may be recorded under the point and key given, if any.
    Left(Option<(Cursor, Key)>),
}

/// Answers a hook from the recorded paths below `from` (in `shard` of
/// `memo`): makes each recorded call on `state` and follows the child its
/// reply leads to. The replies given are pushed to `replies`.
fn replay(
    memo: &Memo,
    shard: usize,
    state: &mut StoreState,
    from: &Cursor,
    entry: &Entry,
    replies: &mut Replies,
) -> Walk {
    let first = Key::Entry(entry.clone());
    let Some(mut at) = memo.child(shard, from, &first) else {
        return Walk::Left(Some((from.clone(), first)));
    };
    loop {
        let (name, reply) = match &at.node.step {
            Step::Return(returned) => return Walk::Returned((**returned).clone(), at),
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
        match memo.child(shard, &at, &key) {
            Some(child) => {
                if let Key::Reply(reply) = key {
                    replies.push((name, reply));
                }
                at = child;
            }
            None => {
                if let Key::Reply(reply) = &key {
                    replies.push((name, reply.clone()));
                }
                return Walk::Left(Some((at, key)));
            }
        }
    }
}

impl Replay {
    /// A request that starts at `start` of the recorded paths, with no
    /// instance yet.
    pub(crate) fn new(state: StoreState, start: Start) -> Self {
        Self {
            cursor: Some(start.root),
            shard: start.shard,
            // Room for a typical replayed request inline: no allocation
            // (a profile had growing them at 2% of a hit, and allocating
            // them at 1%).
            entries: Entries::new(),
            replies: Replies::new(),
            run: Run::Recorded(state),
            recording: false,
        }
    }

    /// The request's store state, wherever it is now.
    pub(crate) fn state_mut(&mut self) -> Option<&mut StoreState> {
        match &mut self.run {
            Run::Recorded(state) => Some(state),
            Run::Live(live) => Some(live.state_mut()),
            Run::Gone => None,
        }
    }

    pub(crate) fn state(&self) -> Option<&StoreState> {
        match &self.run {
            Run::Recorded(state) => Some(state),
            Run::Live(live) => Some(live.state()),
            Run::Gone => None,
        }
    }

    /// Gives the request's instance back to the pool (see
    /// `PolicyCall::release`): the request is back on the recorded paths
    /// where it is, with the replies its instance got as those already
    /// given, so the next hook is replayed if it can be and otherwise
    /// catches a new instance up as any replayed request does. Returns
    /// whether there was an instance the journal can stand in for.
    pub(crate) fn release(&mut self) -> bool {
        let releasable = matches!(&self.run, Run::Live(live) if !live.state().journal.incomplete);
        if !releasable {
            return false;
        }
        let Run::Live(live) = std::mem::replace(&mut self.run, Run::Gone) else {
            return false;
        };
        let handle = Arc::clone(live.state().handle());
        let mut state = handle.give_back(live);
        self.replies = Replies::from_vec(state.journal.take());
        // A new store counts its memory from nothing again.
        state.limiter = MemoryLimiter::new(state.policy().limits.memory);
        self.run = Run::Recorded(state);
        true
    }

    /// Whether the request has an instance of its own now.
    pub(crate) fn is_live(&self) -> bool {
        matches!(self.run, Run::Live(_))
    }

    /// The request's instance, if it has one, to give back as it ends.
    pub(crate) fn take_live(&mut self) -> Option<Box<LiveCall>> {
        match std::mem::replace(&mut self.run, Run::Gone) {
            Run::Live(live) => Some(live),
            other => {
                self.run = other;
                None
            }
        }
    }

    /// Runs one hook with the heads lent as `lent`: from the recorded
    /// paths while they lead on, else in the request's instance, recording
    /// what it does as a new branch.
    pub(crate) async fn hook(
        &mut self,
        memo: &Memo,
        entry: &Entry,
        lent: Lent,
    ) -> Result<Returned, PolicyError> {
        let branch = match &mut self.run {
            Run::Recorded(state) => {
                state.hook = entry.hook;
                let walk = match &self.cursor {
                    Some(from) => replay(memo, self.shard, state, from, entry, &mut self.replies),
                    None => Walk::Left(None),
                };
                match walk {
                    Walk::Returned(returned, node) => {
                        self.cursor = Some(node);
                        self.entries.push(entry.clone());
                        memo.count_replayed(self.shard);
                        return Ok(returned);
                    }
                    Walk::Left(branch) => {
                        // Boxed: instantiating and calling past hooks again
                        // would make every hook's future bigger.
                        Box::pin(self.catch_up(memo, lent)).await?;
                        branch
                    }
                }
            }
            Run::Live(_) => self.cursor.take().map(|at| (at, Key::Entry(entry.clone()))),
            Run::Gone => return Err(PolicyError::AlreadyFailed { hook: entry.hook }),
        };
        self.cursor = None;
        // Record from here if a request left the paths here before.
        let branch = branch.filter(|(at, key)| {
            self.recording = self.recording || memo.admit(self.shard, at.sighting(key));
            self.recording
        });
        memo.count_live(self.shard);
        let Run::Live(live) = &mut self.run else {
            return Err(PolicyError::AlreadyFailed { hook: entry.hook });
        };
        live.state_mut().recorder = branch.is_some().then(Recording::default);
        let result = live.call_hook(entry, lent).await;
        let state = live.state_mut();
        let recording = state.recorder.take();
        if diverged(&state.tape, result.as_ref().err()) {
            return Err(not_repeated_here(memo, entry.hook, "its recorded calls"));
        }
        let returned = result?;
        if let (Some((at, key)), Some(recording)) = (branch, recording) {
            self.cursor = memo.insert(self.shard, &at, key, recording, returned.clone());
        }
        self.entries.push(entry.clone());
        Ok(returned)
    }

    /// Leaves the recorded paths: creates the request's instance with the
    /// replay state and calls the hooks replayed so far in it, ready for
    /// the current hook. The replies already given (in those hooks and so
    /// far in this one) come from a tape, so nothing is done twice.
    async fn catch_up(&mut self, memo: &Memo, lent: Lent) -> Result<(), PolicyError> {
        let mut state = match std::mem::replace(&mut self.run, Run::Gone) {
            Run::Recorded(state) => state,
            other => {
                self.run = other;
                return Ok(());
            }
        };
        let entries = std::mem::take(&mut self.entries);
        state.tape = Tape::new(std::mem::take(&mut self.replies));
        let mut live = match LiveCall::start(state).await {
            Ok(live) => live,
            Err((error, state)) => {
                // The heads are in the state: keep it to give
                // them back.
                self.run = Run::Recorded(*state);
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
        let broken = live.state().tape.broken;
        self.run = Run::Live(live);
        // Kept for a later release, which needs every hook that returned.
        self.entries = entries;
        caught_up.map_err(|e| {
            // A hook that returned when it was recorded failed now: over a
            // limit, the machine was busy; otherwise the policy differs.
            if e.is_limit() && !broken {
                return e;
            }
            let hook = e.hook().unwrap_or(Hook::Instantiate);
            not_repeated_here(memo, hook, &format!("an earlier hook failed: {e}"))
        })
    }
}

/// Whether an instance brought to a recorded point did something else than
/// the recording says: it asked for another call than the tape holds
/// (`broken`), or its hook ended without the calls left on the tape. A hook
/// stopped by a limit (CPU time on a busy machine, memory) before it used
/// the tape up did not diverge: it was cut short.
fn diverged(tape: &Tape, failed: Option<&PolicyError>) -> bool {
    if tape.broken {
        return true;
    }
    match failed {
        Some(e) if e.is_limit() => false,
        _ => !tape.is_empty(),
    }
}

/// The error of an instance that did not do what the recorded paths say
/// it would; replaying is switched off for the policy generation.
fn not_repeated_here(memo: &Memo, hook: Hook, what: &str) -> PolicyError {
    memo.disable();
    PolicyError::Trap {
        hook,
        message: not_repeated(what),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memo::Reply;

    fn tape(replies: usize) -> Tape {
        Tape::new((0..replies).map(|_| ("request.url", Reply::Str("/a".into()))))
    }

    #[test]
    fn only_a_different_call_or_skipped_calls_count_as_divergence() {
        let timeout = PolicyError::Timeout {
            hook: Hook::OnRequest,
            budget: Duration::from_millis(50),
        };
        let trap = PolicyError::Trap {
            hook: Hook::OnRequest,
            message: "unreachable".into(),
        };
        // Used up the tape and returned: it repeated itself.
        assert!(!diverged(&tape(0), None));
        // Returned with recorded calls left over: it skipped them.
        assert!(diverged(&tape(1), None));
        // Trapped before making the recorded calls.
        assert!(diverged(&tape(1), Some(&trap)));
        // Trapped after them: an ordinary failure of the live part.
        assert!(!diverged(&tape(0), Some(&trap)));
        // Cut short by its CPU budget (a busy machine) before using the tape up.
        assert!(!diverged(&tape(2), Some(&timeout)));
        // Asked for another call than recorded, whatever happened next.
        let mut broken = tape(1);
        assert_eq!(broken.answer("request.header"), Some(Err(())));
        assert!(diverged(&broken, Some(&timeout)));
    }
}

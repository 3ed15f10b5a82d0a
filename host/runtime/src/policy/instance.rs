//! One request's live instance: a store from the policy's `InstancePre`
//! (new, made ahead, or kept from the thread's earlier requests), and the
//! guest's hooks called in it with the CPU budget, memory cap and error
//! classification around each call.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use inlay_core::{CacheSettings, RequestAction, RequestHead, ResponseHead, SyntheticResponse};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;
use wasmtime::Store;
use wasmtime::component::{ComponentType, Instance, Lift, Resource};

use super::state::{REQUEST_REP, RESPONSE_REP, StoreState};
use crate::bindings::Policy;
use crate::bindings::inlay::policy::types as wit;
use crate::convert::headers_from_list;
use crate::errors::{Hook, HostLimitTrap, PolicyError};
use crate::limits::MemoryLimiter;
use crate::memo::{Entry, Returned};

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

fn settings_to_wit(s: &CacheSettings) -> wit::CacheSettings {
    wit::CacheSettings {
        cacheable: s.cacheable,
        ttl: secs(s.ttl),
        grace: secs(s.grace),
        keep: secs(s.keep),
        surrogate_keys: s.surrogate_keys.clone(),
        esi: s.esi,
    }
}

fn settings_from_wit(s: wit::CacheSettings) -> CacheSettings {
    CacheSettings {
        cacheable: s.cacheable,
        ttl: Duration::from_secs(s.ttl.into()),
        grace: Duration::from_secs(s.grace.into()),
        keep: Duration::from_secs(s.keep.into()),
        surrogate_keys: s.surrogate_keys,
        esi: s.esi,
    }
}

fn action_from_wit(action: wit::RequestAction) -> Result<RequestAction, String> {
    Ok(match action {
        wit::RequestAction::Lookup => RequestAction::Lookup,
        wit::RequestAction::Pass => RequestAction::Pass,
        wit::RequestAction::Synthetic(s) => RequestAction::Synthetic(SyntheticResponse {
            status: StatusCode::from_u16(s.status)
                .map_err(|_| format!("synthetic response has invalid status {}", s.status))?,
            headers: headers_from_list(s.headers)
                .map_err(|e| format!("synthetic response: {e}"))?,
            body: Bytes::from(s.body),
        }),
    })
}

/// Maps a failed guest call to the caller's error, using what the store
/// saw (an expired clock, a refused memory growth, a reached cap).
fn classify(state: &StoreState, hook: Hook, err: wasmtime::Error) -> PolicyError {
    let limits = &state.policy().limits;
    if let Some(limit) = err.downcast_ref::<HostLimitTrap>() {
        return PolicyError::LimitExceeded {
            hook,
            what: limit.what,
            limit: limit.limit,
        };
    }
    let trap = err.downcast_ref::<wasmtime::Trap>().copied();
    if state.clock.expired || trap == Some(wasmtime::Trap::Interrupt) {
        return PolicyError::Timeout {
            hook,
            budget: limits.cpu_time(),
        };
    }
    if state.limiter.denied {
        return PolicyError::OutOfMemory {
            hook,
            limit: limits.memory,
        };
    }
    // A guest that got `limit-exceeded` and then gave up (a panic on the
    // error) failed because of the cap: say so rather than "trap".
    if let (Some(limit), Some(_)) = (&state.limit_hit, trap) {
        return PolicyError::LimitExceeded {
            hook,
            what: limit.what,
            limit: limit.limit,
        };
    }
    PolicyError::Trap {
        hook,
        message: format!("{err:?}"),
    }
}

/// The heads a hook gets, as the reps of the handles it is lent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent {
    pub(crate) req: u32,
    pub(crate) resp: Option<u32>,
}

/// Moves the heads into `state` for a hook call.
pub(crate) fn lend(
    state: &mut StoreState,
    req: &mut RequestHead,
    resp: Option<&mut ResponseHead>,
) -> Lent {
    state.heads.req = Some(std::mem::take(req));
    let resp = resp.map(|resp| {
        state.heads.resp = Some(std::mem::take(resp));
        RESPONSE_REP
    });
    Lent {
        req: REQUEST_REP,
        resp,
    }
}

/// Moves the heads lent for a hook back to the caller.
pub(crate) fn take_back(
    state: &mut StoreState,
    lent: Lent,
    req: &mut RequestHead,
    resp: Option<&mut ResponseHead>,
) {
    if let (Some(_), Some(resp)) = (lent.resp, resp)
        && let Some(head) = state.heads.resp.take()
    {
        *resp = head;
    }
    if let Some(head) = state.heads.req.take() {
        *req = head;
    }
}

/// What a hook gave back before it is checked.
enum Raw {
    Action(wit::RequestAction),
    Done(Returned),
}

/// One request's store and instance. Dropping it returns the instance's
/// slot to the pool.
pub(crate) struct LiveCall {
    store: Store<StoreState>,
    instance: Instance,
    bindings: Policy,
    /// When it was instantiated, on its engine's coarse clock (reuse is
    /// bounded by age).
    born: Duration,
    /// Requests that took it so far (reuse is bounded by a count); 0 for
    /// one made ahead that no request has taken yet.
    served: u32,
    /// Set when a guest call did not return normally (it failed, or its
    /// future was dropped mid-call): the instance may be half-way through
    /// anything and serves no other request.
    spoiled: bool,
    /// The state its store held while it waited for this request, kept
    /// to hold again when the request gives it back (one less to make).
    /// (Not boxed: the instance is, and moves as a box.)
    idle: Option<StoreState>,
    /// The pool slot the store holds; declared after it, so the store is
    /// gone when the next request gets the slot.
    _slot: OwnedSemaphorePermit,
}

impl LiveCall {
    /// An instance of the policy of `state`'s handle for one request: one
    /// the handle keeps ready (made ahead, or given back by an earlier
    /// request when the policy reuses instances; its store then takes
    /// `state`, keeping what its memory holds), else a new one. On failure
    /// the state comes back (it may hold lent heads).
    pub(crate) async fn start(
        state: StoreState,
    ) -> Result<Box<Self>, (PolicyError, Box<StoreState>)> {
        match state.handle().take_ready() {
            Some(mut live) => {
                live.adopt(state);
                Ok(live)
            }
            // Boxed: instantiating needs a future of kilobytes, which would
            // otherwise make every hook's future (moved on each call) as big.
            None => Box::pin(Self::start_new(state)).await.map(|mut live| {
                live.served = 1;
                live
            }),
        }
    }

    /// Puts a request's `state` in this ready instance's store. The
    /// memory the instance holds stays counted against the cap; every
    /// other count (CPU, host calls, subrequests, log lines) is the new
    /// request's own.
    fn adopt(&mut self, state: StoreState) {
        let mut idle = std::mem::replace(self.store.data_mut(), state);
        let memory = idle.policy().limits.memory;
        let limiter = std::mem::replace(&mut idle.limiter, MemoryLimiter::new(memory));
        self.store.data_mut().limiter = MemoryLimiter {
            denied: false,
            ..limiter
        };
        self.idle = Some(idle);
        self.served = self.served.saturating_add(1);
    }

    /// Takes the request's state out of the store and puts an idle one
    /// there instead (the one it held before this request, or `idle()`),
    /// so the instance can wait for another request.
    pub(crate) fn detach(&mut self, idle: impl FnOnce() -> StoreState) -> StoreState {
        let idle = self.idle.take().unwrap_or_else(idle);
        let mut state = std::mem::replace(self.store.data_mut(), idle);
        let limiter = MemoryLimiter::new(state.policy().limits.memory);
        self.store.data_mut().limiter = std::mem::replace(&mut state.limiter, limiter);
        state
    }

    /// Requests that took this instance so far.
    pub(crate) fn served(&self) -> u32 {
        self.served
    }

    /// How long ago it was instantiated (to the engine's last tick).
    pub(crate) fn age(&self) -> Duration {
        let engine = self.store.data().handle().policy().engine();
        engine.coarse_now().saturating_sub(self.born)
    }

    /// Whether it may serve another request: every guest call returned,
    /// no cap was reached (a guest that got `limit-exceeded` or was
    /// refused memory carried on, but is at its limits), it holds at most
    /// half its memory cap, and it did what its recorded calls said.
    pub(crate) fn reusable(&self) -> bool {
        let state = self.store.data();
        !self.spoiled
            && !state.limiter.denied
            && !state.limiter.over_half()
            && state.limit_hit.is_none()
            && !state.clock.expired
            && !state.tape.broken
    }

    /// Instantiates the policy of `state`'s handle (which keeps it, and
    /// its compiled code, alive for the request) in a new store holding
    /// `state`; the guest's start code runs under a whole CPU budget.
    /// When the pool is full it waits in line for a slot, up to the
    /// policy's `instance_wait_ms`.
    pub(crate) async fn start_new(
        state: StoreState,
    ) -> Result<Box<Self>, (PolicyError, Box<StoreState>)> {
        let policy = state.handle().policy();
        let slot = policy.engine().slot(policy.limits().instance_wait()).await;
        match slot {
            Ok(slot) => Self::instantiate(state, slot).await,
            Err(e) => Err((e, Box::new(state))),
        }
    }

    /// An instance made ahead of the request that will use it, if a slot
    /// is free now: it never queues before requests.
    pub(crate) async fn start_ahead(
        state: StoreState,
    ) -> Result<Option<Box<Self>>, (PolicyError, Box<StoreState>)> {
        match state.handle().policy().engine().slot_now() {
            Some(slot) => Self::instantiate(state, slot).await.map(Some),
            None => Ok(None),
        }
    }

    /// Removes the instance, returning its slot to the pool, and gives
    /// back the request's state.
    pub(crate) fn into_state(self: Box<Self>) -> StoreState {
        self.store.into_data()
    }

    async fn instantiate(
        state: StoreState,
        slot: OwnedSemaphorePermit,
    ) -> Result<Box<Self>, (PolicyError, Box<StoreState>)> {
        let handle = Arc::clone(state.handle());
        let policy = handle.policy();
        let span = tracing::debug_span!("policy.instantiate", policy = %policy.name());
        async move {
            let (engine, pre, indices) = policy.parts();
            let mut store = Store::new(engine, state);
            store.limiter(|state| &mut state.limiter);
            store.epoch_deadline_callback(|mut ctx| Ok(ctx.data_mut().clock.on_deadline()));
            let ticks = store.data_mut().begin_guest_call();
            store.set_epoch_deadline(ticks);
            let started = pre
                .instantiate_async(&mut store)
                .await
                .and_then(|instance| {
                    indices
                        .load(&mut store, &instance)
                        .map(|bindings| (instance, bindings))
                });
            policy.count_instantiation();
            match started {
                Ok((instance, bindings)) => Ok(Box::new(Self {
                    store,
                    instance,
                    bindings,
                    born: policy.engine().coarse_now(),
                    served: 0,
                    spoiled: false,
                    idle: None,
                    _slot: slot,
                })),
                Err(e) => {
                    let error = match classify(store.data(), Hook::Instantiate, e) {
                        PolicyError::Trap { message, .. } => PolicyError::Instantiate { message },
                        other => other,
                    };
                    Err((error, Box::new(store.into_data())))
                }
            }
        }
        .instrument(span)
        .await
    }

    pub(crate) fn state(&self) -> &StoreState {
        self.store.data()
    }

    pub(crate) fn state_mut(&mut self) -> &mut StoreState {
        self.store.data_mut()
    }

    /// Calls the guest's hook for `entry` with the heads lent as `lent`.
    pub(crate) async fn call_hook(
        &mut self,
        entry: &Entry,
        lent: Lent,
    ) -> Result<Returned, PolicyError> {
        let hook = entry.hook;
        self.store.data_mut().hook = hook;
        self.refill_budget();
        // Until the guest returns: a call cut short leaves it anywhere.
        self.spoiled = true;
        let handler = self.bindings.inlay_policy_handler();
        let req = Resource::new_borrow(lent.req);
        let resp = || {
            lent.resp
                .map(Resource::new_borrow)
                .ok_or_else(|| PolicyError::InvalidResult {
                    hook,
                    message: "the hook needs a response and none was lent".to_string(),
                })
        };
        let result = match (hook, &entry.settings) {
            (Hook::OnRequest, _) => handler
                .call_on_request(&mut self.store, req)
                .await
                .map(Raw::Action),
            (Hook::OnBackendResponse, Some(settings)) => {
                let resp = resp()?;
                handler
                    .call_on_backend_response(
                        &mut self.store,
                        req,
                        resp,
                        &settings_to_wit(settings),
                    )
                    .await
                    .map(|s| Raw::Done(Returned::Settings(settings_from_wit(s))))
            }
            (Hook::OnDeliver, _) => {
                let resp = resp()?;
                handler
                    .call_on_deliver(&mut self.store, req, resp)
                    .await
                    .map(|()| Raw::Done(Returned::Unit))
            }
            _ => {
                return Err(PolicyError::InvalidResult {
                    hook,
                    message: "not a hook the guest exports".to_string(),
                });
            }
        };
        let state = self.store.data();
        let raw = match result {
            Ok(raw) => {
                self.spoiled = false;
                raw
            }
            Err(e) => {
                let error = classify(state, hook, e);
                tracing::warn!(policy = %state.policy().name, hook = %hook, error = %error, "policy hook failed");
                return Err(error);
            }
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let cpu_us = u64::try_from(state.clock.used().as_micros()).unwrap_or(u64::MAX);
            tracing::debug!(hook = %hook, cpu_us, "policy hook done");
        }
        match raw {
            Raw::Action(action) => action_from_wit(action)
                .map(Returned::Action)
                .map_err(|message| PolicyError::InvalidResult { hook, message }),
            Raw::Done(returned) => Ok(returned),
        }
    }

    /// Gives the next guest call a whole CPU budget and its whole
    /// `host_wait`.
    pub(crate) fn refill_budget(&mut self) {
        let ticks = self.store.data_mut().begin_guest_call();
        self.store.set_epoch_deadline(ticks);
    }

    /// Calls `func` (no parameters, one result) of the exported instance
    /// `instance`: the accessors a snapshot tool adds to a component.
    pub(crate) async fn call_accessor<R>(
        &mut self,
        instance: &str,
        func: &str,
    ) -> wasmtime::Result<R>
    where
        R: ComponentType + Lift + Send + Sync + 'static,
    {
        let missing = || wasmtime::format_err!("no export {instance}#{func}");
        let (_, parent) = self
            .instance
            .get_export(&mut self.store, None, instance)
            .ok_or_else(missing)?;
        let (_, index) = self
            .instance
            .get_export(&mut self.store, Some(&parent), func)
            .ok_or_else(missing)?;
        let func = self
            .instance
            .get_typed_func::<(), (R,)>(&mut self.store, index)?;
        // Accessors are the tool's code, not the policy's: each gets a
        // whole budget.
        self.refill_budget();
        Ok(func.call_async(&mut self.store, ()).await?.0)
    }

    /// The store, to read what an accessor returned.
    pub(crate) fn store(&self) -> &Store<StoreState> {
        &self.store
    }
}

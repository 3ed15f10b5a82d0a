//! One request's policy instance and the three hooks, called in the order
//! a request lives: `on-request`, `on-backend-response`, `on-deliver`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tracing::Instrument;
use wasmtime::component::{ComponentType, Instance, InstancePre, Lift, Resource};
use wasmtime::{Engine, Store};

use super::bindings::inlay::policy::types as wit;
use super::bindings::{Policy, PolicyIndices};
use super::engine::EPOCH_TICK;
use super::errors::{Hook, HostLimitTrap, PolicyError};
use super::policy::{LoadedPolicy, PolicyShared};
use super::services::PolicyServices;
use super::state::StoreState;
use super::types::{RequestHead, ResponseHead, headers_from_list};

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
#[derive(Clone, Debug, PartialEq, Eq, Default)]
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

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

fn settings_to_wit(s: CacheSettings) -> wit::CacheSettings {
    wit::CacheSettings {
        cacheable: s.cacheable,
        ttl: secs(s.ttl),
        grace: secs(s.grace),
        keep: secs(s.keep),
        surrogate_keys: s.surrogate_keys,
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

/// One request's store and instance. Call the hooks in order; after a hook
/// fails, the instance is unusable and later hooks return
/// [`PolicyError::AlreadyFailed`]. Dropping it returns the instance's slot
/// to the pool.
pub struct PolicyCall {
    store: Store<StoreState>,
    instance: Instance,
    bindings: Policy,
    /// Keeps the policy (and its compiled code) alive for the request.
    policy: LoadedPolicy,
    failed: bool,
}

impl std::fmt::Debug for PolicyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyCall")
            .field("policy", &self.policy)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Maps a failed guest call to the caller's error, using what the store
/// saw (an expired clock, a refused memory growth, a reached cap).
fn classify(state: &StoreState, hook: Hook, err: wasmtime::Error) -> PolicyError {
    let limits = &state.policy.limits;
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

impl PolicyCall {
    pub(crate) async fn start(
        policy: LoadedPolicy,
        engine: &Engine,
        pre: &InstancePre<StoreState>,
        indices: &PolicyIndices,
        shared: Arc<PolicyShared>,
        services: Arc<dyn PolicyServices>,
    ) -> Result<Self, PolicyError> {
        let span = tracing::debug_span!("policy.instantiate", policy = %shared.name);
        async move {
            let mut store = Store::new(engine, StoreState::new(services, shared, EPOCH_TICK));
            store.limiter(|state| &mut state.limiter);
            store.epoch_deadline_callback(|mut ctx| Ok(ctx.data_mut().clock.on_deadline()));
            // Instantiation runs the guest's start code under the same budget.
            let ticks = store.data_mut().clock.restart();
            store.set_epoch_deadline(ticks);
            let started = pre
                .instantiate_async(&mut store)
                .await
                .and_then(|instance| {
                    indices
                        .load(&mut store, &instance)
                        .map(|bindings| (instance, bindings))
                });
            match started {
                Ok((instance, bindings)) => Ok(Self {
                    store,
                    instance,
                    bindings,
                    policy,
                    failed: false,
                }),
                Err(e) => Err(match classify(store.data(), Hook::Instantiate, e) {
                    PolicyError::Trap { message, .. } => PolicyError::Instantiate { message },
                    other => other,
                }),
            }
        }
        .instrument(span)
        .await
    }

    /// Prepares the store for a hook call: refuses if an earlier hook
    /// failed, resets the CPU budget, and marks the call failed until it
    /// returns (so a cancelled call leaves the instance unusable).
    fn begin(&mut self, hook: Hook) -> Result<(), PolicyError> {
        if self.failed {
            return Err(PolicyError::AlreadyFailed { hook });
        }
        self.failed = true;
        self.store.data_mut().hook = hook;
        self.refill_budget();
        Ok(())
    }

    fn lend_request(
        &mut self,
        req: &mut RequestHead,
    ) -> Result<Resource<RequestHead>, PolicyError> {
        let head = std::mem::take(req);
        let state = self.store.data_mut();
        let owned = state
            .table
            .push(head)
            .map_err(|e| PolicyError::Instantiate {
                message: format!("resource table: {e}"),
            })?;
        state.current_request = Some(Resource::new_borrow(owned.rep()));
        Ok(owned)
    }

    fn lend_response(
        &mut self,
        resp: &mut ResponseHead,
    ) -> Result<Resource<ResponseHead>, PolicyError> {
        let head = std::mem::take(resp);
        self.store
            .data_mut()
            .table
            .push(head)
            .map_err(|e| PolicyError::Instantiate {
                message: format!("resource table: {e}"),
            })
    }

    fn take_back_request(&mut self, owned: Resource<RequestHead>, req: &mut RequestHead) {
        let state = self.store.data_mut();
        state.current_request = None;
        if let Ok(head) = state.table.delete(owned) {
            *req = head;
        }
    }

    fn take_back_response(&mut self, owned: Resource<ResponseHead>, resp: &mut ResponseHead) {
        if let Ok(head) = self.store.data_mut().table.delete(owned) {
            *resp = head;
        }
    }

    /// Lends both heads; if the second cannot be lent, the first is taken
    /// back, so nothing stays lent on an error.
    fn lend_both(
        &mut self,
        req: &mut RequestHead,
        resp: &mut ResponseHead,
    ) -> Result<(Resource<RequestHead>, Resource<ResponseHead>), PolicyError> {
        let req_owned = self.lend_request(req)?;
        match self.lend_response(resp) {
            Ok(resp_owned) => Ok((req_owned, resp_owned)),
            Err(e) => {
                self.take_back_request(req_owned, req);
                Err(e)
            }
        }
    }

    fn take_back_both(
        &mut self,
        (req_owned, resp_owned): (Resource<RequestHead>, Resource<ResponseHead>),
        req: &mut RequestHead,
        resp: &mut ResponseHead,
    ) {
        self.take_back_response(resp_owned, resp);
        self.take_back_request(req_owned, req);
    }

    /// Turns the guest call's result into the caller's, and clears the
    /// failed mark on success.
    fn finish<T>(&mut self, hook: Hook, result: wasmtime::Result<T>) -> Result<T, PolicyError> {
        match result {
            Ok(value) => {
                self.failed = false;
                let used = self.store.data().clock.used();
                let cpu_us = u64::try_from(used.as_micros()).unwrap_or(u64::MAX);
                tracing::debug!(hook = %hook, cpu_us, "policy hook done");
                Ok(value)
            }
            Err(e) => {
                let error = classify(self.store.data(), hook, e);
                tracing::warn!(policy = %self.policy.name(), hook = %hook, error = %error, "policy hook failed");
                Err(error)
            }
        }
    }

    /// recv: lets the policy inspect and rewrite `req` and decide what to
    /// do with it. `req` is moved into the instance for the call and back.
    pub async fn on_request(
        &mut self,
        req: &mut RequestHead,
    ) -> Result<RequestAction, PolicyError> {
        let hook = Hook::OnRequest;
        let span = tracing::debug_span!("policy.on_request", policy = %self.policy.name());
        async move {
            self.begin(hook)?;
            let owned = self.lend_request(req)?;
            let borrow = Resource::new_borrow(owned.rep());
            let result = self
                .bindings
                .inlay_policy_handler()
                .call_on_request(&mut self.store, borrow)
                .await;
            self.take_back_request(owned, req);
            let action = self.finish(hook, result)?;
            action_from_wit(action).map_err(|message| PolicyError::InvalidResult { hook, message })
        }
        .instrument(span)
        .await
    }

    /// The backend answered: the policy may edit `resp` (status and
    /// headers) and returns how to cache it, starting from `defaults`.
    pub async fn on_backend_response(
        &mut self,
        req: &mut RequestHead,
        resp: &mut ResponseHead,
        defaults: CacheSettings,
    ) -> Result<CacheSettings, PolicyError> {
        let hook = Hook::OnBackendResponse;
        let span = tracing::debug_span!("policy.on_backend_response", policy = %self.policy.name());
        async move {
            self.begin(hook)?;
            let (req_owned, resp_owned) = self.lend_both(req, resp)?;
            let settings = settings_to_wit(defaults);
            let result = self
                .bindings
                .inlay_policy_handler()
                .call_on_backend_response(
                    &mut self.store,
                    Resource::new_borrow(req_owned.rep()),
                    Resource::new_borrow(resp_owned.rep()),
                    &settings,
                )
                .await;
            self.take_back_both((req_owned, resp_owned), req, resp);
            self.finish(hook, result).map(settings_from_wit)
        }
        .instrument(span)
        .await
    }

    /// The response is about to go to the client: the policy may edit its
    /// status and headers.
    pub async fn on_deliver(
        &mut self,
        req: &mut RequestHead,
        resp: &mut ResponseHead,
    ) -> Result<(), PolicyError> {
        let hook = Hook::OnDeliver;
        let span = tracing::debug_span!("policy.on_deliver", policy = %self.policy.name());
        async move {
            self.begin(hook)?;
            let (req_owned, resp_owned) = self.lend_both(req, resp)?;
            let result = self
                .bindings
                .inlay_policy_handler()
                .call_on_deliver(
                    &mut self.store,
                    Resource::new_borrow(req_owned.rep()),
                    Resource::new_borrow(resp_owned.rep()),
                )
                .await;
            self.take_back_both((req_owned, resp_owned), req, resp);
            self.finish(hook, result)
        }
        .instrument(span)
        .await
    }

    /// Gives the next guest call a whole CPU budget.
    pub(crate) fn refill_budget(&mut self) {
        let ticks = self.store.data_mut().clock.restart();
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

    /// What the policy asked of ESI so far in this request.
    pub fn esi_overrides(&self) -> &EsiOverrides {
        &self.store.data().esi
    }

    /// The policy this request runs.
    pub fn policy(&self) -> &LoadedPolicy {
        &self.policy
    }
}

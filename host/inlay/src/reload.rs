//! Full reload: SIGHUP (and the admin API's `POST /reload`) read the config
//! file again, with the same command-line overrides, and apply it as one
//! new pipeline generation.
//!
//! A request reads the current generation once ([`crate::listeners::serve`])
//! and finishes on it: its policy, backends, cache rules, ESI settings and
//! access log. What is shared across generations is the cache itself
//! (store, fetches in flight, hit-for-miss marks), the policy engine
//! (unless `policy.max_instances` changed), and the connection pools of
//! backends whose settings did not change. A file that does not parse,
//! does not validate, or names a policy that does not load changes nothing:
//! the errors are logged and returned.
//!
//! New cache sizes apply to the running store in place (a smaller one
//! evicts at once). A new `cache.dir` gives the new generation a cache of
//! its own on a store opened there, carrying the bans in effect; the old
//! store is closed once the old generation's last request is done.

use std::sync::Arc;

use anyhow::Context as _;
use inlay_cache::{CacheStore, HttpCache};
use inlay_listener::Tls;
use inlay_runtime::{
    LoadedPolicy, PolicyEngine, PolicyError, PolicyLimits, PolicySlot, PolicySource,
};
use inlay_storage::{StoreConfig, TieredStore};
use tracing::{error, info, warn};

use crate::access_log::AccessLog;
use crate::admin::{Admin, WeakAdmin};
use crate::backend::component::ComponentSet;
use crate::config::{AccessLogTarget, Config, ConfigError, ConfigSource, PolicyConfig};
use crate::pipeline::Pipeline;
use crate::pipeline::{GenerationFigures, Generations};
use crate::resolve::resolve;

/// What a successful reload did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReloadReport {
    /// The generation now serving (the first one is 1).
    pub generation: u64,
    /// The config sections that changed (`server`, `backends`, `log`,
    /// `cache`, `esi`, `policy`, `admin`); the policy file is loaded again
    /// whether or not its section changed.
    pub changed: Vec<String>,
    /// Settings that changed but need a restart, and what else was not
    /// applied, one sentence each naming the key.
    pub warnings: Vec<String>,
}

/// Settings read when the process starts and never again.
const RESTART_ONLY: &str = "needs a restart; the running value stays";

/// Builds and swaps pipeline generations.
pub struct Reloader {
    current: Arc<Generations>,
    /// Where the config comes from (the file and flags the process started
    /// with); `None`: the config it was given is applied again (the policy
    /// file is still reloaded).
    source: Option<ConfigSource>,
    /// The admin API, whose token a reload reads again (weakly: its
    /// hooks hold this reloader).
    admin: Option<WeakAdmin>,
    /// The TLS listeners' certificates, read again at every reload.
    tls: Option<Arc<Tls>>,
    /// Where the client listeners read their limits (`[server]`).
    listener_limits: Option<tokio::sync::watch::Sender<Arc<inlay_listener::Limits>>>,
    state: tokio::sync::Mutex<State>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// What only one reload at a time may touch.
struct State {
    generation: u64,
    /// The policy slot, kept across generations (and across a generation
    /// without a policy) so that its engine and instance pool are made
    /// again only when `policy.max_instances` changes.
    slot: Option<Arc<PolicySlot>>,
    /// The component the cluster's policy rollout made current, loaded
    /// instead of `policy.path`'s (same name, config and limits).
    rollout: Option<std::path::PathBuf>,
    /// The component files the cluster's rollout made current, by
    /// component backend, loaded instead of their `component` (same
    /// settings).
    component_rollouts: std::collections::BTreeMap<String, std::path::PathBuf>,
}

impl Reloader {
    /// Generation 1 is `first`, which runs `slot`'s policy (if any);
    /// reloads read `source` again.
    pub fn new(
        first: Pipeline,
        slot: Option<Arc<PolicySlot>>,
        source: Option<ConfigSource>,
    ) -> Self {
        let first = Arc::new(first);
        let metrics = Arc::clone(first.metrics());
        let current = Arc::new(Generations::new(first));
        // `GET /metrics` reads the store and policy of the generation serving.
        metrics.register_collector(Box::new(GenerationFigures::new(
            &current,
            Arc::clone(&metrics),
        )));
        Self {
            current,
            source,
            admin: None,
            tls: None,
            listener_limits: None,
            state: tokio::sync::Mutex::new(State {
                generation: 1,
                slot,
                rollout: None,
                component_rollouts: std::collections::BTreeMap::new(),
            }),
        }
    }

    /// Reloads read `admin.token_file` again for `admin`.
    #[must_use]
    pub fn with_admin(mut self, admin: Admin) -> Self {
        self.admin = Some(admin.downgrade());
        self
    }

    /// Reloads read `[[server.tls]]`'s files again for `tls`.
    #[must_use]
    pub fn with_tls(mut self, tls: Arc<Tls>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Reloads send `[server]`'s limits to the client listeners on `limits`.
    #[must_use]
    pub fn with_listener_limits(
        mut self,
        limits: tokio::sync::watch::Sender<Arc<inlay_listener::Limits>>,
    ) -> Self {
        self.listener_limits = Some(limits);
        self
    }

    /// The generations, for the accept loop to read per request.
    pub fn generations(&self) -> Arc<Generations> {
        Arc::clone(&self.current)
    }

    /// The generation new requests get.
    pub fn current(&self) -> Arc<Pipeline> {
        self.current.load_full()
    }

    /// The config new requests run with: the file's, with the running
    /// values of the settings that need a restart.
    pub fn current_config(&self) -> Arc<Config> {
        Arc::clone(self.current.load().shared_config())
    }

    /// Read the config again and, if it is valid and its policy loads,
    /// make it the next generation; otherwise change nothing and return
    /// every error (`key.path: message`, as `inlay check` prints them).
    /// Both outcomes are logged. Reloads run one at a time.
    pub async fn reload(&self) -> Result<ReloadReport, Vec<String>> {
        let mut state = self.state.lock().await;
        let result = self.reload_locked(&mut state).await;
        match &result {
            Ok(report) => {
                for w in &report.warnings {
                    warn!("reload: {w}");
                }
                info!(
                    generation = report.generation,
                    changed = %if report.changed.is_empty() {
                        "none".to_owned()
                    } else {
                        report.changed.join(",")
                    },
                    "config reloaded: generation {} serves new requests",
                    report.generation
                );
            }
            Err(errors) => {
                for e in errors {
                    error!("config reload refused: {e}");
                }
                error!(
                    generation = state.generation,
                    errors = errors.len(),
                    "config reload refused: nothing changed; generation {} keeps serving",
                    state.generation
                );
            }
        }
        result
    }

    /// Load the policy component at `path` instead of `policy.path`'s (the
    /// cluster's rollout), or `policy.path`'s again with `None`, as a reload
    /// does: on any error nothing changes and the errors are returned. A
    /// node without `[policy]` refuses.
    pub async fn roll_out_policy(
        &self,
        path: Option<std::path::PathBuf>,
    ) -> Result<ReloadReport, Vec<String>> {
        let mut state = self.state.lock().await;
        if self.current_config().policy.is_none() {
            return Err(vec!["this node has no [policy] to replace".to_owned()]);
        }
        let previous = std::mem::replace(&mut state.rollout, path);
        let result = self.reload_locked(&mut state).await;
        if result.is_err() {
            state.rollout = previous;
        }
        result
    }

    /// Serve component backend `backend` from the component at `path`
    /// instead of its `component` file (the cluster's rollout), or from
    /// that file again with `None`, as a reload does: on any error nothing
    /// changes and the errors are returned. A node without that component
    /// backend refuses.
    pub async fn roll_out_component(
        &self,
        backend: &str,
        path: Option<std::path::PathBuf>,
    ) -> Result<ReloadReport, Vec<String>> {
        let mut state = self.state.lock().await;
        let is_component = self
            .current_config()
            .backends
            .get(backend)
            .is_some_and(|b| b.component.is_some());
        if !is_component {
            return Err(vec![format!(
                "this node has no component backend {backend} to replace"
            )]);
        }
        let previous = match path {
            Some(p) => state.component_rollouts.insert(backend.to_owned(), p),
            None => state.component_rollouts.remove(backend),
        };
        let result = self.reload_locked(&mut state).await;
        if result.is_err() {
            match previous {
                Some(p) => state.component_rollouts.insert(backend.to_owned(), p),
                None => state.component_rollouts.remove(backend),
            };
        }
        result
    }

    async fn reload_locked(&self, state: &mut State) -> Result<ReloadReport, Vec<String>> {
        let old = self.current.load_full();
        let mut cfg = self.read_config(old.config())?;
        let warnings = keep_restart_only(old.config(), &mut cfg);
        let changed = changed_sections(old.config(), &cfg);
        // Everything that can fail comes before the policy is swapped in the
        // slot: after that, nothing may refuse the generation.
        let mut settings = resolve(cfg).map_err(|e| config_errors(&e))?;
        let cfg = &*settings.config;
        // Component backends: a file that changed is loaded anew; one the
        // cluster rolled out replaces the configured one (the generation's
        // config keeps the configured path; a backend that is no longer a
        // component is left alone).
        let rolled_out;
        let component_cfg = if state.component_rollouts.is_empty() {
            cfg
        } else {
            let mut c = cfg.clone();
            for (name, path) in &state.component_rollouts {
                if let Some(comp) = c.backends.get_mut(name).and_then(|b| b.component.as_mut()) {
                    comp.path.clone_from(path);
                }
            }
            rolled_out = c;
            &rolled_out
        };
        let components = ComponentSet::load(component_cfg, old.backends().components())
            .await
            .map_err(|issues| config_errors(&ConfigError::Invalid(issues)))?;
        let token = settings.admin_token.clone();
        let certificates = match &self.tls {
            Some(_) => Some(tls_certificates(cfg, &mut settings.certificates)?),
            None => None,
        };
        let access_log = if needs_new_access_log(old.config(), cfg) {
            AccessLog::open(&cfg.log)
                .map_err(|e| vec![format!("log.access_log: cannot open it: {e}")])?
        } else {
            old.access_log().clone()
        };
        // A new cache.dir: purges and bans wait from the moment the bans are
        // carried over until the new cache is the one requests use, so that
        // none lands on the cache being left.
        let invalidator = Arc::clone(old.invalidator());
        let mut moving = match old.config().cache.dir != cfg.cache.dir {
            true => Some(invalidator.moving().await),
            false => None,
        };
        // Dropped unused (a policy that does not load), it closes again.
        let mut moved = MovedCache(None);
        let bounds = match prepare_cache(old.cache(), old.config(), cfg).await? {
            CacheChange::Same => None,
            CacheChange::Bounds { memory, disk } => Some((memory, disk)),
            CacheChange::Moved(cache) => {
                moved.0 = Some(cache);
                None
            }
        };
        let outgoing_policy = old.policy().cloned();
        let slot = match &cfg.policy {
            None => None,
            Some(pc) => {
                let mut source = policy_source(pc);
                if let Some(path) = &state.rollout {
                    source.path.clone_from(path);
                }
                let loading = source.path.clone();
                match &state.slot {
                    Some(slot) => {
                        slot.reload(source).await.map_err(|e| match e {
                            PolicyError::Engine { .. } => {
                                vec![format!("policy.max_instances: {e}")]
                            }
                            e => vec![format!(
                                "policy.path: cannot load {}: {e}",
                                loading.display()
                            )],
                        })?;
                        Some(Arc::clone(slot))
                    }
                    None => {
                        let slot = load_policy(cfg).await.map_err(|e| {
                            let key = match e.root_cause().downcast_ref::<PolicyError>() {
                                Some(PolicyError::Engine { .. }) => "policy.max_instances",
                                _ => "policy.path",
                            };
                            vec![format!("{key}: {e:#}")]
                        })?;
                        state.slot.clone_from(&slot);
                        slot
                    }
                }
            }
        };
        let mut warnings = warnings;
        if cfg.log.level != old.config().log.level
            && let Err(w) = crate::diagnostics::set_log_level(&cfg.log.level)
        {
            warnings.push(w);
        }
        warnings.extend(crate::listeners::raise_open_files(&cfg.server));
        if let Some(admin) = self.admin.as_ref().and_then(WeakAdmin::upgrade) {
            admin.set_token(token);
        }
        if let (Some(tls), Some(set)) = (&self.tls, certificates) {
            tls.install(set);
        }
        old.metrics().set_enabled(cfg.metrics.enabled);
        if let Some((memory, disk)) = bounds
            && let Err(e) = old.cache().store().set_bounds(memory, disk).await
        {
            // Checked before: only the eviction down to a smaller bound can
            // fail, and the maintenance thread evicts again on its round.
            warnings.push(format!(
                "cache.disk_size: the new bounds apply, but evicting down to them failed: {e}"
            ));
        }
        let listener_limits = crate::listeners::limits(&cfg.server);
        let moved = moved.0.take();
        let next = Arc::new(match &moved {
            Some(cache) => old.next_generation_on(
                Arc::clone(&settings.config),
                &settings.backend_tls,
                &components,
                slot,
                access_log.clone(),
                cache.clone(),
            ),
            None => old.next_generation(
                Arc::clone(&settings.config),
                &settings.backend_tls,
                &components,
                slot,
                access_log.clone(),
            ),
        });
        state.generation += 1;
        if let Some(guard) = moving.as_mut() {
            **guard = next.cache().clone();
        }
        self.current.store(next);
        old.retire(cfg.server.shutdown_timeout);
        drop(moving);
        if let Some(limits) = &self.listener_limits {
            limits.send_replace(Arc::new(listener_limits));
        }
        if moved.is_some() {
            close_when_unused(old.cache().clone());
        }
        if let Some(policy) = outgoing_policy {
            log_replay_stats(&policy);
        }
        if !same_access_log(old.access_log(), &access_log) {
            // The old generation's requests in flight still write to it;
            // its writer ends once they are done. Push out what is queued.
            let outgoing = old.access_log().clone();
            tokio::task::spawn_blocking(move || outgoing.flush(std::time::Duration::from_secs(5)));
        }
        Ok(ReloadReport {
            generation: state.generation,
            changed,
            warnings,
        })
    }

    /// The config its source gives now, validated.
    fn read_config(&self, running: &Config) -> Result<Config, Vec<String>> {
        match &self.source {
            Some(source) => source.load().map_err(|e| config_errors(&e)),
            None => Ok(running.clone()),
        }
    }
}

/// What the runtime needs to load the configured policy.
pub(crate) fn policy_source(pc: &PolicyConfig) -> PolicySource {
    PolicySource {
        path: pc.path.clone(),
        config: pc.config.clone(),
        limits: PolicyLimits {
            cpu_time_ms: pc.cpu_time.as_millis().max(1) as u64,
            memory: pc.memory,
            max_host_calls: pc.max_host_calls,
            max_subrequests: pc.max_subrequests,
            max_subrequest_bytes: pc.max_subrequest_bytes,
            max_instances: pc.max_instances,
            instance_wait_ms: u64::try_from(pc.instance_wait.as_millis()).unwrap_or(u64::MAX),
            host_wait_ms: u64::try_from(pc.host_wait.as_millis()).unwrap_or(u64::MAX),
            ..PolicyLimits::default()
        },
        prewarm: pc.prewarm,
        pre_instantiate: pc.pre_instantiate,
        memo_bytes: usize::try_from(pc.memo_size).unwrap_or(usize::MAX),
        replay_measured: !pc.replay_always,
        requests_per_instance: pc.requests_per_instance,
        instance_lifetime: pc.instance_lifetime,
        name: pc
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "policy".into()),
    }
}

/// The slot of `cfg`'s policy, loaded (compiled, pre-instantiated,
/// pre-warmed); `None` without `[policy]`.
pub(crate) async fn load_policy(cfg: &Config) -> anyhow::Result<Option<Arc<PolicySlot>>> {
    let Some(pc) = &cfg.policy else {
        info!("no policy: built-in rules (as Varnish's built-in VCL)");
        return Ok(None);
    };
    let source = policy_source(pc);
    let engine = PolicyEngine::new(&source.limits)
        .with_context(|| format!("cannot set up the policy runtime for {}", pc.path.display()))?;
    let slot = PolicySlot::load(&engine, source)
        .await
        .with_context(|| format!("cannot load policy {}", pc.path.display()))?;
    Ok(Some(Arc::new(slot)))
}

/// What a reload does to the cache.
enum CacheChange {
    /// Nothing (or only its rules, which every generation has its own of).
    Same,
    /// The running store takes these bounds.
    Bounds {
        /// `cache.memory_size`.
        memory: u64,
        /// `cache.disk_size`.
        disk: u64,
    },
    /// A new cache on a store opened at the new `cache.dir`.
    Moved(HttpCache),
}

/// A cache opened for a reload, closed again if the reload drops it unused.
struct MovedCache(Option<HttpCache>);

impl Drop for MovedCache {
    fn drop(&mut self) {
        if let Some(cache) = self.0.take() {
            close_when_unused(cache);
        }
    }
}

/// What the cache settings of `new` need, checked, with the new store
/// opened (on the blocking pool) if `cache.dir` changed; or why `new`
/// cannot apply, one error per key.
async fn prepare_cache(
    current: &HttpCache,
    old: &Config,
    new: &Config,
) -> Result<CacheChange, Vec<String>> {
    let (o, n) = (&old.cache, &new.cache);
    let moved = o.dir != n.dir;
    if !moved && o.memory_size == n.memory_size && o.disk_size == n.disk_size {
        return Ok(CacheChange::Same);
    }
    let sc = new.cache.store_config();
    check_bounds(&sc)?;
    if !moved {
        return Ok(CacheChange::Bounds {
            memory: n.memory_size,
            disk: n.disk_size,
        });
    }
    let where_ = match &n.dir {
        Some(dir) => format!("cannot open {}", dir.display()),
        None => "cannot open a memory-only cache".to_owned(),
    };
    let (current, rules) = (current.clone(), new.cache_rules());
    let opened = tokio::task::spawn_blocking(move || {
        let store = TieredStore::open(sc).map_err(|e| format!("{where_}: {e}"))?;
        let store = CacheStore::from_tiered(Arc::new(store));
        // On failure the store closes here, on this blocking thread.
        current
            .with_store(store, rules)
            .map_err(|e| format!("{where_}: cannot carry the bans over: {e}"))
    })
    .await
    .unwrap_or_else(|e| Err(format!("cannot open the cache: {e}")));
    match opened {
        Ok(cache) => Ok(CacheChange::Moved(cache)),
        Err(e) => Err(vec![format!("cache.dir: {e}")]),
    }
}

/// The store's own checks of the sizes in `sc`, one error per key.
fn check_bounds(sc: &StoreConfig) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    if let Err(e) = StoreConfig::memory_only(sc.memory_bytes).validate() {
        errors.push(format!("cache.memory_size: {e}"));
    }
    let disk = StoreConfig {
        memory_bytes: StoreConfig::default().memory_bytes,
        ..sc.clone()
    };
    if let Err(e) = disk.validate() {
        errors.push(format!("cache.disk_size: {e}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// How often a replaced cache's store checks whether it is still in use.
const CLOSE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Close `cache`'s store once nothing else holds it (the old generation's
/// last request is done, the admin API has moved on): the store flushes
/// and joins its maintenance thread as it drops, which must not run on a
/// reactor thread, so the last handle is dropped on the blocking pool.
fn close_when_unused(cache: HttpCache) {
    let Some(store) = cache.store().tiered().cloned() else {
        return;
    };
    drop(cache);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        // Outside the runtime, blocking here is fine.
        drop(store);
        return;
    };
    rt.spawn(async move {
        let mut store = store;
        let store = loop {
            match Arc::try_unwrap(store) {
                Ok(last) => break last,
                Err(shared) => {
                    store = shared;
                    tokio::time::sleep(CLOSE_POLL).await;
                }
            }
        };
        if tokio::task::spawn_blocking(move || drop(store))
            .await
            .is_ok()
        {
            info!("the previous cache store is closed");
        }
    });
}

/// The certificates of `cfg`'s `[[server.tls]]`, read from their files by
/// the resolve step (so that renewed certificates are served). The TLS listeners are the
/// running ones (a reload does not move them): a config that leaves them
/// without a certificate is refused.
fn tls_certificates(
    cfg: &Config,
    resolved: &mut inlay_listener::CertificateSet,
) -> Result<inlay_listener::CertificateSet, Vec<String>> {
    let first = (cfg
        .server
        .listen_tls
        .first()
        .map(|a| format!("https://{a}")))
    .or_else(|| {
        cfg.server
            .listen_quic
            .first()
            .map(|a| format!("quic://{a}"))
    });
    if let Some(first) = first
        && cfg.server.tls.is_empty()
    {
        return Err(vec![format!(
            "server.tls: the running listener {first} needs a certificate, and a reload does not close it"
        )]);
    }
    Ok(std::mem::take(resolved))
}

/// Log how the outgoing policy generation's requests got their
/// instances, and how its hooks were answered.
pub(crate) fn log_replay_stats(policy: &LoadedPolicy) {
    let used = policy.instance_stats();
    info!(
        policy = %policy.name(),
        generation = policy.generation(),
        requests = used.requests,
        ran_guest = used.ran_guest,
        instantiated = used.instantiated,
        reused = used.reused,
        "policy instances used"
    );
    if let Some(stats) = policy.memo_stats() {
        info!(
            policy = %policy.name(),
            generation = policy.generation(),
            replayed = stats.replayed,
            live = stats.live,
            resets = stats.resets,
            bytes = stats.bytes,
            unreplayed = stats.unreplayed,
            "policy hooks replayed from recorded paths"
        );
    }
}

/// One line per problem, each with its key path when it has one.
fn config_errors(e: &ConfigError) -> Vec<String> {
    match e {
        ConfigError::Invalid(issues) => issues
            .iter()
            .map(|i| format!("{}: {}", i.path, i.message))
            .collect(),
        other => vec![other.to_string()],
    }
}

/// Put back the running values of the settings a reload cannot change,
/// and say which of them the file changed.
fn keep_restart_only(old: &Config, new: &mut Config) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut note = |key: &str, changed: bool| {
        if changed {
            warnings.push(format!("{key} changed: {RESTART_ONLY}"));
        }
    };
    note(
        "server.listen",
        restore(&old.server.listen, &mut new.server.listen)
            | restore(&old.server.listen_tls, &mut new.server.listen_tls)
            | restore(&old.server.listen_h2c, &mut new.server.listen_h2c)
            | restore(&old.server.listen_quic, &mut new.server.listen_quic),
    );
    note("admin.listen", restore(&old.admin, &mut new.admin));
    // The NATS connection and the node's identity in the cluster are made
    // once, before the node serves.
    note("cluster", restore(&old.cluster, &mut new.cluster));
    // A node replays the purges it missed against a store only at start,
    // before it serves: a store opened by a reload would serve what the
    // cluster purged while it was closed.
    if old.cluster.is_some() {
        note(
            "cache.dir (with [cluster])",
            restore(&old.cache.dir, &mut new.cache.dir),
        );
    }
    warnings
}

/// Puts `running` back in `new`; whether the file had changed it.
fn restore<T: PartialEq + Clone>(running: &T, new: &mut T) -> bool {
    let changed = running != new;
    new.clone_from(running);
    changed
}

/// The sections of `new` that differ from `old`.
fn changed_sections(old: &Config, new: &Config) -> Vec<String> {
    // The config types have no PartialEq; their Debug output shows every field.
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    let mut changed = Vec::new();
    let sections: [(&str, bool); 9] = [
        ("server", differs(&old.server, &new.server)),
        (
            "backends",
            differs(&old.backends, &new.backends)
                || differs(&old.directors, &new.directors)
                || old.default_backend != new.default_backend,
        ),
        ("log", differs(&old.log, &new.log)),
        ("cache", differs(&old.cache, &new.cache)),
        ("compression", differs(&old.compression, &new.compression)),
        ("esi", differs(&old.esi, &new.esi)),
        ("policy", differs(&old.policy, &new.policy)),
        ("admin", old.admin != new.admin),
        ("websocket", old.websocket != new.websocket),
    ];
    for (name, differs) in sections {
        if differs {
            changed.push(name.to_owned());
        }
    }
    changed
}

/// A file is opened again at every reload (so that a rotated log moves on
/// to the new file); standard output and error only when the format changed.
fn needs_new_access_log(old: &Config, new: &Config) -> bool {
    matches!(new.log.access_log, AccessLogTarget::File(_))
        || old.log.access_log != new.log.access_log
        || old.log.access_log_format != new.log.access_log_format
}

fn same_access_log(a: &AccessLog, b: &AccessLog) -> bool {
    a.same_writer(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_limits_are_the_configs() {
        let c = Config::from_toml(
            "[backends.default]\naddress = \"http://127.0.0.1:8080\"\n[policy]\npath = \"p.wasm\"\nmax_subrequest_bytes = \"2MiB\"",
        )
        .unwrap();
        let source = policy_source(c.policy.as_ref().expect("policy"));
        assert_eq!(source.limits.max_subrequest_bytes, 2 << 20);
        assert_eq!(source.name, "p");
    }

    fn config(text: &str) -> Config {
        Config::from_toml(text).expect("valid")
    }

    const BASE: &str = "[server]\nlisten = [\"127.0.0.1:6081\"]\n\
        [backends.origin]\naddress = \"http://127.0.0.1:8080\"\n\
        [cache]\ndefault_ttl = \"2m\"\n";

    #[test]
    fn a_listener_change_is_kept_back_and_named() {
        let old = config(BASE);
        let mut new = config(&BASE.replace("6081", "6082").replace("2m", "5m"));
        let warnings = keep_restart_only(&old, &mut new);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("server.listen changed"));
        assert_eq!(new.server.listen, old.server.listen);
        // The rest applies.
        assert_eq!(new.cache.default_ttl, std::time::Duration::from_secs(300));
        assert_eq!(changed_sections(&old, &new), ["cache"]);
    }

    #[test]
    fn the_cache_store_settings_are_not_kept_back() {
        let old = config(BASE);
        let text = BASE.replace(
            "[cache]\n",
            "[cache]\ndir = \"/var/cache/x\"\nmemory_size = \"8MiB\"\ndisk_size = \"2MiB\"\n",
        );
        let mut new = config(&text);
        assert!(keep_restart_only(&old, &mut new).is_empty());
        assert_eq!(new.cache.memory_size, 8 << 20);
        assert_eq!(new.cache.disk_size, 2 << 20);
        assert!(new.cache.dir.is_some());
    }

    #[test]
    fn with_a_cluster_a_new_cache_dir_waits_for_a_restart() {
        let clustered = format!("{BASE}[cluster]\nnats_urls = [\"nats://127.0.0.1:4222\"]\n");
        let old = config(&clustered);
        let mut new = config(&clustered.replace("[cache]\n", "[cache]\ndir = \"/var/cache/x\"\n"));
        let warnings = keep_restart_only(&old, &mut new);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("cache.dir (with [cluster]) changed"),
            "{warnings:?}"
        );
        assert_eq!(new.cache.dir, None);
    }

    #[test]
    fn cache_bounds_the_store_refuses_are_errors_naming_their_key() {
        let mut cfg = config(&BASE.replace("[cache]\n", "[cache]\ndir = \"/x\"\n"));
        cfg.cache.disk_size = 1000;
        cfg.cache.memory_size = 1000;
        let errors = check_bounds(&cfg.cache.store_config()).expect_err("refused");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("cache.memory_size: "), "{errors:?}");
        assert!(errors[1].starts_with("cache.disk_size: "), "{errors:?}");
        // Without a directory the disk bound is not used.
        cfg.cache.dir = None;
        cfg.cache.memory_size = 1 << 20;
        assert!(check_bounds(&cfg.cache.store_config()).is_ok());
    }

    #[test]
    fn changed_sections_names_each_section_that_differs() {
        let old = config(BASE);
        assert!(changed_sections(&old, &config(BASE)).is_empty());
        let new = config(&format!(
            "{}\n[esi]\nmax_depth = 2\n",
            BASE.replace("8080", "8081")
        ));
        assert_eq!(changed_sections(&old, &new), ["backends", "esi"]);
        let new = config(&format!("{BASE}\n[compression]\nbr_level = 5\n"));
        assert_eq!(changed_sections(&old, &new), ["compression"]);
    }

    #[test]
    fn unchanged_backends_keep_their_clients_and_changed_ones_get_new() {
        let two = format!(
            "{}[backends.api]\naddress = \"http://127.0.0.1:9000\"\n",
            BASE.replace("backends.origin", "backends.default")
        );
        let metrics = crate::metrics::Metrics::new(true);
        let none = Default::default();
        let old =
            crate::backend::Backends::new(&config(&two), &Default::default(), &none, &metrics);
        let new = old.renewed(
            &config(&two.replace("9000", "9001")),
            &Default::default(),
            &none,
            &metrics,
        );
        let same = |name: &str| Arc::ptr_eq(old.get(name).unwrap(), new.get(name).unwrap());
        assert!(same("default"), "an unchanged backend keeps its pool");
        assert!(!same("api"), "a changed backend gets a new client");
        assert_eq!(
            new.get("api").unwrap().config().authority(),
            "127.0.0.1:9001"
        );
    }

    #[test]
    fn every_config_issue_is_one_error_with_its_key_path() {
        let text = format!("{BASE}[esi]\nmax_depth = \"deep\"\n[log]\nlevel = \"=bad=\"\n");
        let e = Config::from_toml(&text).expect_err("invalid");
        let errors = config_errors(&e);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.starts_with("esi.max_depth: ")));
        assert!(errors.iter().any(|e| e.starts_with("log.level: ")));
    }
}

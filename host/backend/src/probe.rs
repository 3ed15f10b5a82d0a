//! Health probes, as Varnish's `.probe`: one task per probed backend sends
//! `GET url` every `interval`, one probe at a time; the backend is healthy
//! while at least `threshold` of the last `window` probes were good (the
//! expected status within `timeout`). A sick backend gets no requests
//! ([`super::Backend::send`] refuses them), so the cache serves what it
//! may serve stale.
//!
//! A component backend's probe is served by its component in-process, as
//! its other requests are (without a way out: its outgoing requests are
//! refused), and drives its health the same way.
//!
//! The task ends when its backend is dropped (a reload that changed the
//! backend, once the old generation's last request ends): the backend owns
//! the [`ProbeTask`], whose drop cancels it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderValue, Request, Uri, header};
use hyper_util::client::legacy::Client;
use inlay_core::body::{self, ProxyBody};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, info, warn};

use super::tls::Connector;
use inlay_config::{BackendConfig, ProbeConfig};
use inlay_metrics::BackendMetrics;
use inlay_runtime::http_component::{HttpComponent, NoOutbound};

/// Longest probe outcome kept for `GET /stats`.
const MAX_OUTCOME: usize = 200;

/// A backend's health: the window of its latest probes, or always healthy
/// without a probe.
#[derive(Debug)]
pub struct Health {
    healthy: AtomicBool,
    probed: Option<Mutex<Window>>,
}

/// The latest probes, newest in bit 0.
#[derive(Debug, Clone)]
struct Window {
    bits: u64,
    size: u32,
    threshold: u32,
    /// What the last probe got, for the admin API.
    last: Option<String>,
}

impl Window {
    fn new(probe: &ProbeConfig, inherited: Option<u64>) -> Self {
        let initial = mask(probe.initial);
        Self {
            bits: inherited.unwrap_or(initial) & mask(probe.window),
            size: probe.window,
            threshold: probe.threshold,
            last: None,
        }
    }

    fn good(&self) -> u32 {
        self.bits.count_ones()
    }

    fn healthy(&self) -> bool {
        self.good() >= self.threshold
    }

    fn record(&mut self, good: bool) {
        self.bits = ((self.bits << 1) | u64::from(good)) & mask(self.size);
    }
}

fn mask(size: u32) -> u64 {
    if size >= 64 {
        u64::MAX
    } else {
        (1u64 << size) - 1
    }
}

impl Health {
    /// Always healthy: a backend without a probe.
    pub fn unprobed() -> Self {
        Self {
            healthy: AtomicBool::new(true),
            probed: None,
        }
    }

    /// The health of a backend probed with `probe`: `initial` good probes,
    /// or the window of `inherited` (the same backend before a reload).
    pub fn probed(probe: &ProbeConfig, inherited: Option<&Health>) -> Self {
        let bits = inherited.and_then(|h| h.probed.as_ref().map(|w| w.lock().bits));
        let window = Window::new(probe, bits);
        Self {
            healthy: AtomicBool::new(window.healthy()),
            probed: Some(Mutex::new(window)),
        }
    }

    /// Whether the backend may get requests.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// A probe's outcome; `Some(healthy)` when the health changed.
    fn record(&self, good: bool, outcome: String) -> Option<bool> {
        let window = self.probed.as_ref()?;
        let mut w = window.lock();
        w.record(good);
        w.last = Some(outcome);
        let now = w.healthy();
        (self.healthy.swap(now, Ordering::Relaxed) != now).then_some(now)
    }

    fn counts(&self) -> Option<(u32, u32, u32)> {
        let w = self.probed.as_ref()?.lock();
        Some((w.good(), w.size, w.threshold))
    }

    /// What the admin API shows: healthy, and for a probed backend the
    /// good probes in the window, the threshold and the last outcome.
    pub fn json(&self) -> Value {
        match &self.probed {
            None => json!({ "healthy": self.is_healthy(), "probe": false }),
            Some(w) => {
                let w = w.lock();
                json!({
                    "healthy": self.is_healthy(),
                    "probe": true,
                    "good": w.good(),
                    "window": w.size,
                    "threshold": w.threshold,
                    "last": w.last,
                })
            }
        }
    }
}

/// The running probe of one backend; dropping it stops the task.
#[derive(Debug)]
pub struct ProbeTask {
    _stop: DropGuard,
}

/// What a probe is sent through.
pub(crate) enum ProbeVia {
    /// The origin's client (boxed: it is large, and made once).
    Client(Box<Client<Connector, ProxyBody>>),
    /// The component backend's component, in-process.
    Component(HttpComponent),
}

/// Start probing `config`'s backend through `via`, recording in
/// `health` and the `healthy` gauge of `metrics`. `None` outside a tokio
/// runtime (nothing could run the probes: the health stays as it is).
pub(crate) fn start(
    config: &BackendConfig,
    probe: &ProbeConfig,
    via: ProbeVia,
    health: Arc<Health>,
    metrics: BackendMetrics,
) -> Option<ProbeTask> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        warn!(
            backend = config.name,
            "no runtime to run the health probe on: the backend's health stays as it starts"
        );
        return None;
    };
    let uri = match &via {
        ProbeVia::Client(_) => {
            let mut parts = config.address.clone().into_parts();
            parts.path_and_query = Some(probe.url.clone());
            Uri::from_parts(parts).ok()?
        }
        // A component gets a path and query, as its other requests.
        ProbeVia::Component(_) => Uri::from(probe.url.clone()),
    };
    let host = HeaderValue::from_str(
        config
            .host_header
            .clone()
            .unwrap_or_else(|| config.authority())
            .as_str(),
    )
    .ok();
    let stop = CancellationToken::new();
    let prober = Prober {
        name: config.name.clone(),
        uri,
        host,
        // Over HTTP/1 each probe opens a connection of its own, as
        // Varnish's: a kept-alive one would not see a listener that stopped
        // accepting. HTTP/2 forbids the field (and multiplexes).
        close: !config.http2 && matches!(via, ProbeVia::Client(_)),
        probe: probe.clone(),
        via,
        health,
        metrics,
    };
    let cancelled = stop.clone();
    runtime.spawn(async move {
        tokio::select! {
            () = prober.run() => {}
            () = cancelled.cancelled() => {}
        }
    });
    Some(ProbeTask {
        _stop: stop.drop_guard(),
    })
}

struct Prober {
    name: String,
    uri: Uri,
    host: Option<HeaderValue>,
    close: bool,
    probe: ProbeConfig,
    via: ProbeVia,
    health: Arc<Health>,
    metrics: BackendMetrics,
}

impl Prober {
    async fn run(self) {
        let mut ticks = tokio::time::interval(self.probe.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let (good, outcome) = self.once().await;
            debug!(backend = self.name, good, outcome, "health probe");
            let Some(healthy) = self.health.record(good, outcome.clone()) else {
                continue;
            };
            self.metrics.set_healthy(healthy);
            let (good, window, threshold) = self.health.counts().unwrap_or_default();
            if healthy {
                info!(
                    backend = self.name,
                    good, window, threshold, "backend {} went healthy", self.name
                );
            } else {
                warn!(
                    backend = self.name,
                    good,
                    window,
                    threshold,
                    last = outcome,
                    "backend {} went sick",
                    self.name
                );
            }
        }
    }

    /// One probe: whether it was good, and what it got.
    async fn once(&self) -> (bool, String) {
        let mut req = Request::new(body::empty());
        *req.uri_mut() = self.uri.clone();
        if let Some(h) = &self.host {
            req.headers_mut().insert(header::HOST, h.clone());
        }
        if self.close {
            req.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let sent = async {
            match &self.via {
                ProbeVia::Client(client) => client
                    .request(req)
                    .await
                    .map(|r| r.status())
                    .map_err(|e| chain(&e)),
                ProbeVia::Component(c) => c
                    .serve(req, Arc::new(NoOutbound), self.probe.timeout)
                    .await
                    .map(|r| r.status())
                    .map_err(|e| e.to_string()),
            }
        };
        let answered = tokio::time::timeout(self.probe.timeout, sent).await;
        // The body is not read: dropping it closes the connection (or
        // stops the component's writing).
        let (good, outcome) = match answered {
            Err(_) => (
                false,
                format!("no response within {:?}", self.probe.timeout),
            ),
            Ok(Err(e)) => (false, e),
            Ok(Ok(status)) => (
                status.as_u16() == self.probe.expected_status,
                format!("status {}", status.as_u16()),
            ),
        };
        (good, truncate(outcome))
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_OUTCOME {
        let mut end = MAX_OUTCOME;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(window: u32, threshold: u32, initial: u32) -> ProbeConfig {
        ProbeConfig {
            url: "/".parse().unwrap(),
            interval: std::time::Duration::from_secs(5),
            timeout: std::time::Duration::from_secs(2),
            window,
            threshold,
            initial,
            expected_status: 200,
        }
    }

    #[test]
    fn varnish_defaults_start_sick_and_one_good_probe_makes_healthy() {
        let h = Health::probed(&probe(8, 3, 2), None);
        assert!(!h.is_healthy());
        assert_eq!(h.record(true, "status 200".into()), Some(true));
        assert!(h.is_healthy());
    }

    #[test]
    fn sick_once_fewer_than_threshold_of_the_window_are_good() {
        let h = Health::probed(&probe(8, 3, 8), None);
        // 8 good: 6 bad probes leave 2 good of 8, under the threshold.
        for i in 1..=5 {
            assert_eq!(h.record(false, "x".into()), None, "bad probe {i}");
        }
        assert_eq!(h.record(false, "x".into()), Some(false));
        // Back after `threshold` good ones (the bad ones are still in the window).
        assert_eq!(h.record(true, "x".into()), None);
        assert_eq!(h.record(true, "x".into()), None);
        assert_eq!(h.record(true, "x".into()), Some(true));
    }

    #[test]
    fn a_reloaded_backend_keeps_its_window() {
        let old = Health::probed(&probe(8, 3, 2), None);
        old.record(true, "x".into());
        let new = Health::probed(&probe(4, 3, 0), Some(&old));
        assert!(new.is_healthy(), "3 good kept in the smaller window");
        let window64 = Health::probed(&probe(64, 64, 64), None);
        assert!(window64.is_healthy());
        assert_eq!(window64.counts(), Some((64, 64, 64)));
    }

    #[test]
    fn outcomes_are_bounded() {
        assert_eq!(truncate("é".repeat(300)).len(), MAX_OUTCOME);
    }
}

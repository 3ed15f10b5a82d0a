//! The deadlines of a response being sent (`send_timeout`,
//! `idle_send_timeout`), and the HTTP/2 executor that gives each stream a
//! clock of its own.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::info;

use crate::limits::Limits;

/// `send_timeout` and `idle_send_timeout`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendLimits {
    total: Duration,
    idle: Duration,
}

impl SendLimits {
    pub(crate) fn of(limits: &Limits) -> Self {
        Self {
            total: limits.send_timeout,
            idle: limits.idle_send_timeout,
        }
    }
}

tokio::task_local! {
    /// The send clock of the HTTP/2 stream whose task is running.
    pub(crate) static STREAM_CLOCK: Arc<SendClock>;
}

/// Runs each HTTP/2 stream (hyper spawns one task per stream) with a send
/// clock of its own, and drops the stream when the clock expires: h2 then
/// resets that stream (RST_STREAM) and the connection goes on for the others.
#[derive(Clone, Copy)]
pub(crate) struct StreamExecutor(pub(crate) SendLimits);

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let clock = Arc::new(SendClock::new(self.0, true));
        tokio::spawn(STREAM_CLOCK.scope(clock.clone(), async move {
            tokio::select! {
                () = fut => {}
                why = clock.expired() => {
                    info!("HTTP/2 response not sent within {why}; stream reset");
                }
            }
        }));
    }
}

/// The deadlines of the response being sent on an HTTP/1 connection or an
/// HTTP/2 stream: `send_timeout` from its start, and (for HTTP/2, where
/// the socket may be busy with other streams) `idle_send_timeout` from the
/// moment a body chunk was handed over until the stream asks for the next.
/// An HTTP/1 connection's idle sending is watched on its socket instead
/// ([`Activity::write_blocked_for`](crate::activity::Activity::write_blocked_for)).
pub(crate) struct SendClock {
    born: Instant,
    limits: SendLimits,
    /// Whether a body that is not asked for its next chunk counts as idle.
    watch_handover: bool,
    /// When the response started, in ms since `born` plus one; 0: none.
    started: AtomicU64,
    /// When a chunk was handed over and not yet followed by a request for
    /// the next, as `started`; 0: the body is being asked.
    handed: AtomicU64,
    armed: tokio::sync::Notify,
}

impl SendClock {
    pub(crate) fn new(limits: SendLimits, watch_handover: bool) -> Self {
        Self {
            born: Instant::now(),
            limits,
            watch_handover,
            started: AtomicU64::new(0),
            handed: AtomicU64::new(0),
            armed: tokio::sync::Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64 + 1
    }

    /// A response starts: its head is handed to hyper.
    pub(crate) fn arm(&self) {
        let now = self.now();
        self.handed.store(now, Ordering::Relaxed);
        self.started.store(now, Ordering::Relaxed);
        self.armed.notify_one();
    }

    /// The body is asked for its next chunk.
    pub(crate) fn asked(&self) {
        self.handed.store(0, Ordering::Relaxed);
    }

    /// The body handed over a chunk.
    pub(crate) fn handed(&self) {
        self.handed.store(self.now(), Ordering::Relaxed);
    }

    /// The response is done (sent, failed, or dropped).
    pub(crate) fn disarm(&self) {
        self.started.store(0, Ordering::Relaxed);
        self.handed.store(0, Ordering::Relaxed);
    }

    /// Resolves when the armed response has taken too long, with the
    /// setting that expired.
    pub(crate) async fn expired(&self) -> &'static str {
        loop {
            let started = self.started.load(Ordering::Relaxed);
            if started == 0 {
                self.armed.notified().await;
                continue;
            }
            let now = self.now();
            let total = started + self.limits.total.as_millis() as u64;
            if now >= total {
                return "send_timeout";
            }
            let idle_ms = self.limits.idle.as_millis() as u64;
            let handed = self.handed.load(Ordering::Relaxed);
            let mut next = total;
            if self.watch_handover && handed != 0 {
                if now >= handed + idle_ms {
                    return "idle_send_timeout";
                }
                next = next.min(handed + idle_ms);
            } else if self.watch_handover {
                // A chunk handed over from now on expires after this at the earliest.
                next = next.min(now + idle_ms);
            }
            let wait = Duration::from_millis(next - now);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.armed.notified() => {}
            }
        }
    }
}

/// Disarms a response's send clock when its body is dropped.
pub(crate) struct ClockArm(pub(crate) Option<Arc<SendClock>>);

impl Drop for ClockArm {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.disarm();
        }
    }
}

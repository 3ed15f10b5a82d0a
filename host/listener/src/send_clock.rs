//! The deadlines of a response being sent (`send_timeout`,
//! `idle_send_timeout`), and the HTTP/2 executor that gives each stream a
//! clock of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tracing::info;

use crate::coarse;
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
            // The stream first: its response arms the clock.
            tokio::select! {
                biased;
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
///
/// The clock is armed, moved and disarmed by the response while the task
/// that owns it polls the response, and that task polls
/// [`expired`](Self::expired) right after: nothing wakes it. (It was a `Notify`, and
/// every response woke its own task, which tokio then yielded and handed a
/// wake-up to the other worker thread: two futex calls per request.)
pub(crate) struct SendClock {
    /// When it was made, on the fine clock and on the [`coarse`] one (whose
    /// milliseconds it counts in), for the timer's deadline.
    born: (Instant, u64),
    limits: SendLimits,
    /// Whether a body that is not asked for its next chunk counts as idle.
    watch_handover: bool,
    /// When the response started, on the coarse clock plus one; 0: none.
    started: AtomicU64,
    /// When a chunk was handed over and not yet followed by a request for
    /// the next, as `started`; 0: the body is being asked.
    handed: AtomicU64,
}

/// What a [`SendClock`] says now.
enum Due {
    /// No response is being sent.
    Idle,
    /// The setting that expired.
    Expired(&'static str),
    /// Not before this.
    At(Instant),
}

impl SendClock {
    pub(crate) fn new(limits: SendLimits, watch_handover: bool) -> Self {
        Self {
            born: (Instant::now(), coarse::now_ms()),
            limits,
            watch_handover,
            started: AtomicU64::new(0),
            handed: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        coarse::now_ms() + 1
    }

    /// A response starts: its head is handed to hyper.
    pub(crate) fn arm(&self) {
        let now = self.now();
        self.handed.store(now, Ordering::Relaxed);
        self.started.store(now, Ordering::Relaxed);
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

    fn due(&self) -> Due {
        let started = self.started.load(Ordering::Relaxed);
        if started == 0 {
            return Due::Idle;
        }
        let now = self.now();
        let total = started + self.limits.total.as_millis() as u64;
        if now >= total {
            return Due::Expired("send_timeout");
        }
        let idle_ms = self.limits.idle.as_millis() as u64;
        let handed = self.handed.load(Ordering::Relaxed);
        let mut next = total;
        if self.watch_handover && handed != 0 {
            if now >= handed + idle_ms {
                return Due::Expired("idle_send_timeout");
            }
            next = next.min(handed + idle_ms);
        } else if self.watch_handover {
            // A chunk handed over from now on expires after this at the earliest.
            next = next.min(now + idle_ms);
        }
        let (instant, ms) = self.born;
        Due::At(instant + Duration::from_millis((next - 1).saturating_sub(ms)))
    }

    /// Resolves when the armed response has taken too long, with the
    /// setting that expired. To be polled by the task that polls the
    /// response, after it (a `biased` select).
    pub(crate) fn expired(&self) -> Expired<'_> {
        Expired {
            clock: self,
            sleep: None,
        }
    }
}

/// The future of [`SendClock::expired`]: a timer only while a response is
/// being sent and polled without finishing.
pub(crate) struct Expired<'a> {
    clock: &'a SendClock,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Expired<'_> {
    type Output = &'static str;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<&'static str> {
        loop {
            let at = match self.clock.due() {
                Due::Idle => {
                    // Armed by the response, which the owning task polls
                    // before this: no wake-up to wait for.
                    self.sleep = None;
                    return Poll::Pending;
                }
                Due::Expired(why) => return Poll::Ready(why),
                Due::At(at) => tokio::time::Instant::from_std(at),
            };
            let sleep = match &mut self.sleep {
                Some(sleep) => {
                    if sleep.deadline() != at {
                        sleep.as_mut().reset(at);
                    }
                    sleep
                }
                None => self.sleep.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(total_ms: u64, idle_ms: u64, watch_handover: bool) -> SendClock {
        let limits = SendLimits {
            total: Duration::from_millis(total_ms),
            idle: Duration::from_millis(idle_ms),
        };
        SendClock::new(limits, watch_handover)
    }

    /// What `expired` says within `within` (`None`: nothing).
    async fn expired_within(clock: &SendClock, within: Duration) -> Option<&'static str> {
        tokio::time::timeout(within, clock.expired()).await.ok()
    }

    #[tokio::test]
    async fn a_response_expires_at_send_timeout_and_no_response_never_does() {
        let c = clock(100, 10_000, false);
        assert_eq!(expired_within(&c, Duration::from_millis(200)).await, None);
        let armed = Instant::now();
        c.arm();
        let why = expired_within(&c, Duration::from_secs(5)).await;
        assert_eq!(why, Some("send_timeout"));
        // Not before send_timeout, less the coarse clock's tick (4 ms here,
        // at most 10).
        assert!(
            armed.elapsed() >= Duration::from_millis(90),
            "{:?}",
            armed.elapsed()
        );
        c.disarm();
        assert_eq!(expired_within(&c, Duration::from_millis(200)).await, None);
    }

    #[tokio::test]
    async fn an_h2_stream_whose_chunk_is_not_taken_expires_at_idle_send_timeout() {
        let c = clock(10_000, 100, true);
        c.arm();
        c.handed();
        let why = expired_within(&c, Duration::from_secs(5)).await;
        assert_eq!(why, Some("idle_send_timeout"));
        // A body that is asked for more is not idle.
        let c = clock(10_000, 100, true);
        c.arm();
        c.asked();
        assert_eq!(expired_within(&c, Duration::from_millis(300)).await, None);
    }
}

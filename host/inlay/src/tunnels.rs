//! Tunnels (WebSockets, and the other upgrades `[websocket]` allows): how
//! many are open against `websocket.max_tunnels`, what they moved (a
//! collector for `GET /metrics`), and the copy of bytes both ways with its
//! idle timeout (the copy is `inlay_listener::copy_both_ways`: no buffer
//! held while nothing moves). The
//! pipeline's `tunnel` phase opens them; this module knows nothing of HTTP.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::metrics::{Figures, Metrics};

/// The process's tunnels, shared by every pipeline generation.
#[derive(Debug, Default)]
pub struct Tunnels {
    open: AtomicUsize,
    opened: AtomicU64,
    refused: AtomicU64,
    to_backend: AtomicU64,
    to_client: AtomicU64,
}

/// One open tunnel's place in [`Tunnels`]; it is given back when dropped.
#[derive(Debug)]
pub struct TunnelSlot(Arc<Tunnels>);

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Tunnels {
    /// A place for one more tunnel, if fewer than `max` are open or being
    /// opened (a refusal is counted).
    pub fn try_open(self: &Arc<Self>, max: usize) -> Option<TunnelSlot> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Some(TunnelSlot(Arc::clone(self))),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Tunnels open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// The collector of their figures, written while `metrics` counts.
    pub fn figures(self: &Arc<Self>, metrics: &Arc<Metrics>) -> Box<dyn Collector> {
        Box::new(TunnelFigures {
            tunnels: Arc::clone(self),
            metrics: Arc::clone(metrics),
        })
    }
}

/// How a tunnel ended.
#[derive(Debug)]
pub enum TunnelEnd {
    /// Both sides closed (or one side's error ended it: `Some`).
    Ended(Option<std::io::Error>),
    /// No byte moved either way for the idle timeout.
    Idle(Duration),
    /// Closed from outside (a drain, a reload), for this reason.
    Stopped(&'static str),
}

/// What a tunnel moved: bytes from the client to the backend, and back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Read from the client, written to the backend.
    pub to_backend: u64,
    /// Read from the backend, written to the client.
    pub to_client: u64,
}

/// Copy bytes between `client` and `backend` both ways until both have
/// closed, one fails, nothing moves for `idle`, or `close` resolves (with
/// its reason); what moved is counted in `tunnels` as it goes.
pub async fn carry<C, B>(
    client: C,
    backend: B,
    tunnels: &Tunnels,
    idle: Duration,
    close: impl Future<Output = &'static str>,
) -> (TunnelEnd, Moved)
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tunnels.opened.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let last = AtomicU64::new(0);
    let moved_to_backend = AtomicU64::new(0);
    let moved_to_client = AtomicU64::new(0);
    let mut client = Counted {
        inner: client,
        started,
        last: &last,
        read: &moved_to_backend,
        total: &tunnels.to_backend,
    };
    let mut backend = Counted {
        inner: backend,
        started,
        last: &last,
        read: &moved_to_client,
        total: &tunnels.to_client,
    };
    let end = tokio::select! {
        copied = inlay_listener::copy_both_ways(&mut client, &mut backend) => {
            TunnelEnd::Ended(copied.err())
        }
        () = idle_for(idle, started, &last) => TunnelEnd::Idle(idle),
        why = close => TunnelEnd::Stopped(why),
    };
    let moved = Moved {
        to_backend: moved_to_backend.load(Ordering::Relaxed),
        to_client: moved_to_client.load(Ordering::Relaxed),
    };
    (end, moved)
}

/// Resolves once nothing has moved for `limit` (the last move, in ms
/// since `started`, is in `last`).
async fn idle_for(limit: Duration, started: Instant, last: &AtomicU64) {
    loop {
        let moved = started + Duration::from_millis(last.load(Ordering::Relaxed));
        let until = moved + limit;
        if Instant::now() >= until {
            return;
        }
        tokio::time::sleep_until(until).await;
    }
}

/// One side of a tunnel, counting what is read from it.
struct Counted<'a, T> {
    inner: T,
    started: Instant,
    /// When anything last moved, in ms since `started` (both sides share it).
    last: &'a AtomicU64,
    /// Bytes read from this side, by this tunnel ...
    read: &'a AtomicU64,
    /// ... and by every tunnel.
    total: &'a AtomicU64,
}

impl<T> Counted<'_, T> {
    fn moved(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            self.read.fetch_add(n, Ordering::Relaxed);
            self.total.fetch_add(n, Ordering::Relaxed);
            self.moved();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The tunnels' figures at a scrape.
struct TunnelFigures {
    tunnels: Arc<Tunnels>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for TunnelFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelFigures").finish_non_exhaustive()
    }
}

impl Collector for TunnelFigures {
    fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
        let t = &self.tunnels;
        // Zero while counting is off, the names still there.
        let on = self.metrics.enabled();
        let read = |n: &AtomicU64| if on { n.load(Ordering::Relaxed) } else { 0 };
        let mut f = Figures::new(encoder);
        f.gauge(
            "websocket_tunnels_open",
            "WebSocket (and other upgrade) tunnels open now",
            None,
            if on { t.open() as u64 } else { 0 },
        )?;
        f.counter(
            "websocket_tunnels",
            "Tunnels opened (the backend switched protocols)",
            read(&t.opened),
        )?;
        f.counter(
            "websocket_tunnels_refused",
            "Upgrades refused with a 503: websocket.max_tunnels were open",
            read(&t.refused),
        )?;
        f.counters_by(
            "websocket_bytes",
            "Bytes carried by tunnels, by direction",
            "direction",
            &[
                ("to_backend", read(&t.to_backend)),
                ("to_client", read(&t.to_client)),
            ],
        )?;
        Ok(())
    }
}

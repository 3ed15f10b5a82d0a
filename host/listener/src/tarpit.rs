//! The tarpit: connections refused for their address's share, held unread
//! until their time, and the thread that closes them.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use tracing::warn;

/// Connections refused because their address holds its
/// `max_connections_per_client` already. Closed at once, they came back at
/// once: an attacker that reconnects whatever is closed made Inlay accept
/// and close tens of thousands a second, and that churn was the CPU its
/// other clients waited for. Held unread for `header_read_timeout`
/// instead, a refused connection costs one descriptor and no work until
/// it is closed. At most `tarpit_max` are held (the oldest is closed for a
/// new one; zero closes refused connections at once), so the descriptors
/// it takes stay bounded.
///
/// Held connections are out of the reactor (nothing is read from them),
/// and they are closed by a thread of their own ([`Closer`]): on loopback
/// a `close` also runs the peer's side of the FIN, and the sweep closed a
/// few hundred at a time on the thread that accepts and answers everyone,
/// a stall of milliseconds four times a second.
pub(crate) struct Tarpit {
    held: Mutex<VecDeque<(Instant, TcpStream)>>,
    /// Told when a connection is held in an empty tarpit: the sweeper
    /// sleeps while there is nothing to sweep.
    held_first: tokio::sync::Notify,
    /// `tarpit_max` (or what the open-file limit leaves), followed at
    /// every change of the limits.
    pub(crate) max: AtomicUsize,
    closer: Closer,
}

impl Tarpit {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            held: Mutex::default(),
            held_first: tokio::sync::Notify::new(),
            max: AtomicUsize::new(max),
            closer: Closer::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, TcpStream)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold `stream` until `until` (or until it is the oldest of a full
    /// tarpit).
    pub(crate) fn hold(&self, stream: TcpStream, until: Instant) {
        let max = self.max.load(Ordering::Relaxed);
        let mut gone = Vec::new();
        let first = {
            let mut held = self.lock();
            // A lowered bound is applied here, oldest first.
            while !held.is_empty() && held.len() >= max {
                gone.extend(held.pop_front().map(|(_, s)| s));
            }
            if max > 0 {
                held.push_back((until, stream));
            } else {
                gone.push(stream);
            }
            held.len() == 1
        };
        if first {
            self.held_first.notify_one();
        }
        self.closer.close(gone);
    }

    /// Close held connections as their time comes, looking every
    /// [`SWEEP`] while any is held; runs until dropped.
    pub(crate) async fn sweep_forever(&self) {
        loop {
            if self.lock().is_empty() {
                self.held_first.notified().await;
            }
            tokio::time::sleep(SWEEP).await;
            self.sweep(Instant::now());
        }
    }

    /// Close the connections held past their time.
    pub(crate) fn sweep(&self, now: Instant) {
        let mut gone = Vec::new();
        {
            let mut held = self.lock();
            while held.front().is_some_and(|(until, _)| *until <= now) {
                gone.extend(held.pop_front().map(|(_, s)| s));
            }
        }
        self.closer.close(gone);
    }

    /// Close the `n` oldest connections held, and those waiting for the
    /// closing thread, here and now (the process is out of descriptors);
    /// how many were closed.
    pub(crate) fn shed(&self, n: usize) -> usize {
        let oldest: Vec<_> = {
            let mut held = self.lock();
            let n = n.min(held.len());
            held.drain(..n).map(|(_, s)| s).collect()
        };
        oldest.len() + self.closer.take_pending().len()
    }

    /// Close every connection held (at shutdown).
    pub(crate) fn clear(&self) {
        let gone = std::mem::take(&mut *self.lock());
        self.closer
            .close(gone.into_iter().map(|(_, s)| s).collect());
    }
}

/// How often the connections held are looked at. Often: the clients
/// closed by one sweep come back at once, and every 250 ms that was a
/// burst of a few hundred connections for the accept loop, milliseconds
/// during which a normal client's new connection waited behind them.
const SWEEP: std::time::Duration = std::time::Duration::from_millis(10);

/// Connections waiting for the closing thread at most: refused
/// connections take at most `tarpit_max` and this many descriptors
/// (counted in [`crate::open_files::needed`]).
pub(crate) const CLOSER_BACKLOG: usize = 1024;

/// Closes connections on a thread of its own, off the runtime's workers,
/// at the lowest priority (nice 19): it runs when the workers wait. The
/// thread starts with the first connection to close. What it has not
/// closed yet is bounded ([`CLOSER_BACKLOG`]); past that (or if the thread
/// could not start) the caller closes them itself, so descriptors never
/// pile up.
#[derive(Default)]
struct Closer {
    shared: OnceLock<Option<Arc<CloserQueue>>>,
}

#[derive(Default)]
struct CloserQueue {
    pending: Mutex<Pending>,
    ready: Condvar,
}

#[derive(Default)]
struct Pending {
    streams: Vec<TcpStream>,
    /// Set when the tarpit is dropped: the thread closes what is left and ends.
    done: bool,
}

impl CloserQueue {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The closing thread: closes what is queued until the tarpit is gone.
    fn run(&self) {
        crate::socket::idle_priority();
        loop {
            let (batch, done) = {
                let mut pending = self.lock();
                while pending.streams.is_empty() && !pending.done {
                    pending = self.ready.wait(pending).unwrap_or_else(|e| e.into_inner());
                }
                (std::mem::take(&mut pending.streams), pending.done)
            };
            drop(batch);
            if done {
                return;
            }
        }
    }
}

impl Closer {
    /// The closing thread's queue, the thread started on the first call.
    fn queue(&self) -> Option<&Arc<CloserQueue>> {
        self.shared
            .get_or_init(|| {
                let shared = Arc::new(CloserQueue::default());
                let queue = shared.clone();
                let started = std::thread::Builder::new()
                    .name("inlay-closer".into())
                    .spawn(move || queue.run());
                match started {
                    Ok(_) => Some(shared),
                    Err(error) => {
                        warn!(%error, "cannot start the thread that closes refused connections; the accept loop closes them");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// What waits for the closing thread, taken back (the caller drops it).
    fn take_pending(&self) -> Vec<TcpStream> {
        self.shared
            .get()
            .and_then(Option::as_ref)
            .map(|queue| std::mem::take(&mut queue.lock().streams))
            .unwrap_or_default()
    }

    /// Closes `batch` on the closing thread, or here when it is too far
    /// behind (or missing).
    fn close(&self, batch: Vec<TcpStream>) {
        if batch.is_empty() {
            return;
        }
        let Some(queue) = self.queue() else {
            return;
        };
        let mut pending = queue.lock();
        if pending.streams.len() + batch.len() > CLOSER_BACKLOG {
            // Closed here as `batch` drops, after the lock: the thread is
            // that far behind.
            return;
        }
        let was_empty = pending.streams.is_empty();
        pending.streams.extend(batch);
        drop(pending);
        if was_empty {
            queue.ready.notify_one();
        }
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        if let Some(Some(queue)) = self.shared.get() {
            queue.lock().done = true;
            queue.ready.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt as _;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connected pair: the client's end and the server's (as the accept
    /// loop has it, out of the reactor).
    async fn pair(listener: &TcpListener) -> (TcpStream, std::net::TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, server) = tokio::join!(client, listener.accept());
        (client.unwrap(), server.unwrap().0.into_std().unwrap())
    }

    /// Whether the server closed `client` (EOF or reset; within 2 s: the tarpit's
    /// closes run on a thread of their own).
    async fn closed(client: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), client.read(&mut b));
        matches!(read.await, Ok(Ok(0) | Err(_)))
    }

    /// Whether `client` is still open 200 ms on.
    async fn open(client: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(200), client.read(&mut b));
        read.await.is_err()
    }

    #[tokio::test]
    async fn the_tarpit_holds_refused_connections_until_their_time_and_no_more_than_its_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tarpit = Tarpit::new(2);
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let (mut first, s1) = pair(&listener).await;
        let (mut second, s2) = pair(&listener).await;
        let (mut third, s3) = pair(&listener).await;
        tarpit.hold(s1, now + Duration::from_millis(1));
        tarpit.hold(s2, later);
        assert!(open(&mut first).await, "held, not closed at once");
        // Past its time, the sweep closes it; the other stays.
        tarpit.sweep(now + Duration::from_secs(1));
        assert!(closed(&mut first).await);
        assert!(open(&mut second).await);
        // Full: the oldest goes for a new one.
        tarpit.hold(s3, later);
        let (mut fourth, s4) = pair(&listener).await;
        tarpit.hold(s4, later);
        assert!(closed(&mut second).await, "the oldest of a full tarpit");
        assert!(open(&mut third).await && open(&mut fourth).await);
        // A lowered bound (`tarpit_max` after a reload) closes the oldest
        // at the next hold; zero holds nothing.
        tarpit.max.store(1, Ordering::Relaxed);
        let (mut fifth, s5) = pair(&listener).await;
        tarpit.hold(s5, later);
        assert!(closed(&mut third).await && closed(&mut fourth).await);
        assert!(open(&mut fifth).await);
        tarpit.max.store(0, Ordering::Relaxed);
        let (mut sixth, s6) = pair(&listener).await;
        tarpit.hold(s6, later);
        assert!(closed(&mut fifth).await && closed(&mut sixth).await);
        tarpit.max.store(2, Ordering::Relaxed);
        let (mut seventh, s7) = pair(&listener).await;
        tarpit.hold(s7, later);
        // Out of descriptors: the oldest go at once, on the caller's thread.
        let (mut eighth, s8) = pair(&listener).await;
        tarpit.hold(s8, later);
        assert_eq!(tarpit.shed(1), 1);
        assert!(closed(&mut seventh).await);
        assert!(open(&mut eighth).await);
        tarpit.clear();
        assert!(closed(&mut eighth).await);
    }

    #[tokio::test]
    async fn the_sweeper_wakes_for_the_first_connection_held() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tarpit = Arc::new(Tarpit::new(10));
        let sweeper = tokio::spawn({
            let tarpit = tarpit.clone();
            async move { tarpit.sweep_forever().await }
        });
        // Nothing held: it sleeps until something is.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (mut client, s) = pair(&listener).await;
        tarpit.hold(s, Instant::now() + Duration::from_millis(100));
        assert!(closed(&mut client).await, "swept at its time");
        sweeper.abort();
    }

    #[test]
    fn the_closing_thread_starts_with_the_first_connection_to_close() {
        let tarpit = Tarpit::new(10);
        tarpit.sweep(Instant::now());
        tarpit.clear();
        assert!(tarpit.closer.shared.get().is_none(), "nothing to close yet");
    }
}

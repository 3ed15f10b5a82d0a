//! What a connection's timers read: when it last moved bytes, how many
//! requests are open on it, and since when a write waits for the client
//! ([`Activity`]); the socket wrapper that records it ([`TrackedIo`]) and
//! the response body that counts as in flight ([`GuardedBody`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::coarse;
use crate::send_clock::{ClockArm, SendClock};

/// When the connection last moved bytes, how many requests are open on
/// it, and since when a write has been waiting for the client to read.
#[derive(Debug)]
pub(crate) struct Activity {
    /// When it last moved bytes, on the [`coarse`](crate::coarse) clock.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// When a write found the socket full, on the coarse clock plus one;
    /// 0 when the last write went through.
    blocked_since: AtomicU64,
    /// HTTP/2: idle means no stream for `idle_timeout`, whatever else moves.
    h2: AtomicBool,
    /// Tunnels open on it ([`TunnelGuard`](crate::TunnelGuard)s).
    tunnels: AtomicUsize,
    /// Told when a tunnel closes.
    tunnel_closed: tokio::sync::Notify,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            last_ms: AtomicU64::new(coarse::now_ms()),
            in_flight: AtomicUsize::new(0),
            blocked_since: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            tunnels: AtomicUsize::new(0),
            tunnel_closed: tokio::sync::Notify::new(),
        }
    }
}

impl Activity {
    fn touch(&self) {
        self.last_ms.store(coarse::now_ms(), Ordering::Relaxed);
    }

    /// Bytes moved on the socket. On an HTTP/2 connection they do not
    /// count: PINGs (`h2_keep_alive_interval`), SETTINGS and WINDOW_UPDATEs
    /// would keep it open forever; only its streams do ([`InFlight`]).
    fn touch_io(&self) {
        if !self.h2.load(Ordering::Relaxed) {
            self.touch();
        }
    }

    /// The connection speaks HTTP/2 (its preface, or ALPN `h2`).
    pub(crate) fn set_h2(&self) {
        self.h2.store(true, Ordering::Relaxed);
    }

    /// A write went through (`written`) or found the socket full.
    fn wrote(&self, written: bool) {
        if written {
            self.touch_io();
            self.blocked_since.store(0, Ordering::Relaxed);
        } else if self.blocked_since.load(Ordering::Relaxed) == 0 {
            self.blocked_since
                .store(coarse::now_ms() + 1, Ordering::Relaxed);
        }
    }

    /// How long the pending write has waited for the client to read.
    pub(crate) fn write_blocked_for(&self) -> Duration {
        let since = self.blocked_since.load(Ordering::Relaxed);
        if since == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis((coarse::now_ms() + 1).saturating_sub(since))
    }

    /// How long nothing has moved and no request has been open.
    pub(crate) fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let last = self.last_ms.load(Ordering::Relaxed);
        Duration::from_millis(coarse::now_ms().saturating_sub(last))
    }
}

impl Activity {
    /// A tunnel opened on the connection.
    pub(crate) fn tunnel_opened(&self) {
        self.tunnels.fetch_add(1, Ordering::AcqRel);
    }

    /// A tunnel closed.
    pub(crate) fn tunnel_closed(&self) {
        self.tunnels.fetch_sub(1, Ordering::AcqRel);
        self.tunnel_closed.notify_waiters();
    }

    /// Resolves once no tunnel is open on the connection.
    pub(crate) async fn tunnels_closed(&self) {
        loop {
            let closed = self.tunnel_closed.notified();
            tokio::pin!(closed);
            // Registered before the count is read: a close in between wakes it.
            closed.as_mut().enable();
            if self.tunnels.load(Ordering::Acquire) == 0 {
                return;
            }
            closed.await;
        }
    }
}

/// Counts a request as open until its response body is finished or dropped.
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(crate) fn new(a: Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(a)
    }

    /// The response body, counted in flight and timed by `clock`.
    pub(crate) fn attach<B: http_body::Body>(
        self,
        body: B,
        clock: Option<Arc<SendClock>>,
    ) -> GuardedBody<B> {
        if let Some(c) = &clock {
            c.arm();
        }
        GuardedBody {
            inner: body,
            held_error: None,
            clock: ClockArm(clock),
            _guard: self,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A response body that counts as in flight, and that lets what was
    /// already sent reach the client before a body error aborts the response.
    ///
    /// hyper drops the connection as soon as a body yields an error, with
    /// what it still buffers: the head and the last chunks. A page whose ESI
    /// include failed at once would then reach the client as nothing at all,
    /// or as a head without its first bytes, depending on timing. So an error
    /// is held for one poll: the body answers `Pending` (and wakes itself),
    /// hyper flushes, and the next poll yields the error.
    pub(crate) struct GuardedBody<B: http_body::Body> {
        #[pin]
        inner: B,
        held_error: Option<B::Error>,
        clock: ClockArm,
        _guard: InFlight,
    }
}

impl<B> http_body::Body for GuardedBody<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let clock = this.clock.0.as_deref();
        if let Some(c) = clock {
            c.asked();
        }
        if let Some(e) = this.held_error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                *this.held_error = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(c) = clock {
                    c.handed();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
    fn is_end_stream(&self) -> bool {
        self.held_error.is_none() && self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A connection's socket, recording its [`Activity`].
    pub(crate) struct TrackedIo {
        #[pin]
        inner: TcpStream,
        activity: Arc<Activity>,
        // Read past the PROXY header: served before the socket.
        rest: Bytes,
        // Whether the first bytes were looked at for the h2c preface.
        sniffed: bool,
    }
}

impl TrackedIo {
    /// `inner`, whose first bytes are `rest` (read already).
    pub(crate) fn new(inner: TcpStream, activity: Arc<Activity>, rest: Bytes) -> Self {
        Self {
            inner,
            activity,
            rest,
            sniffed: false,
        }
    }
}

/// Writes `bufs` on the socket: at once, then, if it is full, when the
/// reactor says it is writable. At once, because a connection new to the
/// reactor is not known to be writable until the reactor's next turn,
/// and waiting for that held the response to a request read before the
/// connection joined the reactor for a turn of the event loop. With
/// `send` and `sendmsg`, not tokio's `writev`, which goes through the VFS
/// (the file's position lock, its checks, its write notification) before
/// it reaches the socket: in perf, the write path of a cached hit's
/// response 0.44 -> 0.29 µs.
fn poll_send(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    match send(stream, bufs) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        r => return Poll::Ready(r),
    }
    loop {
        std::task::ready!(stream.poll_write_ready(cx))?;
        // A WouldBlock clears the readiness: the next poll waits for it.
        match stream.try_io(tokio::io::Interest::WRITABLE, || send(stream, bufs)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

/// One `send` (one buffer) or `sendmsg` (several) on the socket, without
/// a SIGPIPE if the peer has gone.
fn send(stream: &TcpStream, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    let socket = socket2::SockRef::from(stream);
    match bufs {
        [one] => socket.send_with_flags(one, libc::MSG_NOSIGNAL),
        _ => socket.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL),
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let r = if this.rest.is_empty() {
            this.inner.poll_read(cx, buf)
        } else {
            let n = this.rest.len().min(buf.remaining());
            buf.put_slice(&this.rest.split_to(n));
            Poll::Ready(Ok(()))
        };
        let read = &buf.filled()[before..];
        if !*this.sniffed && read.len() >= H2C_PREFACE.len() {
            // The first read of a connection: an h2c client starts with its preface.
            *this.sniffed = true;
            if read.starts_with(H2C_PREFACE) {
                this.activity.set_h2();
            }
        }
        if !read.is_empty() {
            this.activity.touch_io();
        }
        r
    }
}

/// How an HTTP/2 client's first bytes start (RFC 9113, 3.4), as far as
/// it tells them from an HTTP/1 request.
const H2C_PREFACE: &[u8] = b"PRI * HTTP/2.0";

fn note_write(activity: &Activity, r: &Poll<io::Result<usize>>) {
    match r {
        Poll::Ready(Ok(n)) if *n > 0 => activity.wrote(true),
        Poll::Pending => activity.wrote(false),
        _ => {}
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let r = poll_send(&this.inner, cx, bufs);
        note_write(this.activity, &r);
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::io::AsyncReadExt as _;

    use super::*;

    #[tokio::test]
    async fn a_write_to_a_full_socket_waits_for_the_peer_and_loses_nothing() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let activity = Arc::new(Activity::default());
        let io = TrackedIo::new(server, activity.clone(), Bytes::new());
        tokio::pin!(io);
        // Two buffers a write (sendmsg) until the socket is full, with a
        // client that reads nothing yet.
        let (head, body) = (vec![1u8; 1000], vec![2u8; 63 * 1024]);
        let bufs = [io::IoSlice::new(&head), io::IoSlice::new(&body)];
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // What each write took: the start of (head, body), whole or cut.
        let mut writes = Vec::new();
        let mut sent = 0;
        let full = loop {
            match io.as_mut().poll_write_vectored(&mut cx, &bufs) {
                Poll::Ready(Ok(n)) => {
                    writes.push(n);
                    sent += n;
                }
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => break true,
            }
            if sent > 64 << 20 {
                break false;
            }
        };
        assert!(full, "64 MiB went into an unread socket");
        assert!(sent > 0);
        // The client reads; the writer waits for room and goes on, one
        // buffer a write (send).
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        let more = vec![3u8; 300 * 1024];
        // A write that never learns the socket has room hangs here.
        tokio::time::timeout(Duration::from_secs(10), async {
            io.write_all(&more).await.unwrap();
            io.shutdown().await.unwrap();
        })
        .await
        .expect("the writer resumes once the client reads");
        let got = reader.await.unwrap();
        assert_eq!(got.len(), sent + more.len());
        // In order: each write's part of (head, body), then `more`.
        let round: Vec<u8> = [head, body].concat();
        let mut rest = &got[..];
        for (i, n) in writes.into_iter().enumerate() {
            let (this, after) = rest.split_at(n);
            assert!(
                this == &round[..n],
                "write {i} of {n} bytes came out changed"
            );
            rest = after;
        }
        assert!(rest.iter().all(|&b| b == 3));
    }

    #[tokio::test]
    async fn the_first_write_goes_out_before_the_reactor_has_seen_the_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        // As the accept loop registers a connection (tokio's own accept
        // marks it ready; `from_std` does not).
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let server = TcpStream::from_std(server).unwrap();
        let activity = Arc::new(Activity::default());
        let io = TrackedIo::new(server, activity.clone(), Bytes::from_static(b"GET"));
        tokio::pin!(io);
        // Polled once, with no turn of the reactor in between.
        let mut polls = 0;
        let written = poll_fn(|cx| {
            polls += 1;
            Poll::Ready(io.as_mut().poll_write(cx, b"HTTP/1.1 200 OK\r\n"))
        })
        .await;
        assert!(matches!(written, Poll::Ready(Ok(17))), "{written:?}");
        assert_eq!(polls, 1);
        let mut got = [0u8; 17];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"HTTP/1.1 200 OK\r\n");
        // What was read before the connection joined the reactor comes first.
        let mut buf = [0u8; 8];
        let n = io.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET");
        assert_eq!(activity.write_blocked_for(), Duration::ZERO);
    }
}

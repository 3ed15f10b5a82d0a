//! Sockets and their options: binding with a backlog of our own, options
//! on listeners and accepted connections, and the closing thread's
//! priority. socket2 where it has the option; the two calls it lacks
//! (`TCP_DEFER_ACCEPT` and a thread's nice value) are the only `unsafe`
//! code here, in [`sys`].

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use bytes::Bytes;
use socket2::{Domain, SockRef, Socket, Type};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// A listening socket on `addr` whose kernel queue of connections not yet
/// accepted holds `backlog` (Linux caps it at `net.core.somaxconn`).
/// tokio's own `TcpListener::bind` asks for 128, as the standard library
/// does: under a connection flood that queue filled between two turns of
/// the accept loop and the kernel dropped the SYNs of normal clients, who
/// then waited a whole second for their retransmit.
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX))?;
    TcpListener::from_std(socket.into())
}

/// A new backlog for a listening socket (`listen_backlog` changed): Linux
/// applies a second `listen(2)` to the open listener. `prefix`: the
/// setting's (see [`Limits::setting_prefix`](crate::Limits::setting_prefix)).
pub(crate) fn relisten(listener: &impl AsFd, backlog: u32, prefix: &str) {
    let value = libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX);
    match SockRef::from(listener).listen(value) {
        Ok(()) => info!(
            backlog,
            "{prefix}listen_backlog applied to the open listener"
        ),
        Err(error) => warn!(%error, "cannot apply {prefix}listen_backlog to the open listener"),
    }
}

/// One connection from `listener` (non-blocking, close-on-exec, in one
/// `accept4`), not registered with the reactor.
pub(crate) fn accept(
    listener: &std::net::TcpListener,
) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    #[cfg(target_os = "linux")]
    let (socket, addr) =
        SockRef::from(listener).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
    #[cfg(not(target_os = "linux"))]
    let (socket, addr) = {
        let (socket, addr) = SockRef::from(listener).accept()?;
        socket.set_nonblocking(true)?;
        (socket, addr)
    };
    let peer = addr
        .as_socket()
        .ok_or_else(|| io::Error::other("accepted a connection that is not TCP/IP"))?;
    Ok((socket.into(), peer))
}

/// The options every connection accepted from `listener` takes: no Nagle
/// delay, and `tcp_notsent_lowat` (see [`notsent_lowat`]). Linux copies
/// them from the listener to each connection whose handshake completes
/// from then on, which then costs no system call ([`admitted`]).
pub(crate) fn listener_options(listener: &impl AsFd, notsent_lowat_bytes: u64) {
    #[cfg(target_os = "linux")]
    connection_options(&SockRef::from(listener), notsent_lowat_bytes);
    #[cfg(not(target_os = "linux"))]
    let _ = (listener, notsent_lowat_bytes);
}

/// The options of an admitted connection, unless it took them from its
/// listener ([`listener_options`]; `inherited`: it was queued after they
/// were set).
pub(crate) fn admitted(stream: &impl AsFd, notsent_lowat_bytes: u64, inherited: bool) {
    if !(inherited && cfg!(target_os = "linux")) {
        connection_options(&SockRef::from(stream), notsent_lowat_bytes);
    }
}

fn connection_options(socket: &SockRef<'_>, notsent_lowat_bytes: u64) {
    if let Err(error) = socket.set_tcp_nodelay(true) {
        debug!(%error, "cannot set TCP_NODELAY");
    }
    notsent_lowat(socket, notsent_lowat_bytes);
}

/// Bytes read from a new connection before it joins the reactor, at most.
/// A request head or a TLS ClientHello fits, most often.
const FIRST_READ: usize = 4096;

/// What the client sent already (`None`: nothing yet), read without
/// waiting from a connection in non-blocking mode. With
/// `TCP_DEFER_ACCEPT` a connection is accepted once its first bytes are
/// there: reading them now saves the turn of the event loop that a
/// registered connection waits before its first read. `Err` when the
/// client closed the connection without a byte, or it failed.
pub(crate) fn read_arrived(stream: &std::net::TcpStream) -> io::Result<Option<Bytes>> {
    let mut first = vec![0u8; FIRST_READ];
    match io::Read::read(&mut &*stream, &mut first) {
        Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(n) => {
            first.truncate(n);
            Ok(Some(Bytes::from(first)))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

/// `tcp_notsent_lowat`: the kernel takes at most `bytes` of a response
/// that it cannot send yet (Linux `TCP_NOTSENT_LOWAT`). Without it a write
/// goes on copying until the send buffer is full, and on a fast path the
/// kernel grows that buffer to megabytes: a client that announces a tiny
/// window and reads nothing (a slow reader asking for large objects) made
/// Inlay copy megabytes per connection into the kernel at once, one long
/// write after another on the thread that also accepts and answers
/// everybody else. Bytes in flight are not counted, so a client that
/// reads keeps its throughput; more is written when the unsent part falls
/// under `bytes`. Zero leaves the kernel's default.
fn notsent_lowat(socket: &SockRef<'_>, bytes: u64) {
    #[cfg(target_os = "linux")]
    if bytes > 0 {
        let value = u32::try_from(bytes).unwrap_or(i32::MAX as u32);
        if let Err(error) = socket.set_tcp_notsent_lowat(value) {
            debug!(%error, "cannot set TCP_NOTSENT_LOWAT");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (socket, bytes);
}

/// `defer_accept`: the kernel hands a connection to the accept loop once
/// its first bytes have come (or after `wait`), so connections that open
/// and send nothing (an idle flood) cost no accept, no slot and no close;
/// an attacker that reconnects whatever is closed gets `wait` between its
/// tries instead of a loop as fast as the CPUs go. HTTP and TLS clients
/// speak first, so they see no difference (nginx's `deferred`, HAProxy's
/// `defer-accept`). Zero turns it off.
///
/// Linux counts the wait in SYN-ACK retransmissions (after 1 s, 2 s, 4 s,
/// ...) and hands the connection over at the retransmission that ends it.
/// A wait of 3 s ends on the 2 s timer: a wait past 3 s ends on the 4 s
/// one, which the kernel's timer wheel rounds to 256 ms (at HZ=250), and
/// an idle flood's connections then came four times a second in bursts of
/// hundreds, a new client's connection queued behind each.
pub(crate) fn defer_accept(listener: &impl AsFd, wait: Duration) {
    #[cfg(target_os = "linux")]
    {
        let secs = if wait.is_zero() {
            0
        } else {
            libc::c_int::try_from(wait.as_secs().max(1)).unwrap_or(libc::c_int::MAX)
        };
        if let Err(error) = sys::set_tcp_option(listener, libc::TCP_DEFER_ACCEPT, secs) {
            warn!(%error, "cannot set TCP_DEFER_ACCEPT; idle connections are accepted at once");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (listener, wait);
}

/// Gives the calling thread the lowest priority (nice 19): the closes it
/// makes then wait for the runtime's workers instead of taking slices of a
/// millisecond and more from the threads that accept and answer everyone
/// (measured at a fair share), yet it still gets a little CPU when the
/// workers never rest, so what it holds is closed.
pub(crate) fn idle_priority() {
    #[cfg(target_os = "linux")]
    if let Err(error) = sys::lowest_priority() {
        debug!(%error, "cannot lower the closing thread's priority");
    }
}

/// The system calls socket2 does not make.
#[cfg(target_os = "linux")]
mod sys {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd as _};

    /// Sets the `IPPROTO_TCP` option `option` of `socket` to `value`.
    pub(super) fn set_tcp_option(
        socket: &impl AsFd,
        option: libc::c_int,
        value: libc::c_int,
    ) -> io::Result<()> {
        // SAFETY: setsockopt reads one c_int from our stack for a socket
        // the caller borrows (so it stays open) for the duration of the call.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::setsockopt(
                socket.as_fd().as_raw_fd(),
                libc::IPPROTO_TCP,
                option,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Nice 19 for the calling thread.
    pub(super) fn lowest_priority() -> io::Result<()> {
        // SAFETY: gettid and setpriority take and return integers only; on
        // Linux the nice value of PRIO_PROCESS with a thread id is that
        // thread's.
        #[allow(unsafe_code)]
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    /// How many of `n` connections to `listener`, none of them accepted,
    /// complete their handshake within a second each.
    async fn queued(listener: &TcpListener, n: usize) -> (usize, Vec<TcpStream>) {
        let addr = listener.local_addr().unwrap();
        let mut open = Vec::new();
        for _ in 0..n {
            match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => open.push(s),
                // A dropped SYN: the next try comes a second later.
                _ => break,
            }
        }
        (open.len(), open)
    }

    /// A flood of connections arriving faster than they are accepted waits
    /// in the kernel's queue: with tokio's default backlog (128) the SYNs
    /// past it were dropped and each such client lost a second.
    #[tokio::test]
    async fn the_listen_backlog_queues_a_burst_of_connections_and_a_reload_resizes_it() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 600).unwrap();
        let (n, held) = queued(&listener, 500).await;
        assert_eq!(n, 500, "connections queued before the first accept");
        drop(held);
        // `listen_backlog` lowered, then raised: a second listen(2) on the
        // open listener.
        let small = bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let (n, held) = queued(&small, 100).await;
        assert!(n < 100, "a backlog of 16 queued {n} connections");
        drop(held);
        while tokio::time::timeout(Duration::from_millis(50), small.accept())
            .await
            .is_ok()
        {}
        relisten(&small, 600, "server.");
        let (n, _held) = queued(&small, 500).await;
        assert_eq!(n, 500, "after the reload");
    }

    #[tokio::test]
    async fn accepted_connections_are_non_blocking_and_take_their_options() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = listener.local_addr().unwrap();
        listener_options(&listener, 4096);
        let mut client = TcpStream::connect(addr).await.unwrap();
        let std_listener = listener.into_std().unwrap();
        std_listener.set_nonblocking(false).unwrap();
        let (stream, peer) = accept(&std_listener).unwrap();
        assert_eq!(peer.ip(), addr.ip());
        let socket = SockRef::from(&stream);
        assert!(socket.nonblocking().unwrap());
        admitted(&stream, 4096, true);
        assert!(socket.tcp_nodelay().unwrap());
        #[cfg(target_os = "linux")]
        assert_eq!(socket.tcp_notsent_lowat().unwrap(), 4096);
        // Nothing sent yet: nothing read, without waiting.
        assert_eq!(read_arrived(&stream).unwrap(), None);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let first = read_arrived(&stream).unwrap();
        assert_eq!(first.as_deref(), Some(&b"GET / HTTP/1.1\r\n"[..]));
        drop(client);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(read_arrived(&stream).is_err(), "closed without a byte more");
    }
}

//! Bytes copied both ways between two streams, as tokio's
//! `copy_bidirectional` does (an end read on one side shuts the other's
//! write side, and the copy ends once both have), but with no buffer held
//! while nothing moves: a read lands in a buffer on the stack of the poll
//! and is written on at once; only what the other side does not take yet
//! is kept, on the heap, until it does. tokio's keeps two 8 KiB buffers
//! for the tunnel's whole life, which for ten thousand idle WebSockets is
//! 160 MiB of buffers that hold nothing.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes read at most per read (on the stack of the poll).
const READ: usize = 16 << 10;

/// Copy between `a` and `b` until both directions have ended; the bytes
/// copied from `a` to `b` and from `b` to `a`.
pub async fn both_ways<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    BothWays {
        a,
        b,
        a_to_b: Direction::default(),
        b_to_a: Direction::default(),
    }
    .await
}

struct BothWays<'a, A: ?Sized, B: ?Sized> {
    a: &'a mut A,
    b: &'a mut B,
    a_to_b: Direction,
    b_to_a: Direction,
}

impl<A, B> Future for BothWays<'_, A, B>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    type Output = io::Result<(u64, u64)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let a_to_b = this.a_to_b.poll(cx, &mut *this.a, &mut *this.b)?;
        let b_to_a = this.b_to_a.poll(cx, &mut *this.b, &mut *this.a)?;
        match (a_to_b, b_to_a) {
            (Poll::Ready(()), Poll::Ready(())) => {
                Poll::Ready(Ok((this.a_to_b.copied, this.b_to_a.copied)))
            }
            _ => Poll::Pending,
        }
    }
}

/// One direction of the copy.
#[derive(Debug, Default)]
struct Direction {
    /// Read but not written yet: the writer was not ready for all of it.
    held: Vec<u8>,
    /// How much of `held` is written.
    written: usize,
    /// The reader ended: once `held` is out, the writer is shut down.
    read_done: bool,
    /// Shut down: this direction is over.
    done: bool,
    /// Written since the last flush.
    unflushed: bool,
    copied: u64,
}

impl Direction {
    fn poll<R, W>(&mut self, cx: &mut Context<'_>, from: &mut R, to: &mut W) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            // What the writer did not take before goes first.
            while self.written < self.held.len() {
                let n = ready!(self.write(cx, to, self.written))?;
                self.written += n;
            }
            if !self.held.is_empty() {
                // Given back: an idle tunnel holds no buffer.
                self.held = Vec::new();
                self.written = 0;
            }
            if self.read_done {
                if self.unflushed {
                    ready!(Pin::new(&mut *to).poll_flush(cx))?;
                    self.unflushed = false;
                }
                ready!(Pin::new(&mut *to).poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            let mut stack = [0u8; READ];
            let mut buf = ReadBuf::new(&mut stack);
            match Pin::new(&mut *from).poll_read(cx, &mut buf) {
                Poll::Pending => {
                    // Nothing more to read now: what was written goes out.
                    if self.unflushed {
                        ready!(Pin::new(&mut *to).poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let read = buf.filled();
            if read.is_empty() {
                self.read_done = true;
                continue;
            }
            self.copied += read.len() as u64;
            let mut at = 0;
            while at < read.len() {
                match Pin::new(&mut *to).poll_write(cx, &read[at..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(write_zero())),
                    Poll::Ready(Ok(n)) => {
                        at += n;
                        self.unflushed = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        // The rest waits for the writer, on the heap.
                        self.held = read[at..].to_vec();
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    /// Write `held[from..]`: how much went.
    fn write<W>(&mut self, cx: &mut Context<'_>, to: &mut W, from: usize) -> Poll<io::Result<usize>>
    where
        W: AsyncWrite + Unpin + ?Sized,
    {
        match ready!(Pin::new(to).poll_write(cx, &self.held[from..]))? {
            0 => Poll::Ready(Err(write_zero())),
            n => {
                self.unflushed = true;
                Poll::Ready(Ok(n))
            }
        }
    }
}

fn write_zero() -> io::Error {
    io::Error::new(
        io::ErrorKind::WriteZero,
        "the other side takes no more bytes",
    )
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    /// A megabyte each way through pipes that hold 64 bytes: every write
    /// waits for the reader, the bytes come out whole and in order, and
    /// an end on one side reaches the other.
    #[tokio::test]
    async fn bytes_go_both_ways_in_order_through_writers_that_take_little() {
        let (client, mut a) = duplex(64);
        let (mut b, backend) = duplex(64);
        let copy = tokio::spawn(async move { both_ways(&mut a, &mut b).await });
        let up: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..1_000_000u32).map(|i| (i % 241) as u8).collect();
        let client_side = tokio::spawn(send_and_read(client, up.clone()));
        let backend_side = tokio::spawn(send_and_read(backend, down.clone()));
        assert_eq!(backend_side.await.unwrap(), up);
        assert_eq!(client_side.await.unwrap(), down);
        let (a_to_b, b_to_a) = copy.await.unwrap().unwrap();
        assert_eq!((a_to_b, b_to_a), (1_000_000, 1_000_000));
    }

    /// Write `data` into `end` and close it, while reading all that comes
    /// out of it; what came.
    async fn send_and_read(mut end: tokio::io::DuplexStream, data: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = tokio::io::split(&mut end);
        let send = async {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let ((), read) = tokio::join!(send, r.read_to_end(&mut got));
        read.unwrap();
        got
    }

    /// Once the writer took everything, nothing stays held.
    #[tokio::test]
    async fn nothing_is_held_once_the_writer_took_it() {
        let (mut client, mut a) = duplex(16);
        let (mut b, mut backend) = duplex(1 << 20);
        let mut d = Direction::default();
        client.write_all(&[7u8; 16]).await.unwrap();
        // The backend's pipe takes all: nothing is kept.
        let polled = std::future::poll_fn(|cx| Poll::Ready(d.poll(cx, &mut a, &mut b))).await;
        assert!(polled.is_pending());
        assert_eq!((d.held.capacity(), d.copied), (0, 16));
        let mut got = [0u8; 16];
        backend.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [7u8; 16]);
    }
}

//! Response bodies: fixed bytes, or a generated `a..z` stream with optional
//! pauses and on-the-fly gzip.

use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flate2::Compression;
use flate2::write::GzEncoder;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

/// Largest piece of the pattern served straight from the static table.
pub const PATTERN_SPAN: usize = 64 * 1024;

/// `abc..zabc..` long enough that any window of `PATTERN_SPAN` bytes starting
/// at any phase (0..26) is a slice of it: bodies up to 64 KiB, and every
/// frame of larger bodies, cost no allocation and no copy.
static PATTERN: [u8; PATTERN_SPAN + 26] = pattern_table();

const fn pattern_table() -> [u8; PATTERN_SPAN + 26] {
    let mut table = [0u8; PATTERN_SPAN + 26];
    let mut i = 0;
    while i < table.len() {
        table[i] = b'a' + (i % 26) as u8;
        i += 1;
    }
    table
}

/// The pattern bytes at body offsets `offset..offset + len`.
pub fn pattern_bytes(offset: u64, len: usize) -> Bytes {
    let phase = (offset % 26) as usize;
    if len <= PATTERN_SPAN {
        return Bytes::from_static(&PATTERN[phase..phase + len]);
    }
    // Rare (chunk sizes above 64 KiB): copy the pattern into one buffer.
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let phase = ((offset + buf.len() as u64) % 26) as usize;
        let take = PATTERN_SPAN.min(len - buf.len());
        buf.extend_from_slice(&PATTERN[phase..phase + take]);
    }
    buf.freeze()
}

/// An HTML page of exactly `n` bytes (at least its frame, 108) that
/// compresses as real pages do (about 5:1 with gzip, a little more with
/// br): elements, classes, ids, links and words from a small vocabulary,
/// drawn by a PRNG seeded by `n`, so the same `n` is the same page.
pub fn html_page(n: usize) -> Bytes {
    const WORDS: [&str; 24] = [
        "the", "cache", "edge", "page", "render", "include", "stream", "worker", "policy",
        "request", "origin", "latency", "session", "profile", "article", "comment", "author",
        "product", "price", "basket", "search", "result", "summary", "content",
    ];
    const TAGS: [&str; 6] = ["div", "span", "p", "li", "section", "article"];
    const CLASSES: [&str; 6] = [
        "card",
        "row",
        "col-md-4",
        "nav-item",
        "btn btn-primary",
        "text-muted",
    ];
    let head = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>page</title></head><body>\n";
    let tail = "</body></html>\n";
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
    let mut next = |m: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % m as u64) as usize
    };
    let mut out = String::with_capacity(n + 256);
    out.push_str(head);
    while out.len() + tail.len() < n {
        let tag = TAGS[next(TAGS.len())];
        let class = CLASSES[next(CLASSES.len())];
        out.push_str(&format!(
            "<{tag} class=\"{class}\" data-id=\"{}\">",
            next(100_000)
        ));
        for i in 0..3 + next(12) {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(WORDS[next(WORDS.len())]);
        }
        if next(4) == 0 {
            out.push_str(&format!(" <a href=\"/item/{}\">more</a>", next(10_000)));
        }
        out.push_str(&format!("</{tag}>\n"));
    }
    out.truncate(n.saturating_sub(tail.len()).max(head.len()));
    out.push_str(tail);
    Bytes::from(out)
}

/// Gzips a whole body in memory (fast level: the origin must stay cheap).
pub fn gzip_all(data: &[u8]) -> io::Result<Bytes> {
    let mut enc = GzEncoder::new(Vec::with_capacity(data.len() / 2 + 64), Compression::fast());
    enc.write_all(data)?;
    Ok(Bytes::from(enc.finish()?))
}

/// The body of every response the origin sends.
pub struct OriginBody {
    inner: Inner,
    /// Hide the length so hyper sends `Transfer-Encoding: chunked` (`cl=0`).
    hide_len: bool,
}

enum Inner {
    Empty,
    Full(Option<Bytes>),
    /// Boxed: streams are the rare case, and this keeps `OriginBody` small.
    Pattern(Box<PatternStream>),
}

impl OriginBody {
    /// No body.
    pub fn empty() -> Self {
        Self {
            inner: Inner::Empty,
            hide_len: false,
        }
    }

    /// A body known in full.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        Self {
            inner: if data.is_empty() {
                Inner::Empty
            } else {
                Inner::Full(Some(data))
            },
            hide_len: false,
        }
    }

    /// A generated pattern stream.
    pub fn pattern(stream: PatternStream) -> Self {
        Self {
            inner: Inner::Pattern(Box::new(stream)),
            hide_len: false,
        }
    }

    /// Forces chunked transfer encoding on HTTP/1.1 (no `Content-Length`).
    pub fn hide_length(&mut self) {
        self.hide_len = true;
    }

    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        match &self.inner {
            Inner::Empty => true,
            Inner::Full(data) => data.is_none(),
            Inner::Pattern(stream) => stream.total == 0,
        }
    }

    /// Gzips the body: whole bodies at once, streams frame by frame (each
    /// frame flushed, so a streamed body still arrives progressively).
    pub fn gzip(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::Empty => {}
            Inner::Full(data) => {
                if let Some(plain) = data.take() {
                    *data = Some(gzip_all(&plain)?);
                }
            }
            Inner::Pattern(stream) => {
                stream.gzip = Some(GzEncoder::new(Vec::new(), Compression::fast()));
            }
        }
        Ok(())
    }
}

impl Body for OriginBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match &mut self.get_mut().inner {
            Inner::Empty => Poll::Ready(None),
            Inner::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Inner::Pattern(stream) => stream.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Empty => true,
            Inner::Full(data) => data.is_none(),
            Inner::Pattern(stream) => stream.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.hide_len {
            return SizeHint::default();
        }
        match &self.inner {
            Inner::Empty => SizeHint::with_exact(0),
            Inner::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Inner::Pattern(stream) if stream.gzip.is_none() => {
                SizeHint::with_exact(stream.total - stream.sent)
            }
            Inner::Pattern(_) => SizeHint::default(),
        }
    }
}

/// `total` pattern bytes sent as: `initial` bytes at once, a `stall`, then
/// frames of `chunk` bytes with `chunk_delay` between them.
pub struct PatternStream {
    total: u64,
    sent: u64,
    initial: u64,
    stall: Duration,
    chunk: usize,
    chunk_delay: Duration,
    /// The pause to take before the next frame.
    pause: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    gzip: Option<GzEncoder<Vec<u8>>>,
    gzip_done: bool,
}

impl PatternStream {
    /// `total` bytes in frames of `chunk` bytes (at least 1), `chunk_delay`
    /// apart, the first one at once.
    pub fn chunked(total: u64, chunk: usize, chunk_delay: Duration) -> Self {
        Self {
            total,
            sent: 0,
            initial: 0,
            stall: Duration::ZERO,
            chunk: chunk.max(1),
            chunk_delay,
            pause: Duration::ZERO,
            sleep: None,
            gzip: None,
            gzip_done: false,
        }
    }

    /// `total` bytes of which the first `initial` go at once, then nothing
    /// for `stall`, then the rest as fast as possible.
    pub fn stalled(total: u64, initial: u64, stall: Duration) -> Self {
        let initial = initial.min(total);
        Self {
            initial,
            stall,
            pause: if initial == 0 { stall } else { Duration::ZERO },
            ..Self::chunked(total, PATTERN_SPAN, Duration::ZERO)
        }
    }

    fn is_done(&self) -> bool {
        self.sent == self.total && (self.gzip.is_none() || self.gzip_done)
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        loop {
            if self.sent == self.total {
                return Poll::Ready(self.finish_gzip().map(|r| r.map(Frame::data)));
            }
            if let Some(sleep) = &mut self.sleep {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            } else if !self.pause.is_zero() {
                self.sleep = Some(Box::pin(tokio::time::sleep(self.pause)));
                self.pause = Duration::ZERO;
                continue;
            }
            let len = if self.sent < self.initial {
                self.initial - self.sent
            } else {
                (self.chunk as u64).min(self.total - self.sent)
            };
            // Bounded by `chunk` (a usize) or by `initial`, which a caller caps.
            let len = usize::try_from(len).unwrap_or(usize::MAX).min(1 << 30);
            let data = pattern_bytes(self.sent, len);
            self.sent += len as u64;
            self.pause = if self.sent == self.initial {
                self.stall
            } else {
                self.chunk_delay
            };
            match &mut self.gzip {
                None => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Some(enc) => {
                    let out = enc.write_all(&data).and_then(|()| enc.flush());
                    if let Err(e) = out {
                        return Poll::Ready(Some(Err(e)));
                    }
                    let out = std::mem::take(enc.get_mut());
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
            }
        }
    }

    /// The gzip trailer once all data is written; `None` when done.
    fn finish_gzip(&mut self) -> Option<io::Result<Bytes>> {
        if self.gzip_done {
            return None;
        }
        let enc = self.gzip.take()?;
        self.gzip_done = true;
        Some(enc.finish().map(Bytes::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn expected(offset: u64, len: usize) -> Vec<u8> {
        (offset..offset + len as u64)
            .map(|i| b'a' + (i % 26) as u8)
            .collect()
    }

    #[test]
    fn html_pages_are_as_long_as_asked_the_same_each_time_and_compress_as_pages_do() {
        let frame = html_page(0).len();
        for n in [0usize, 10, frame, frame + 1, 1000, 65_536] {
            let page = html_page(n);
            assert_eq!(page.len(), n.max(frame), "{n}");
            assert_eq!(page, html_page(n));
            assert!(page.ends_with(b"</body></html>\n"));
        }
        let page = html_page(65_536);
        assert_eq!(page.len(), 65_536);
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(&page).unwrap();
        let ratio = page.len() as f64 / e.finish().unwrap().len() as f64;
        assert!((3.0..8.0).contains(&ratio), "gzip ratio {ratio}");
    }

    #[test]
    fn pattern_bytes_match_offsets_small_and_large() {
        assert_eq!(&pattern_bytes(0, 5)[..], b"abcde");
        assert_eq!(&pattern_bytes(27, 3)[..], b"bcd");
        assert_eq!(
            &pattern_bytes(25, PATTERN_SPAN)[..],
            &expected(25, PATTERN_SPAN)[..]
        );
        let big = PATTERN_SPAN * 3 + 7;
        assert_eq!(&pattern_bytes(11, big)[..], &expected(11, big)[..]);
    }

    #[tokio::test]
    async fn chunked_stream_yields_exact_frames_and_bytes() {
        let mut body = OriginBody::pattern(PatternStream::chunked(100, 30, Duration::ZERO));
        assert_eq!(body.size_hint().exact(), Some(100));
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            frames.push(
                frame
                    .ok()
                    .and_then(|f| f.into_data().ok())
                    .unwrap_or_default(),
            );
        }
        assert_eq!(
            frames.iter().map(Bytes::len).collect::<Vec<_>>(),
            [30, 30, 30, 10]
        );
        assert_eq!(frames.concat(), expected(0, 100));
        assert!(body.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_stream_pauses_after_initial_bytes() {
        let mut body = OriginBody::pattern(PatternStream::stalled(10, 4, Duration::from_secs(5)));
        let start = tokio::time::Instant::now();
        let first = body
            .frame()
            .await
            .and_then(|f| f.ok())
            .and_then(|f| f.into_data().ok());
        assert_eq!(first.as_deref(), Some(&b"abcd"[..]));
        assert!(start.elapsed() < Duration::from_secs(1));
        let rest = body
            .frame()
            .await
            .and_then(|f| f.ok())
            .and_then(|f| f.into_data().ok());
        assert_eq!(rest.as_deref(), Some(&b"efghij"[..]));
        assert!(start.elapsed() >= Duration::from_secs(5));
    }

    #[tokio::test]
    async fn gzip_stream_round_trips() {
        let mut body = OriginBody::pattern(PatternStream::chunked(5000, 700, Duration::ZERO));
        assert!(body.gzip().is_ok());
        assert_eq!(body.size_hint().exact(), None);
        let compressed = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let mut plain = Vec::new();
        let mut dec = flate2::read::GzDecoder::new(&compressed[..]);
        assert!(std::io::Read::read_to_end(&mut dec, &mut plain).is_ok());
        assert_eq!(plain, expected(0, 5000));
    }
}

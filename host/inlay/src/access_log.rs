//! The access log: one line per request, NCSA combined (as varnishncsa
//! writes it) or JSON, written when the response body is finished.
//!
//! A request formats its line and appends it to a buffer of its own thread
//! (one per log and thread, kept by `thread_local::ThreadLocal`): no
//! wake-up and no system call. One writer thread collects the buffers every
//! 100 ms (`TICK`; at once when a quarter of the queue waits) and writes
//! what it took, so a slow disk or a stalled stdout never holds a worker
//! thread. When 16 Ki lines (`QUEUE_LINES`) wait for the writer, a new line
//! is dropped and counted.
//!
//! Order: every line takes a number from one counter when it is handed in
//! (under its thread's buffer lock), and a round of the writer takes every
//! line numbered below the counter as it read it when the round began,
//! sorted. So the file has the lines in the order they were handed in,
//! across threads, as one shared queue would: a line handed in after
//! another one ended (the next request on a connection, say) is written
//! after it, whichever threads they ran on.

use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use crossbeam_utils::CachePadded;
use inlay_core::LogLimit;
use parking_lot::Mutex;
use thread_local::ThreadLocal;
use tracing::warn;

use crate::config::{AccessLogFormat, AccessLogTarget, LogConfig};

/// Lines handed in and not yet taken by the writer before new ones are dropped.
const QUEUE_LINES: u64 = 16 * 1024;

/// How often the writer collects the lines while requests come in: soon
/// enough that `tail -f` shows a line within a blink, seldom enough that
/// its ten wake-ups a second cost nothing next to the requests it writes.
const TICK: Duration = Duration::from_millis(100);

/// Rounds without a line before the writer sleeps until a request wakes it
/// (one wake-up, by the first line after the pause): an idle server does
/// not tick.
const IDLE_AFTER_ROUNDS: u32 = 10;

/// The writer's output buffer: a round's lines go out in writes this large.
const WRITE_BUFFER: usize = 64 * 1024;

/// Dropped lines are reported at most this often.
const DROP_WARNING_EVERY: Duration = Duration::from_secs(10);

/// What the log phase knows about a finished request.
#[derive(Debug, Clone, Default)]
pub struct AccessRecord {
    /// Client address.
    pub client: Option<IpAddr>,
    /// Request method.
    pub method: String,
    /// Path and query as received.
    pub url: String,
    /// `HTTP/1.1`, `HTTP/2.0`.
    pub protocol: String,
    /// Whether the request came over TLS (logged as `"scheme": "https"`).
    pub tls: bool,
    /// Status sent.
    pub status: u16,
    /// Body bytes sent (through a tunnel: the bytes sent to the client).
    pub bytes: u64,
    /// A tunnel's bytes from the client (logged as `received`); none for
    /// other requests.
    pub received: Option<u64>,
    /// Referer header.
    pub referer: Option<String>,
    /// User-Agent header.
    pub user_agent: Option<String>,
    /// Host header.
    pub host: Option<String>,
    /// How it was served (logged by its log name: hit, miss, pass...); the
    /// metrics count the same value.
    pub cache: inlay_core::CacheStatus,
    /// Backend that served it, if any.
    pub backend: Option<String>,
    /// Time from request head to last body byte.
    pub duration: Duration,
    /// Why the request failed, if it did.
    pub error: Option<String>,
    /// For an ESI page: its includes left out after failing, counted while
    /// the body streams and read when the line is written.
    pub esi_omitted: Option<Arc<AtomicU32>>,
    /// The request's id (`server.request_id_header`), when ids are on.
    pub request_id: Option<String>,
}

impl AccessRecord {
    fn esi_omitted(&self) -> Option<u32> {
        self.esi_omitted.as_ref().map(|n| n.load(Ordering::Relaxed))
    }
}

/// Writes access-log lines without blocking the caller.
#[derive(Clone)]
pub struct AccessLog {
    format: AccessLogFormat,
    handle: Option<Arc<Handle>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("format", &self.format)
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// What the clones of one log share. When the last is dropped, the writer
/// sees its messages disconnect, writes what is left and ends.
struct Handle {
    shared: Arc<Shared>,
    messages: Sender<Message>,
}

/// What requests and the writer thread share.
struct Shared {
    /// Each thread's lines not yet taken by the writer, each on cache
    /// lines of its own (`ThreadLocal` keeps threads' values side by side).
    buffers: ThreadLocal<CachePadded<Mutex<Batch>>>,
    /// The number the next line handed in takes (dropped lines take one too).
    handed: CachePadded<AtomicU64>,
    /// Lines taken by the writer or dropped: `handed - retired` wait.
    retired: AtomicU64,
    /// The writer sleeps until a request wakes it.
    idle: AtomicBool,
    /// A request has asked the writer to come before its tick.
    hurry: AtomicBool,
    /// Lines that may wait before new ones are dropped.
    capacity: u64,
    dropped: AtomicU64,
    /// The drop warnings, at most one per [`DROP_WARNING_EVERY`].
    drop_warnings: LogLimit,
    tick: Duration,
}

enum Message {
    /// Come now: the queue is filling up, or the writer was asleep.
    Wake,
    /// Answered once every line handed in before it is written and flushed.
    Flush(Sender<()>),
}

/// Lines of one thread, in the order (and so with the numbers) handed in.
#[derive(Default)]
struct Batch {
    text: Vec<u8>,
    /// Each line's number and where it ends in `text`.
    lines: Vec<(u64, usize)>,
}

impl Batch {
    fn push(&mut self, number: u64, line: &[u8]) {
        self.push_with(number, |text| text.extend_from_slice(line));
    }

    /// Add the line `format` appends to the text.
    fn push_with(&mut self, number: u64, format: impl FnOnce(&mut Vec<u8>)) {
        format(&mut self.text);
        self.lines.push((number, self.text.len()));
    }

    fn clear(&mut self) {
        self.text.clear();
        self.lines.clear();
    }

    /// Move the lines numbered `from` or later (the last ones) to `rest`.
    fn split_off(&mut self, from: u64, rest: &mut Batch) {
        let keep = self.lines.partition_point(|&(n, _)| n < from);
        for i in keep..self.lines.len() {
            rest.push(self.lines[i].0, self.line(i));
        }
        if keep < self.lines.len() {
            self.text.truncate(self.start(keep));
            self.lines.truncate(keep);
        }
    }

    /// Where line `i` starts in `text`.
    fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.lines[i - 1].1 }
    }

    /// The text of line `i`.
    fn line(&self, i: usize) -> &[u8] {
        &self.text[self.start(i)..self.lines[i].1]
    }
}

impl AccessLog {
    /// Open the configured target and start its writer thread.
    pub fn open(cfg: &LogConfig) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match &cfg.access_log {
            AccessLogTarget::Off => {
                return Ok(Self {
                    format: cfg.access_log_format,
                    handle: None,
                });
            }
            AccessLogTarget::Stdout => Box::new(std::io::stdout()),
            AccessLogTarget::Stderr => Box::new(std::io::stderr()),
            AccessLogTarget::File(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
        };
        Self::with_writer(cfg.access_log_format, out, QUEUE_LINES, TICK)
    }

    fn with_writer(
        format: AccessLogFormat,
        out: Box<dyn Write + Send>,
        queue_lines: u64,
        tick: Duration,
    ) -> std::io::Result<Self> {
        // Room for a flush at shutdown and at a reload, and one wake-up of each kind.
        let (messages, receiver) = crossbeam_channel::bounded(8);
        let shared = Arc::new(Shared {
            buffers: ThreadLocal::new(),
            handed: CachePadded::new(AtomicU64::new(0)),
            retired: AtomicU64::new(0),
            idle: AtomicBool::new(false),
            hurry: AtomicBool::new(false),
            capacity: queue_lines,
            dropped: AtomicU64::new(0),
            drop_warnings: LogLimit::new(1, DROP_WARNING_EVERY),
            tick,
        });
        let writer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || Writer::new(out).run(&writer, &receiver))?;
        Ok(Self {
            format,
            handle: Some(Arc::new(Handle { shared, messages })),
        })
    }

    /// Whether lines are written (the access log is not `off`).
    pub fn is_on(&self) -> bool {
        self.handle.is_some()
    }

    /// Hand one line in. When the writer is behind by the whole queue, the
    /// line is dropped and counted: logging must not hold requests.
    pub fn write(&self, r: &AccessRecord) {
        let Some(handle) = &self.handle else { return };
        let format = self.format;
        handle.hand_in(|out| match format {
            AccessLogFormat::Combined => combined(r, out),
            AccessLogFormat::Json => json(r, out),
        });
    }

    /// Whether `other` is a clone of this log (the same writer thread).
    pub fn same_writer(&self, other: &AccessLog) -> bool {
        match (&self.handle, &other.handle) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => self.format == other.format,
            _ => false,
        }
    }

    /// Lines dropped so far because the writer could not keep up.
    pub fn dropped(&self) -> u64 {
        self.handle
            .as_ref()
            .map_or(0, |h| h.shared.dropped.load(Ordering::Relaxed))
    }

    /// Block until every line handed in so far (by any thread) is written
    /// and flushed, for at most `within`; false if the writer did not get
    /// there in time.
    pub fn flush(&self, within: Duration) -> bool {
        let Some(handle) = &self.handle else {
            return true;
        };
        let deadline = Instant::now() + within;
        let (done, flushed) = crossbeam_channel::bounded(1);
        handle
            .messages
            .send_deadline(Message::Flush(done), deadline)
            .is_ok()
            && flushed.recv_deadline(deadline).is_ok()
    }
}

impl Handle {
    /// Append the line `format` writes to this thread's buffer. The writer
    /// is woken only when it sleeps (the first line after a pause) or when a
    /// quarter of the queue waits; otherwise its tick takes the line.
    fn hand_in(&self, format: impl FnOnce(&mut Vec<u8>)) {
        let shared = &*self.shared;
        let mut batch = shared.buffers.get_or_default().lock();
        // Taken under the buffer's lock, so that a round that read the
        // counter past this number finds the line in the buffer. SeqCst:
        // against the writer falling asleep, see `Writer::run`.
        let number = shared.handed.fetch_add(1, Ordering::SeqCst);
        let waiting = number.saturating_sub(shared.retired.load(Ordering::Relaxed));
        if waiting >= shared.capacity {
            drop(batch);
            shared.retired.fetch_add(1, Ordering::Relaxed);
            shared.count_drop();
            return;
        }
        batch.push_with(number, format);
        drop(batch);
        let hurry = waiting + 1 >= shared.capacity.div_ceil(4)
            && !shared.hurry.load(Ordering::Relaxed)
            && !shared.hurry.swap(true, Ordering::Relaxed);
        let asleep =
            shared.idle.load(Ordering::SeqCst) && shared.idle.swap(false, Ordering::SeqCst);
        if hurry || asleep {
            // Full: a message is on its way already, the writer comes anyway.
            let _ = self.messages.try_send(Message::Wake);
        }
    }
}

impl Shared {
    fn count_drop(&self) {
        let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        // The line says how many were dropped in all.
        if self.drop_warnings.admit().is_some() {
            warn!(
                dropped = total,
                "access log lines dropped: the writer cannot keep up with requests"
            );
        }
    }

    /// Whether lines wait (or a drop is being counted).
    fn waiting(&self) -> bool {
        self.handed.load(Ordering::SeqCst) != self.retired.load(Ordering::SeqCst)
    }
}

/// The writer thread's state: its output and the batches it reuses.
struct Writer {
    out: BufWriter<Box<dyn Write + Send>>,
    /// Batches taken in this round.
    taken: Vec<Batch>,
    /// Empty batches, swapped into the buffers as they are taken.
    spare: Vec<Batch>,
    /// Where each line of a round of several batches is: (number, batch, index).
    order: Vec<(u64, usize, usize)>,
}

impl Writer {
    fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out: BufWriter::with_capacity(WRITE_BUFFER, out),
            taken: Vec::new(),
            spare: Vec::new(),
            order: Vec::new(),
        }
    }

    /// Write a round every tick, at once when asked, and a last one when
    /// every handle is gone. Write errors are ignored: logging must not
    /// stop serving.
    fn run(mut self, shared: &Shared, messages: &Receiver<Message>) {
        let mut empty_rounds = 0;
        loop {
            let message = if shared.idle.load(Ordering::SeqCst) {
                messages.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                messages.recv_timeout(shared.tick)
            };
            let flushed = match message {
                Ok(Message::Wake) | Err(RecvTimeoutError::Timeout) => None,
                Ok(Message::Flush(done)) => Some(done),
                Err(RecvTimeoutError::Disconnected) => {
                    self.round(shared);
                    return;
                }
            };
            // Cleared before the round: a request that asks again during it is heard.
            shared.hurry.store(false, Ordering::Relaxed);
            let wrote = self.round(shared);
            if let Some(done) = flushed {
                let _ = done.send(());
            }
            if wrote > 0 {
                empty_rounds = 0;
                continue;
            }
            empty_rounds += 1;
            if empty_rounds >= IDLE_AFTER_ROUNDS && !shared.idle.load(Ordering::SeqCst) {
                // Fall asleep unless a line came in meanwhile. Either this
                // store comes first and the request (whose number was taken
                // after it) sees `idle` and wakes the writer, or the
                // request's number comes first and `waiting` sees it.
                shared.idle.store(true, Ordering::SeqCst);
                if shared.waiting() {
                    shared.idle.store(false, Ordering::SeqCst);
                }
            }
        }
    }

    /// Take every line numbered below the counter as read now, write them
    /// in number order and flush; returns how many.
    fn round(&mut self, shared: &Shared) -> usize {
        let upto = shared.handed.load(Ordering::SeqCst);
        let mut taken = 0;
        for buffer in shared.buffers.iter() {
            let mut batch = self.spare.pop().unwrap_or_default();
            {
                let mut current = buffer.lock();
                if current.lines.is_empty() {
                    drop(current);
                    self.spare.push(batch);
                    continue;
                }
                std::mem::swap(&mut *current, &mut batch);
                // Lines handed in after `upto` was read go back, for the next round.
                batch.split_off(upto, &mut current);
            }
            taken += batch.lines.len();
            self.taken.push(batch);
        }
        if taken == 0 {
            return 0;
        }
        shared.retired.fetch_add(taken as u64, Ordering::SeqCst);
        if let [one] = self.taken.as_slice() {
            let _ = self.out.write_all(&one.text);
        } else {
            for (b, batch) in self.taken.iter().enumerate() {
                self.order
                    .extend(batch.lines.iter().enumerate().map(|(i, &(n, _))| (n, b, i)));
            }
            self.order.sort_unstable_by_key(|&(n, _, _)| n);
            for &(_, b, i) in &self.order {
                let _ = self.out.write_all(self.taken[b].line(i));
            }
            self.order.clear();
        }
        let _ = self.out.flush();
        for mut batch in self.taken.drain(..) {
            batch.clear();
            self.spare.push(batch);
        }
        taken
    }
}

/// Append the NCSA combined line of `r` to `out`. Written piece by piece
/// into the thread's buffer: no allocation, no `format!`, the date
/// formatted once a second.
fn combined(r: &AccessRecord, out: &mut Vec<u8>) {
    match r.client {
        Some(IpAddr::V4(ip)) => {
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                decimal(octet, out);
            }
        }
        Some(ip) => {
            // Writing to a Vec cannot fail.
            let _ = write!(out, "{ip}");
        }
        None => out.push(b'-'),
    }
    out.extend_from_slice(b" - - [");
    ncsa_now(out);
    out.extend_from_slice(b"] \"");
    for (i, part) in [&r.method, &r.url, &r.protocol].into_iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        escape(part, out);
    }
    out.extend_from_slice(b"\" ");
    decimal(r.status, out);
    out.push(b' ');
    if r.bytes == 0 {
        out.push(b'-');
    } else {
        decimal(r.bytes, out);
    }
    for field in [&r.referer, &r.user_agent] {
        out.extend_from_slice(b" \"");
        escape(field.as_deref().unwrap_or("-"), out);
        out.push(b'"');
    }
    // Only on a page that left includes out, so other lines stay plain NCSA.
    if let Some(n) = r.esi_omitted()
        && n > 0
    {
        out.extend_from_slice(b" esi_omitted=");
        decimal(n, out);
    }
    // A request id is one token without spaces or quotes (`request_id::is_sane`).
    if let Some(id) = &r.request_id {
        out.extend_from_slice(b" request_id=");
        out.extend_from_slice(id.as_bytes());
    }
    out.push(b'\n');
}

/// `n` in decimal, without `core::fmt` (a third of the line's cost with it).
fn decimal(n: impl itoa::Integer, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `s` as a quoted NCSA field may hold it (Apache's and nginx's escapes):
/// `"` and `\` after a backslash, and any other byte that is not printable
/// ASCII (control bytes, DEL, each byte of a non-ASCII character) as
/// `\xHH`. A field then cannot end before its closing quote nor break the
/// line, whatever the client sent (`-A 'x\" 500 1 "-" "forged'`). Runs of
/// plain bytes are copied whole: a line without escapes costs one scan.
fn escape(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut plain_from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[plain_from..i]);
        if b == b'"' || b == b'\\' {
            out.extend_from_slice(&[b'\\', b]);
        } else {
            out.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]);
        }
        plain_from = i + 1;
    }
    out.extend_from_slice(&bytes[plain_from..]);
}

/// Append the time now in the NCSA format; each thread formats it once a second.
fn ncsa_now(out: &mut Vec<u8>) {
    thread_local! {
        static NOW: std::cell::RefCell<(u64, String)> = const {
            std::cell::RefCell::new((0, String::new()))
        };
    }
    let now = std::time::SystemTime::now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    NOW.with_borrow_mut(|(at, text)| {
        if *at != second || text.is_empty() {
            *at = second;
            *text = httpdate_ncsa(now);
        }
        out.extend_from_slice(text.as_bytes());
    });
}

/// Append the JSON line of `r` to `out`.
fn json(r: &AccessRecord, out: &mut Vec<u8>) {
    let v = serde_json::json!({
        "time": httpdate::fmt_http_date(std::time::SystemTime::now()),
        "client": r.client.map(|c| c.to_string()),
        "method": r.method,
        "url": r.url,
        "protocol": r.protocol,
        "scheme": if r.tls { "https" } else { "http" },
        "host": r.host,
        "status": r.status,
        "bytes": r.bytes,
        "received": r.received,
        "referer": r.referer,
        "user_agent": r.user_agent,
        "cache": r.cache.log_name(),
        "backend": r.backend,
        "duration_ms": r.duration.as_secs_f64() * 1000.0,
        "error": r.error,
        "esi_omitted": r.esi_omitted(),
        "request_id": r.request_id,
    });
    let _ = serde_json::to_writer(&mut *out, &v);
    out.push(b'\n');
}

/// The NCSA time format, `10/Oct/2000:13:55:36 +0000`, always in UTC.
fn httpdate_ncsa(at: std::time::SystemTime) -> String {
    // httpdate gives "Tue, 10 Oct 2000 13:55:36 GMT"; rearrange it.
    let s = httpdate::fmt_http_date(at);
    let parts: Vec<&str> = s.split(' ').collect();
    if parts.len() == 6 {
        format!("{}/{}/{}:{} +0000", parts[1], parts[2], parts[3], parts[4])
    } else {
        s
    }
}

#[cfg(test)]
mod tests;

//! The access log: one line per request, NCSA combined (as varnishncsa
//! writes it) or JSON, written when the response body is finished.
//!
//! Requests only format their line and queue it; one writer thread writes
//! the queue out, so a slow disk or a stalled stdout never holds a worker
//! thread. When the queue is full the line is dropped and counted.

use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use inlay_core::LogLimit;
use tracing::warn;

use crate::config::{AccessLogFormat, AccessLogTarget, LogConfig};

/// Lines queued for the writer thread before new ones are dropped.
const QUEUE_LINES: usize = 16 * 1024;

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
    /// Body bytes sent.
    pub bytes: u64,
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
    queue: Option<Arc<Queue>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("format", &self.format)
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// The sending side of the writer thread's queue.
struct Queue {
    sender: Sender<Message>,
    dropped: AtomicU64,
    /// The drop warnings, at most one per [`DROP_WARNING_EVERY`].
    drop_warnings: LogLimit,
}

enum Message {
    Line(String),
    /// Answered once everything queued before it is written and flushed.
    Flush(Sender<()>),
}

impl AccessLog {
    /// Open the configured target and start its writer thread.
    pub fn open(cfg: &LogConfig) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match &cfg.access_log {
            AccessLogTarget::Off => {
                return Ok(Self {
                    format: cfg.access_log_format,
                    queue: None,
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
        Self::with_writer(cfg.access_log_format, out, QUEUE_LINES)
    }

    fn with_writer(
        format: AccessLogFormat,
        out: Box<dyn Write + Send>,
        queue_lines: usize,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = crossbeam_channel::bounded(queue_lines);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(&receiver, out))?;
        Ok(Self {
            format,
            queue: Some(Arc::new(Queue {
                sender,
                dropped: AtomicU64::new(0),
                drop_warnings: LogLimit::new(1, DROP_WARNING_EVERY),
            })),
        })
    }

    /// Queue one line. A full queue drops it: logging must not hold requests.
    pub fn write(&self, r: &AccessRecord) {
        let Some(queue) = &self.queue else { return };
        let line = match self.format {
            AccessLogFormat::Combined => combined(r),
            AccessLogFormat::Json => json(r),
        };
        match queue.sender.try_send(Message::Line(line)) {
            Ok(()) => {}
            // Disconnected means the writer thread is gone: the line is lost too.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => queue.count_drop(),
        }
    }

    /// Whether `other` is a clone of this log (the same writer thread).
    pub fn same_writer(&self, other: &AccessLog) -> bool {
        match (&self.queue, &other.queue) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => self.format == other.format,
            _ => false,
        }
    }

    /// Lines dropped so far because the writer could not keep up.
    pub fn dropped(&self) -> u64 {
        self.queue
            .as_ref()
            .map_or(0, |q| q.dropped.load(Ordering::Relaxed))
    }

    /// Block until every line queued so far is written and flushed, for at
    /// most `within`; false if the writer did not get there in time.
    pub fn flush(&self, within: Duration) -> bool {
        let Some(queue) = &self.queue else {
            return true;
        };
        let deadline = Instant::now() + within;
        let (done, flushed) = crossbeam_channel::bounded(1);
        queue
            .sender
            .send_deadline(Message::Flush(done), deadline)
            .is_ok()
            && flushed.recv_deadline(deadline).is_ok()
    }
}

impl Queue {
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
}

/// The writer thread: writes queued lines, and flushes whenever the queue is
/// empty so that lines show up at once rather than at exit. Write errors
/// are ignored: logging must not stop serving.
fn write_lines(queue: &Receiver<Message>, out: Box<dyn Write + Send>) {
    let mut out = BufWriter::new(out);
    while let Ok(first) = queue.recv() {
        for message in std::iter::once(first).chain(queue.try_iter()) {
            match message {
                Message::Line(line) => {
                    let _ = out.write_all(line.as_bytes());
                }
                Message::Flush(done) => {
                    let _ = out.flush();
                    let _ = done.send(());
                }
            }
        }
        let _ = out.flush();
    }
}

fn combined(r: &AccessRecord) -> String {
    let now = httpdate_ncsa();
    format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\"{}{}\n",
        r.client
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into()),
        now,
        r.method,
        r.url,
        r.protocol,
        r.status,
        if r.bytes == 0 {
            "-".to_string()
        } else {
            r.bytes.to_string()
        },
        r.referer.as_deref().unwrap_or("-").replace('"', "\\\""),
        r.user_agent.as_deref().unwrap_or("-").replace('"', "\\\""),
        // Only on a page that left includes out, so other lines stay plain NCSA.
        match r.esi_omitted() {
            Some(n) if n > 0 => format!(" esi_omitted={n}"),
            _ => String::new(),
        },
        // A request id is one token without spaces or quotes (`request_id::is_sane`).
        match &r.request_id {
            Some(id) => format!(" request_id={id}"),
            None => String::new(),
        },
    )
}

fn json(r: &AccessRecord) -> String {
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
        "referer": r.referer,
        "user_agent": r.user_agent,
        "cache": r.cache.log_name(),
        "backend": r.backend,
        "duration_ms": r.duration.as_secs_f64() * 1000.0,
        "error": r.error,
        "esi_omitted": r.esi_omitted(),
        "request_id": r.request_id,
    });
    format!("{v}\n")
}

/// The NCSA time format, `10/Oct/2000:13:55:36 +0000`, always in UTC.
fn httpdate_ncsa() -> String {
    // httpdate gives "Tue, 10 Oct 2000 13:55:36 GMT"; rearrange it.
    let s = httpdate::fmt_http_date(std::time::SystemTime::now());
    let parts: Vec<&str> = s.split(' ').collect();
    if parts.len() == 6 {
        format!("{}/{}/{}:{} +0000", parts[1], parts[2], parts[3], parts[4])
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_line_has_the_ncsa_fields() {
        let r = AccessRecord {
            client: Some("127.0.0.1".parse().unwrap()),
            method: "GET".into(),
            url: "/a?b".into(),
            protocol: "HTTP/1.1".into(),
            status: 200,
            bytes: 12,
            user_agent: Some("curl/8".into()),
            ..Default::default()
        };
        let line = combined(&r);
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(
            line.contains("] \"GET /a?b HTTP/1.1\" 200 12 \"-\" \"curl/8\"\n"),
            "{line}"
        );
        let j: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(j["status"], 200);
    }

    #[test]
    fn an_esi_page_that_left_includes_out_says_how_many() {
        let omitted = Arc::new(AtomicU32::new(0));
        let r = AccessRecord {
            method: "GET".into(),
            url: "/page".into(),
            status: 200,
            esi_omitted: Some(Arc::clone(&omitted)),
            ..Default::default()
        };
        assert!(
            combined(&r).ends_with("\"-\" \"-\"\n"),
            "plain NCSA when none"
        );
        omitted.store(2, Ordering::Relaxed);
        assert!(combined(&r).ends_with("\"-\" \"-\" esi_omitted=2\n"));
        let j: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(j["esi_omitted"], 2);
        let plain = AccessRecord::default();
        let j: serde_json::Value = serde_json::from_str(&json(&plain)).unwrap();
        assert!(j["esi_omitted"].is_null());
    }

    #[test]
    fn the_request_id_ends_the_line_in_both_formats() {
        let r = AccessRecord {
            method: "GET".into(),
            url: "/page".into(),
            status: 200,
            esi_omitted: Some(Arc::new(AtomicU32::new(1))),
            request_id: Some("abc-1".into()),
            ..Default::default()
        };
        assert!(
            combined(&r).ends_with("\"-\" \"-\" esi_omitted=1 request_id=abc-1\n"),
            "{}",
            combined(&r)
        );
        let j: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(j["request_id"], "abc-1");
    }

    /// A sink the test can read, and optionally hold shut.
    #[derive(Clone, Default)]
    struct Sink {
        written: Arc<parking_lot::Mutex<Vec<u8>>>,
        /// While held, writes wait: a disk or pipe that stopped taking data.
        gate: Arc<parking_lot::Mutex<()>>,
        /// Each write takes this long: a slow disk.
        delay: Duration,
        /// Writes begun, finished or not.
        begun: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.begun.fetch_add(1, Ordering::SeqCst);
            drop(self.gate.lock());
            std::thread::sleep(self.delay);
            self.written.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        /// A combined-format log writing here through a queue of `queue_lines`.
        fn log(&self, queue_lines: usize) -> AccessLog {
            AccessLog::with_writer(
                AccessLogFormat::Combined,
                Box::new(self.clone()),
                queue_lines,
            )
            .unwrap()
        }

        fn urls(&self) -> Vec<String> {
            String::from_utf8_lossy(&self.written.lock())
                .lines()
                .map(|l| l.split(' ').nth(6).unwrap_or_default().to_owned())
                .collect()
        }
    }

    fn request(i: usize) -> AccessRecord {
        AccessRecord {
            method: "GET".into(),
            url: format!("/{i}"),
            protocol: "HTTP/1.1".into(),
            status: 200,
            ..Default::default()
        }
    }

    #[test]
    fn lines_arrive_in_order_and_promptly_without_a_flush() {
        let sink = Sink::default();
        let log = sink.log(1024);
        for i in 0..100 {
            log.write(&request(i));
        }
        let want: Vec<String> = (0..100).map(|i| format!("/{i}")).collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.urls().len() < want.len() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.urls(), want);
        assert_eq!(log.dropped(), 0);
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let sink = Sink::default();
        let stalled = sink.gate.lock();
        let log = sink.log(2);
        log.write(&request(0));
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.begun.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the writer never wrote line 0");
            std::thread::yield_now();
        }
        // The writer is stuck on line 0: two lines fit in the queue, the rest go.
        let started = Instant::now();
        for i in 1..10 {
            log.write(&request(i));
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "writes blocked for {:?}",
            started.elapsed()
        );
        assert_eq!(log.dropped(), 7);
        drop(stalled);
        assert!(log.flush(Duration::from_secs(5)));
        assert_eq!(sink.urls(), ["/0", "/1", "/2"]);
    }

    #[test]
    fn flush_returns_once_every_queued_line_is_written() {
        let sink = Sink {
            delay: Duration::from_millis(50),
            ..Sink::default()
        };
        let log = sink.log(1024);
        for i in 0..20 {
            log.write(&request(i));
        }
        assert!(log.flush(Duration::from_secs(5)));
        assert_eq!(sink.urls().len(), 20);
    }

    #[test]
    fn flush_gives_up_at_its_deadline_when_the_writer_is_stuck() {
        let sink = Sink::default();
        let _stalled = sink.gate.lock();
        let log = sink.log(1);
        log.write(&request(0));
        let started = Instant::now();
        assert!(!log.flush(Duration::from_millis(100)));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

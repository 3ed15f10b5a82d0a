use super::*;

fn combined_line(r: &AccessRecord) -> String {
    let mut out = Vec::new();
    combined(r, &mut out);
    String::from_utf8(out).unwrap()
}

fn json_line(r: &AccessRecord) -> String {
    let mut out = Vec::new();
    json(r, &mut out);
    String::from_utf8(out).unwrap()
}

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
    let line = combined_line(&r);
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(
        line.contains("] \"GET /a?b HTTP/1.1\" 200 12 \"-\" \"curl/8\"\n"),
        "{line}"
    );
    let j: serde_json::Value = serde_json::from_str(&json_line(&r)).unwrap();
    assert_eq!(j["status"], 200);
    let v6 = AccessRecord {
        client: Some("2001:db8::7".parse().unwrap()),
        bytes: 18_446_744_073_709_551_615,
        ..r
    };
    let line = combined_line(&v6);
    assert!(line.starts_with("2001:db8::7 - - ["), "{line}");
    assert!(line.contains(" 200 18446744073709551615 "), "{line}");
}

#[test]
fn combined_line_escapes_quotes_and_dates_the_line_now() {
    let r = AccessRecord {
        method: "GET".into(),
        url: "/".into(),
        protocol: "HTTP/1.1".into(),
        status: 304,
        referer: Some("a\"b".into()),
        user_agent: Some("\"x\"".into()),
        ..Default::default()
    };
    let before = httpdate_ncsa(std::time::SystemTime::now());
    let line = combined_line(&r);
    let after = httpdate_ncsa(std::time::SystemTime::now());
    assert!(line.starts_with("- - - ["), "{line}");
    assert!(
        line.ends_with("] \"GET / HTTP/1.1\" 304 - \"a\\\"b\" \"\\\"x\\\"\"\n"),
        "{line}"
    );
    let date = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
    assert!(date == before || date == after, "{date}: not {before}");
    assert!(date.ends_with(" +0000") && date.len() == 26, "{date}");
}

/// The fields of an NCSA line as a log parser reads them: words, and
/// `[...]` and `"..."` fields, a backslash taking the next byte as it
/// is (`\xHH` as the byte it names).
fn ncsa_fields(line: &str) -> Vec<String> {
    let b = line.strip_suffix('\n').expect("one line").as_bytes();
    let mut fields = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let mut field = Vec::new();
        match b[i] {
            b'"' => {
                i += 1;
                while b[i] != b'"' {
                    if b[i] == b'\\' && b[i + 1] == b'x' {
                        let hex = std::str::from_utf8(&b[i + 2..i + 4]).unwrap();
                        field.push(u8::from_str_radix(hex, 16).unwrap());
                        i += 4;
                    } else {
                        i += usize::from(b[i] == b'\\');
                        field.push(b[i]);
                        i += 1;
                    }
                }
                i += 1;
            }
            b'[' => {
                let end = i + b[i..].iter().position(|&c| c == b']').unwrap();
                field.extend_from_slice(&b[i + 1..end]);
                i = end + 1;
            }
            _ => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b' ')
                    .map_or(b.len(), |n| i + n);
                field.extend_from_slice(&b[i..end]);
                i = end;
            }
        }
        fields.push(String::from_utf8(field).unwrap());
        assert!(i == b.len() || b[i] == b' ', "a field ends early: {line:?}");
        i += 1;
    }
    fields
}

/// A client's field cannot end early or break the line: a log parser
/// reads back exactly what was sent (issue 29's `-A 'x\" 500 1 "-" "forged'`).
#[test]
fn combined_line_fields_hold_backslashes_quotes_and_control_bytes() {
    for hostile in [
        r#"x\" 500 1 "-" "forged"#,
        "ends with a backslash \\",
        "tab\there, newline\nand CR\r, NUL\0, DEL\x7f",
        "caf\u{e9} \u{2028}",
    ] {
        let r = AccessRecord {
            client: Some("192.0.2.1".parse().unwrap()),
            method: "GET".into(),
            url: format!("/{hostile}"),
            protocol: "HTTP/1.1".into(),
            status: 200,
            bytes: 5,
            referer: Some(hostile.into()),
            user_agent: Some(hostile.into()),
            ..Default::default()
        };
        let line = combined_line(&r);
        let text = line.strip_suffix('\n').unwrap();
        assert!(
            text.bytes().all(|b| (b' '..=b'~').contains(&b)),
            "only printable ASCII before the newline: {line:?}"
        );
        let fields = ncsa_fields(&line);
        let request = format!("GET /{hostile} HTTP/1.1");
        let want = [
            "192.0.2.1",
            "-",
            "-",
            &fields[3],
            &request,
            "200",
            "5",
            hostile,
            hostile,
        ];
        assert_eq!(fields, want, "{line:?}");
    }
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
        combined_line(&r).ends_with("\"-\" \"-\"\n"),
        "plain NCSA when none"
    );
    omitted.store(2, Ordering::Relaxed);
    assert!(combined_line(&r).ends_with("\"-\" \"-\" esi_omitted=2\n"));
    let j: serde_json::Value = serde_json::from_str(&json_line(&r)).unwrap();
    assert_eq!(j["esi_omitted"], 2);
    let plain = AccessRecord::default();
    let j: serde_json::Value = serde_json::from_str(&json_line(&plain)).unwrap();
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
        combined_line(&r).ends_with("\"-\" \"-\" esi_omitted=1 request_id=abc-1\n"),
        "{}",
        combined_line(&r)
    );
    let j: serde_json::Value = serde_json::from_str(&json_line(&r)).unwrap();
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
    fn log(&self, queue_lines: u64) -> AccessLog {
        self.log_ticking(queue_lines, TICK)
    }

    /// The same, with the writer collecting lines every `tick`.
    fn log_ticking(&self, queue_lines: u64, tick: Duration) -> AccessLog {
        AccessLog::with_writer(
            AccessLogFormat::Combined,
            Box::new(self.clone()),
            queue_lines,
            tick,
        )
        .unwrap()
    }

    /// Wait up to 5 s for `n` lines.
    fn wait_lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.urls().len() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.urls()
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
    assert_eq!(sink.wait_lines(want.len()), want);
    assert_eq!(log.dropped(), 0);
}

/// No round, no wake-up: only a flush (or the end) writes the lines.
const NEVER: Duration = Duration::from_secs(3600);

#[test]
fn lines_wait_in_their_threads_without_waking_the_writer() {
    let sink = Sink::default();
    let log = sink.log_ticking(1024, NEVER);
    for i in 0..10 {
        log.write(&request(i));
    }
    // A wake-up would have made the writer write them by now.
    std::thread::sleep(Duration::from_millis(50));
    assert!(sink.urls().is_empty(), "{:?}", sink.urls());
    assert!(log.flush(Duration::from_secs(5)));
    assert_eq!(sink.urls().len(), 10);
}

#[test]
fn a_quarter_full_queue_wakes_the_writer() {
    let sink = Sink::default();
    let log = sink.log_ticking(40, NEVER);
    for i in 0..10 {
        log.write(&request(i));
    }
    assert_eq!(sink.wait_lines(10).len(), 10);
}

#[test]
fn flush_writes_the_lines_waiting_in_every_threads_buffer() {
    let sink = Sink::default();
    let log = sink.log_ticking(1024, NEVER);
    std::thread::scope(|s| {
        for t in 0..4 {
            let log = &log;
            s.spawn(move || {
                for i in 0..50 {
                    log.write(&request(t * 1000 + i));
                }
            });
        }
    });
    assert!(log.flush(Duration::from_secs(5)));
    let urls = sink.urls();
    assert_eq!(urls.len(), 200, "{urls:?}");
    for t in 0..4 {
        let mine: Vec<&String> = urls
            .iter()
            .filter(|u| u[1..].parse::<usize>().unwrap() / 1000 == t)
            .collect();
        let want: Vec<String> = (0..50).map(|i| format!("/{}", t * 1000 + i)).collect();
        assert_eq!(mine, want.iter().collect::<Vec<_>>(), "thread {t}");
    }
}

#[test]
fn lines_handed_in_one_after_another_on_two_threads_keep_that_order() {
    let sink = Sink::default();
    // Rounds while the lines come in: each takes lines of both threads.
    let log = sink.log_ticking(1024, Duration::from_micros(200));
    let (to_odd, odd_turn) = crossbeam_channel::bounded::<usize>(1);
    let (to_even, even_turn) = crossbeam_channel::bounded::<usize>(1);
    to_even.send(0).unwrap();
    std::thread::scope(|s| {
        let (log_a, log_b) = (&log, &log);
        s.spawn(move || {
            for i in even_turn {
                log_a.write(&request(i));
                if to_odd.send(i + 1).is_err() {
                    break;
                }
            }
        });
        s.spawn(move || {
            for i in odd_turn {
                log_b.write(&request(i));
                if i + 1 == 400 || to_even.send(i + 1).is_err() {
                    break;
                }
            }
        });
    });
    assert!(log.flush(Duration::from_secs(5)));
    let want: Vec<String> = (0..400).map(|i| format!("/{i}")).collect();
    assert_eq!(sink.urls(), want);
}

#[test]
fn the_last_clone_dropped_writes_what_is_left() {
    let sink = Sink::default();
    let log = sink.log_ticking(1024, NEVER);
    let clone = log.clone();
    for i in 0..10 {
        log.write(&request(i));
    }
    drop(log);
    clone.write(&request(10));
    drop(clone);
    assert_eq!(sink.wait_lines(11).len(), 11);
}

#[test]
fn a_sleeping_writer_is_woken_by_the_next_line() {
    let sink = Sink::default();
    let log = sink.log_ticking(1024, Duration::from_millis(1));
    log.write(&request(0));
    assert_eq!(sink.wait_lines(1).len(), 1);
    let shared = &log.handle.as_ref().unwrap().shared;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !shared.idle.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the writer never went to sleep");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Asleep, it has no tick: only the line's wake-up brings it.
    log.write(&request(1));
    assert_eq!(sink.wait_lines(2), ["/0", "/1"]);
}

#[test]
fn a_batch_split_keeps_the_early_lines_and_moves_the_late_ones() {
    let mut batch = Batch::default();
    for (n, line) in [(3, "a\n"), (5, "bb\n"), (9, "ccc\n")] {
        batch.push(n, line.as_bytes());
    }
    let mut rest = Batch::default();
    batch.split_off(6, &mut rest);
    assert_eq!(
        (batch.text.as_slice(), rest.text.as_slice()),
        (&b"a\nbb\n"[..], &b"ccc\n"[..])
    );
    assert_eq!(
        (batch.lines, rest.lines),
        (vec![(3, 2), (5, 5)], vec![(9, 4)])
    );
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

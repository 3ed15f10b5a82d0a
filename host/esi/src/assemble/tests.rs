//! Assembler tests with a fake fetcher on tokio's paused clock, so every
//! delay and timestamp below is exact.

use std::collections::HashMap;
use std::sync::Mutex;

use futures_util::stream;
use http::{HeaderMap, HeaderValue};
use tokio::time::sleep;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// One fake fragment.
#[derive(Clone)]
struct Frag {
    status: u16,
    /// Before the fetch answers.
    delay: Duration,
    /// Body chunks, each after its own delay.
    chunks: Vec<(Duration, &'static str)>,
    /// After the chunks, the body fails.
    body_error: bool,
    esi: bool,
    /// The fetcher panics.
    panic: bool,
}

fn frag(delay_ms: u64, body: &'static str) -> Frag {
    Frag {
        status: 200,
        delay: Duration::from_millis(delay_ms),
        chunks: vec![(Duration::ZERO, body)],
        body_error: false,
        esi: false,
        panic: false,
    }
}

fn esi_frag(delay_ms: u64, body: &'static str) -> Frag {
    Frag {
        esi: true,
        ..frag(delay_ms, body)
    }
}

fn status(code: u16) -> Frag {
    Frag {
        status: code,
        ..frag(0, "error page")
    }
}

/// What happened to fetches, with paused-clock timestamps since the start.
#[derive(Default)]
struct Log {
    started: Vec<(String, Duration)>,
    /// The body was fully produced.
    finished: Vec<(String, Duration)>,
    /// Fetch futures or bodies dropped before finishing.
    dropped: usize,
    /// Includes left out, as reported to `FragmentFetcher::omitted`.
    omitted: Vec<(String, String)>,
}

struct Fake {
    frags: HashMap<&'static str, Frag>,
    /// Bodies at hand (`Fetch::Ready`), like fresh cache hits.
    ready: HashMap<&'static str, &'static str>,
    log: Arc<Mutex<Log>>,
    t0: Instant,
}

/// Counts a drop unless disarmed (the fetch finished).
struct DropProbe {
    log: Arc<Mutex<Log>>,
    armed: bool,
}

impl Drop for DropProbe {
    fn drop(&mut self) {
        if self.armed {
            self.log.lock().expect("log").dropped += 1;
        }
    }
}

impl Fake {
    fn new(frags: impl IntoIterator<Item = (&'static str, Frag)>) -> Arc<Fake> {
        Self::with_ready(frags, [])
    }

    fn with_ready(
        frags: impl IntoIterator<Item = (&'static str, Frag)>,
        ready: impl IntoIterator<Item = (&'static str, &'static str)>,
    ) -> Arc<Fake> {
        Arc::new(Fake {
            frags: frags.into_iter().collect(),
            ready: ready.into_iter().collect(),
            log: Arc::default(),
            t0: Instant::now(),
        })
    }

    fn started(&self) -> Vec<(String, Duration)> {
        self.log.lock().expect("log").started.clone()
    }

    fn start_of(&self, src: &str) -> Duration {
        self.started()
            .into_iter()
            .find(|(s, _)| s == src)
            .unwrap_or_else(|| panic!("{src} never started"))
            .1
    }

    fn finish_of(&self, src: &str) -> Duration {
        self.log
            .lock()
            .expect("log")
            .finished
            .iter()
            .find(|(s, _)| s == src)
            .unwrap_or_else(|| panic!("{src} never finished"))
            .1
    }

    fn fetches(&self) -> usize {
        self.started().len()
    }

    /// `(src, reason)` of every include left out.
    fn omitted(&self) -> Vec<(String, String)> {
        self.log.lock().expect("log").omitted.clone()
    }
}

impl FragmentFetcher for Fake {
    fn fetch(&self, src: &str) -> Fetch {
        if let Some(b) = self.ready.get(src) {
            return Fetch::Ready(Bytes::from_static(b.as_bytes()));
        }
        let t0 = self.t0;
        let log = Arc::clone(&self.log);
        let src = src.to_owned();
        let frag = self.frags.get(src.as_str()).cloned();
        Fetch::Pending(Box::pin(async move {
            // A fetch starts when it is first polled (see `Fetch::Pending`).
            log.lock()
                .expect("log")
                .started
                .push((src.clone(), t0.elapsed()));
            let Some(f) = frag else {
                return Err(FragmentError::NotAllowed(src));
            };
            assert!(!f.panic, "fetcher panics for {src}");
            let mut probe = DropProbe {
                log: Arc::clone(&log),
                armed: true,
            };
            sleep(f.delay).await;
            let state = (
                f.chunks.into_iter(),
                f.body_error,
                Some(probe_take(&mut probe)),
            );
            let body = stream::unfold(state, move |(mut chunks, err, mut probe)| {
                let log = Arc::clone(&log);
                let src = src.clone();
                async move {
                    if let Some((d, c)) = chunks.next() {
                        sleep(d).await;
                        return Some((Ok(Bytes::from_static(c.as_bytes())), (chunks, err, probe)));
                    }
                    let mut p = probe.take()?;
                    p.armed = false;
                    if err {
                        return Some((
                            Err::<Bytes, BoxError>("body broke".into()),
                            (chunks, false, None),
                        ));
                    }
                    log.lock().expect("log").finished.push((src, t0.elapsed()));
                    None
                }
            });
            Ok(Fragment {
                status: f.status,
                body: body.boxed(),
                esi: f.esi,
            })
        }))
    }

    fn omitted(&self, src: &str, reason: &FailureReason) {
        self.log
            .lock()
            .expect("log")
            .omitted
            .push((src.to_owned(), reason.to_string()));
    }
}

/// Move the probe's duty into a new probe (the old one is disarmed).
fn probe_take(p: &mut DropProbe) -> DropProbe {
    p.armed = false;
    DropProbe {
        log: Arc::clone(&p.log),
        armed: true,
    }
}

fn page(chunks: Vec<(u64, &'static str)>) -> BoxStream<'static, Result<Bytes, BoxError>> {
    stream::iter(chunks)
        .then(|(ms, c)| async move {
            sleep(Duration::from_millis(ms)).await;
            Ok::<_, BoxError>(Bytes::from_static(c.as_bytes()))
        })
        .boxed()
}

/// ESI 1.0 failure handling ([`OnIncludeError::Fail`]), so that a failure
/// nothing handles shows as an error; [`omit`] is the default mode.
fn limits() -> EsiLimits {
    EsiLimits {
        max_depth: 5,
        max_includes: 256,
        max_concurrency: 16,
        include_timeout: Duration::from_secs(10),
        page_deadline: Duration::from_secs(60),
        on_include_error: OnIncludeError::Fail,
        max_buffered_bytes: 16 * 1024 * 1024,
    }
}

/// The default mode: failures nothing handles leave the include out.
fn omit() -> EsiLimits {
    EsiLimits {
        on_include_error: OnIncludeError::Omit,
        ..limits()
    }
}

struct Run {
    text: String,
    error: Option<EsiError>,
    elapsed: Duration,
}

async fn run_with(
    body: BoxStream<'static, Result<Bytes, BoxError>>,
    fake: &Arc<Fake>,
    vars: EsiVars,
    limits: EsiLimits,
) -> Run {
    let t0 = Instant::now();
    let fetcher: Arc<dyn FragmentFetcher> = Arc::clone(fake) as _;
    let mut out = assemble(body, Arc::new(vars), fetcher, limits);
    let mut text = String::new();
    let mut error = None;
    while let Some(item) = out.next().await {
        match item {
            Ok(b) => text.push_str(&String::from_utf8_lossy(&b)),
            Err(e) => {
                error = Some(e);
                assert!(out.next().await.is_none(), "nothing after the error");
                break;
            }
        }
    }
    Run {
        text,
        error,
        elapsed: t0.elapsed(),
    }
}

async fn run(body: &'static str, fake: &Arc<Fake>, limits: EsiLimits) -> Run {
    run_with(page(vec![(0, body)]), fake, EsiVars::new(), limits).await
}

#[tokio::test(start_paused = true)]
async fn text_before_the_first_include_is_yielded_at_once() {
    let fake = Fake::new([("/slow", frag(10_000, "S"))]);
    let t0 = Instant::now();
    let fetcher: Arc<dyn FragmentFetcher> = Arc::clone(&fake) as _;
    let mut out = assemble(
        page(vec![(0, "Hello <esi:include src=\"/slow\"/> bye")]),
        Arc::new(EsiVars::new()),
        fetcher,
        limits(),
    );
    let first = out.next().await.expect("an item").expect("ok");
    assert_eq!(&first[..], b"Hello ");
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "TTFB does not wait for includes"
    );
    let mut rest = Vec::new();
    while let Some(item) = out.next().await {
        rest.extend_from_slice(&item.expect("ok"));
    }
    assert_eq!(rest, b"S bye");
    assert_eq!(t0.elapsed(), 10_000 * MS);
}

#[tokio::test(start_paused = true)]
async fn order_is_kept_when_fragments_finish_out_of_order() {
    let fake = Fake::new([
        ("/a", frag(30, "A")),
        ("/b", frag(10, "B")),
        ("/c", frag(20, "C")),
    ]);
    let r = run(
        r#"1<esi:include src="/a"/>2<esi:include src="/b"/>3<esi:include src="/c"/>4"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "1A2B3C4");
    assert!(r.error.is_none());
    assert_eq!(r.elapsed, 30 * MS, "fetched in parallel");
}

#[tokio::test(start_paused = true)]
async fn all_includes_start_before_the_first_finishes() {
    let fake = Fake::new([
        ("/a", frag(50, "A")),
        ("/b", frag(10, "B")),
        ("/c", frag(40, "C")),
        ("/d", frag(20, "D")),
    ]);
    // The page body itself streams in over 30 ms; each include starts when
    // its tag arrives, not at the end of the body nor when it is its turn.
    let body = page(vec![
        (0, r#"<esi:include src="/a"/><esi:include src="/b"/>"#),
        (5, r#"<esi:include src="/c"/>"#),
        (25, r#"<esi:include src="/d"/>end"#),
    ]);
    let r = run_with(body, &fake, EsiVars::new(), limits()).await;
    assert_eq!(r.text, "ABCDend");
    let starts: HashMap<String, Duration> = fake.started().into_iter().collect();
    assert_eq!(starts["/a"], Duration::ZERO);
    assert_eq!(starts["/b"], Duration::ZERO);
    assert_eq!(starts["/c"], 5 * MS);
    assert_eq!(starts["/d"], 30 * MS);
    let first_finish = fake.finish_of("/b");
    assert_eq!(first_finish, 10 * MS);
    assert!(starts["/a"] < first_finish && starts["/c"] < first_finish);
    assert_eq!(r.elapsed, 50 * MS);
}

#[tokio::test(start_paused = true)]
async fn serial_mode_takes_the_sum_of_delays() {
    let fake = Fake::new([
        ("/a", frag(30, "A")),
        ("/b", frag(10, "B")),
        ("/c", frag(20, "C")),
    ]);
    let r = run(
        r#"<esi:include src="/a"/><esi:include src="/b"/><esi:include src="/c"/>"#,
        &fake,
        EsiLimits {
            max_concurrency: 1,
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "ABC");
    assert_eq!(r.elapsed, 60 * MS);
    assert_eq!(fake.start_of("/b"), 30 * MS);
    assert_eq!(fake.start_of("/c"), 40 * MS);
}

#[tokio::test(start_paused = true)]
async fn concurrency_limit_bounds_parallel_fetches() {
    let fake = Fake::new([
        ("/a", frag(10, "A")),
        ("/b", frag(10, "B")),
        ("/c", frag(10, "C")),
        ("/d", frag(10, "D")),
    ]);
    let r = run(
        r#"<esi:include src="/a"/><esi:include src="/b"/><esi:include src="/c"/><esi:include src="/d"/>"#,
        &fake,
        EsiLimits {
            max_concurrency: 2,
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "ABCD");
    assert_eq!(r.elapsed, 20 * MS);
}

#[tokio::test(start_paused = true)]
async fn depth_limit_stops_a_fragment_that_includes_itself() {
    let fake = Fake::new([(
        "/self",
        esi_frag(1, r#"x<esi:include src="/self" onerror="continue"/>"#),
    )]);
    let r = run(r#"<esi:include src="/self"/>."#, &fake, limits()).await;
    assert_eq!(r.text, "xxxxx.", "depths 1..=5 are served, depth 6 fails");
    assert!(r.error.is_none());
    assert_eq!(fake.fetches(), 5);

    // Without onerror too, even with on_include_error = "fail": the include
    // that would go too deep is left out (as Varnish does), nothing else.
    let fake = Fake::new([("/self", esi_frag(1, r#"x<esi:include src="/self"/>"#))]);
    let r = run(r#"a<esi:include src="/self"/>b"#, &fake, limits()).await;
    assert_eq!(r.text, "axxxxxb");
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(fake.fetches(), 5);
    assert_eq!(
        fake.omitted(),
        vec![(
            "/self".to_owned(),
            FailureReason::DepthExceeded(5).to_string()
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn by_default_a_failure_nothing_handles_leaves_the_include_out() {
    let fake = Fake::new([
        ("/404", status(404)),
        ("/500", status(500)),
        ("/a", frag(5, "A")),
        ("/outer", esi_frag(0, r#"O<esi:include src="/404"/>o"#)),
    ]);
    // Failure known at once (refused by the fetcher) and failure by status.
    let r = run(
        r#"<esi:include src="/nope"/>before<esi:include src="/404" alt="/500"/>[<esi:include src="/a"/>]after"#,
        &fake,
        omit(),
    )
    .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.text, "before[A]after");
    let srcs: Vec<String> = fake.omitted().into_iter().map(|(s, _)| s).collect();
    assert_eq!(srcs, vec!["/nope".to_owned(), "/404".to_owned()]);

    // In a nested fragment only the failed include is left out.
    let fake = Fake::new([
        ("/404", status(404)),
        ("/outer", esi_frag(0, r#"O<esi:include src="/404"/>o"#)),
    ]);
    let r = run(r#"<esi:include src="/outer"/>."#, &fake, omit()).await;
    assert_eq!(r.text, "Oo.");
    assert_eq!(fake.omitted().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn omit_mode_keeps_every_fallback_the_page_asks_for() {
    let fake = Fake::new([
        ("/404", status(404)),
        ("/a", frag(0, "A")),
        ("/e", frag(0, "E")),
        ("/outer", esi_frag(0, r#"<esi:include src="/404"/>o"#)),
    ]);
    // A nested failure still falls back to the outer include's alt (none of
    // the outer fragment was written yet).
    let r = run(r#"<esi:include src="/outer" alt="/a"/>."#, &fake, omit()).await;
    assert_eq!(r.text, "A.");
    // A failure in esi:attempt still selects esi:except.
    let r = run(
        r#"<esi:try><esi:attempt>a<esi:include src="/outer"/></esi:attempt><esi:except><esi:include src="/e"/></esi:except></esi:try>."#,
        &fake,
        omit(),
    )
    .await;
    assert_eq!(r.text, "E.");
    assert!(fake.omitted().is_empty(), "{:?}", fake.omitted());
    // A failure in esi:except is left out, with the rest of the page kept.
    let r = run(
        r#"<esi:try><esi:attempt><esi:include src="/404"/></esi:attempt><esi:except>e<esi:include src="/404"/>!</esi:except></esi:try>."#,
        &fake,
        omit(),
    )
    .await;
    assert_eq!(r.text, "e!.");
    assert!(r.error.is_none());
    assert_eq!(fake.omitted().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn omit_mode_after_part_of_a_fragment_was_written_skips_only_its_rest() {
    let broken = Frag {
        chunks: vec![(Duration::ZERO, "p1"), (10 * MS, "p2")],
        body_error: true,
        ..frag(0, "")
    };
    let fake = Fake::new([("/broken", broken)]);
    let r = run(r#"<esi:include src="/broken"/>after"#, &fake, omit()).await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(
        r.text.starts_with("p1") && r.text.ends_with("after"),
        "{}",
        r.text
    );
    assert_eq!(fake.omitted().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn include_budget_caps_fan_out() {
    let fake = Fake::new([("/a", frag(1, "a"))]);
    let body: &'static str =
        String::leak(r#"<esi:include src="/a" onerror="continue"/>"#.repeat(300));
    let r = run(body, &fake, limits()).await;
    assert_eq!(r.text, "a".repeat(256));
    assert_eq!(fake.fetches(), 256);

    // Nested includes count against the same page budget.
    let fake = Fake::new([
        (
            "/n",
            esi_frag(
                1,
                r#"<esi:include src="/a" onerror="continue"/><esi:include src="/a" onerror="continue"/>"#,
            ),
        ),
        ("/a", frag(1, "a")),
    ]);
    let r = run(
        r#"<esi:include src="/n"/><esi:include src="/n"/>"#,
        &fake,
        EsiLimits {
            max_includes: 4,
            ..limits()
        },
    )
    .await;
    assert_eq!(fake.fetches(), 4);
    assert_eq!(r.text, "aa");
}

#[tokio::test(start_paused = true)]
async fn include_timeout_uses_alt() {
    let slow_body = Frag {
        chunks: vec![(Duration::ZERO, "part"), (10_000 * MS, "rest")],
        ..frag(0, "")
    };
    let fake = Fake::new([
        ("/slow", frag(10_000, "S")),
        ("/slow-body", slow_body),
        ("/fast", frag(0, "F")),
    ]);
    let r = run(
        r#"<esi:include src="/slow" alt="/fast"/>"#,
        &fake,
        EsiLimits {
            include_timeout: Duration::from_secs(1),
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "F");
    assert_eq!(r.elapsed, Duration::from_secs(1));
    assert_eq!(fake.start_of("/fast"), Duration::from_secs(1));

    // A body that stalls times out too; its first part was not written yet
    // (a slower include comes first), so alt still replaces it.
    let fake_ = Fake::new([
        ("/slow-body", fake.frags["/slow-body"].clone()),
        // A chain of nested fragments that takes 3 s, each within its own 2 s.
        ("/first", esi_frag(0, r#"<esi:include src="/x"/>"#)),
        ("/x", esi_frag(1_500, r#"<esi:include src="/y"/>"#)),
        ("/y", frag(1_500, "1")),
        ("/fast", frag(0, "F")),
    ]);
    let r = run(
        r#"<esi:include src="/first"/><esi:include src="/slow-body" alt="/fast"/>"#,
        &fake_,
        EsiLimits {
            include_timeout: Duration::from_secs(2),
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "1F");
    assert_eq!(fake_.start_of("/fast"), Duration::from_secs(2));
    assert_eq!(r.elapsed, Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn page_deadline_fails_outstanding_includes() {
    let fake = Fake::new([("/slow", frag(10_000, "S")), ("/a", frag(0, "A"))]);
    let r = run(
        r#"before<esi:include src="/slow" alt="/a" onerror="continue"/>after"#,
        &fake,
        EsiLimits {
            include_timeout: Duration::from_secs(5),
            page_deadline: Duration::from_secs(2),
            ..limits()
        },
    )
    .await;
    // At the deadline the include fails, alt cannot start any more, continue applies.
    assert_eq!(r.text, "beforeafter");
    assert!(r.error.is_none());
    assert_eq!(r.elapsed, Duration::from_secs(2));
    assert_eq!(fake.fetches(), 1, "no alt fetch after the deadline");

    let r = run(
        r#"before<esi:include src="/slow"/>after"#,
        &fake,
        EsiLimits {
            page_deadline: Duration::from_secs(2),
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "before");
    assert!(matches!(
        r.error,
        Some(EsiError::Include {
            reason: FailureReason::PageDeadline,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn page_deadline_bounds_a_slow_page_body() {
    let fake = Fake::new([]);
    let body = page(vec![(0, "a"), (5_000, "b")]);
    let r = run_with(
        body,
        &fake,
        EsiVars::new(),
        EsiLimits {
            page_deadline: Duration::from_secs(2),
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "a");
    assert!(
        matches!(r.error, Some(EsiError::PageDeadline)),
        "{:?}",
        r.error
    );
    assert_eq!(r.elapsed, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn alt_and_onerror() {
    let fake = Fake::new([
        ("/404", status(404)),
        ("/500", status(500)),
        ("/a", frag(0, "A")),
    ]);
    let r = run(r#"<esi:include src="/404" alt="/a"/>"#, &fake, limits()).await;
    assert_eq!(r.text, "A");
    // A fetch error (unknown to the fetcher) with continue: nothing.
    let r = run(
        r#"x<esi:include src="/nope" onerror="continue"/>y"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "xy");
    assert!(r.error.is_none());
    // Both fail, continue: nothing.
    let r = run(
        r#"x<esi:include src="/404" alt="/500" onerror="continue"/>y"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "xy");
    // Both fail, no continue: the page ends after what was sent.
    let r = run(
        r#"before<esi:include src="/404" alt="/500"/>after"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "before");
    match r.error {
        Some(EsiError::Include {
            src,
            reason: FailureReason::Status(404),
        }) => assert_eq!(src, "/404"),
        e => panic!("unexpected {e:?}"),
    }
    // A fetcher error is reported as such.
    let r = run(r#"<esi:include src="/nope"/>"#, &fake, limits()).await;
    assert!(matches!(
        r.error,
        Some(EsiError::Include {
            reason: FailureReason::Fetch(FragmentError::NotAllowed(_)),
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn nested_includes_start_early() {
    let fake = Fake::new([
        ("/outer", esi_frag(10, r#"O<esi:include src="/inner"/>o"#)),
        ("/inner", frag(10, "I")),
        ("/sibling", frag(100, "S")),
    ]);
    let r = run(
        r#"<esi:include src="/outer"/><esi:include src="/sibling"/>"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "OIoS");
    assert_eq!(fake.start_of("/inner"), 10 * MS);
    assert!(fake.start_of("/inner") < fake.finish_of("/sibling"));
    assert_eq!(r.elapsed, 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn nested_failure_falls_back_to_the_outer_alt() {
    let fake = Fake::new([
        ("/outer", esi_frag(0, r#"<esi:include src="/404"/>"#)),
        ("/404", status(404)),
        ("/a", frag(0, "A")),
    ]);
    let r = run(r#"<esi:include src="/outer" alt="/a"/>"#, &fake, limits()).await;
    assert_eq!(r.text, "A");
    assert!(r.error.is_none());
}

#[tokio::test(start_paused = true)]
async fn try_selects_except_on_failure() {
    let fake = Fake::new([
        ("/404", status(404)),
        ("/a", frag(5, "A")),
        ("/e", frag(0, "E")),
    ]);
    let r = run(
        r#"[<esi:try><esi:attempt>a<esi:include src="/a"/><esi:include src="/404"/></esi:attempt><esi:except>e<esi:include src="/e"/></esi:except></esi:try>]"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "[eE]", "no attempt output leaks out");
    assert!(r.error.is_none());

    let fake = Fake::new([("/a", frag(5, "A")), ("/e", frag(0, "E"))]);
    let r = run(
        r#"[<esi:try><esi:attempt>a<esi:include src="/a"/></esi:attempt><esi:except><esi:include src="/e"/></esi:except></esi:try>]"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "[aA]");
    assert!(
        !fake.started().iter().any(|(s, _)| s == "/e"),
        "except is fetched only after a failure"
    );

    // A failure inside except is a failure of the page.
    let r = run(
        r#"<esi:try><esi:attempt><esi:include src="/404"/></esi:attempt><esi:except><esi:include src="/404"/></esi:except></esi:try>"#,
        &fake,
        limits(),
    )
    .await;
    assert!(r.error.is_some());
}

#[tokio::test(start_paused = true)]
async fn only_the_chosen_branch_is_fetched_and_variables_apply() {
    let fake = Fake::new([("/gold/42", frag(0, "G")), ("/std", frag(0, "S"))]);
    let mut headers = HeaderMap::new();
    headers.insert("cookie", HeaderValue::from_static("tier=gold; id=42"));
    let vars = EsiVars::from_request("example.com", "/p?x=1", &headers);
    let body = page(vec![(
        0,
        r#"<esi:choose><esi:when test="$(HTTP_COOKIE{tier}) == 'gold'"><esi:include src="/gold/$(HTTP_COOKIE{id})"/></esi:when><esi:otherwise><esi:include src="/std"/></esi:otherwise></esi:choose><esi:vars>@$(HTTP_HOST)?$(QUERY_STRING{x})</esi:vars>"#,
    )]);
    let r = run_with(body, &fake, vars, limits()).await;
    assert_eq!(r.text, "G@example.com?1");
    let started: Vec<String> = fake.started().into_iter().map(|(s, _)| s).collect();
    assert_eq!(started, vec!["/gold/42".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn non_esi_fragments_pass_through_and_esi_ones_are_processed() {
    let fake = Fake::new([
        ("/raw", frag(0, r#"<esi:include src="/a"/>"#)),
        (
            "/esi",
            esi_frag(0, r#"<esi:include src="/a"/><esi:remove>x</esi:remove>"#),
        ),
        ("/a", frag(0, "A")),
    ]);
    let r = run(
        r#"<esi:include src="/raw"/>|<esi:include src="/esi"/>"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, r#"<esi:include src="/a"/>|A"#);
}

#[tokio::test(start_paused = true)]
async fn failure_after_part_of_a_fragment_was_written() {
    let broken = Frag {
        chunks: vec![(Duration::ZERO, "p1"), (10 * MS, "p2")],
        body_error: true,
        ..frag(0, "")
    };
    let fake = Fake::new([
        ("/broken", broken),
        ("/a", frag(0, "A")),
        ("/slow", frag(50, "S")),
    ]);
    // At the head: "p1" is already out when the body fails; alt cannot
    // replace it, so the page ends ("p2", queued with the failure, is not written).
    let r = run(
        r#"<esi:include src="/broken" alt="/a"/>after"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "p1");
    assert!(matches!(
        r.error,
        Some(EsiError::Include {
            reason: FailureReason::Truncated,
            ..
        })
    ));
    // With onerror=continue the rest of the page follows.
    let r = run(
        r#"<esi:include src="/broken" alt="/a" onerror="continue"/>after"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "p1p2after");
    assert!(r.error.is_none());
    // Not at the head yet when it fails: nothing was written, alt replaces it.
    let r = run(
        r#"<esi:include src="/slow"/><esi:include src="/broken" alt="/a"/>after"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "SAafter");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_output_cancels_outstanding_fetches() {
    let fake = Fake::new([
        ("/a", frag(1_000, "A")),
        ("/n", esi_frag(10, r#"<esi:include src="/b"/>"#)),
        ("/b", frag(1_000, "B")),
    ]);
    let fetcher: Arc<dyn FragmentFetcher> = Arc::clone(&fake) as _;
    let mut out = assemble(
        page(vec![(
            0,
            r#"x<esi:include src="/a"/><esi:include src="/n"/>"#,
        )]),
        Arc::new(EsiVars::new()),
        fetcher,
        limits(),
    );
    assert_eq!(&out.next().await.expect("item").expect("ok")[..], b"x");
    sleep(20 * MS).await;
    assert_eq!(fake.fetches(), 3, "/a, /n and the nested /b started");
    drop(out);
    sleep(5_000 * MS).await;
    let log = fake.log.lock().expect("log");
    assert!(
        log.finished.iter().all(|(s, _)| s == "/n"),
        "{:?}",
        log.finished
    );
    assert_eq!(log.dropped, 2, "/a and /b were cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_fetcher_is_a_failure() {
    let fake = Fake::new([(
        "/boom",
        Frag {
            panic: true,
            ..frag(0, "")
        },
    )]);
    let r = run(
        r#"a<esi:include src="/boom" onerror="continue"/>b"#,
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "ab");
    let r = run(r#"a<esi:include src="/boom"/>b"#, &fake, limits()).await;
    assert_eq!(r.text, "a");
    assert!(matches!(
        r.error,
        Some(EsiError::Include {
            reason: FailureReason::TaskLost,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn page_body_error_ends_the_page() {
    let fake = Fake::new([]);
    let body = stream::iter(vec![
        Ok(Bytes::from_static(b"ok")),
        Err::<Bytes, BoxError>("reset".into()),
    ])
    .boxed();
    let r = run_with(body, &fake, EsiVars::new(), limits()).await;
    assert_eq!(r.text, "ok");
    assert!(matches!(r.error, Some(EsiError::Body(_))));
}

#[tokio::test(start_paused = true)]
async fn unclosed_blocks_and_streamed_tags_still_assemble() {
    let fake = Fake::new([("/a", frag(3, "A"))]);
    // The tag arrives split over three chunks.
    let body = page(vec![
        (0, "1<esi:inc"),
        (1, "lude src=\"/"),
        (1, "a\"/>2<esi:try><esi:attempt>t"),
    ]);
    let r = run_with(body, &fake, EsiVars::new(), limits()).await;
    assert_eq!(r.text, "1A2t");
}

#[tokio::test(start_paused = true)]
async fn fragments_at_hand_are_written_in_place_in_order_without_a_fetch() {
    let fake = Fake::with_ready([("/slow", frag(100, "S"))], [("/r1", "R1"), ("/r2", "R2")]);
    let r = run(
        "a<esi:include src=\"/r1\"/>b<esi:include src=\"/slow\"/>c<esi:include src=\"/r2\"/>d",
        &fake,
        limits(),
    )
    .await;
    assert_eq!(r.text, "aR1bScR2d");
    assert!(r.error.is_none());
    assert_eq!(fake.started(), vec![("/slow".to_owned(), Duration::ZERO)]);
    assert_eq!(r.elapsed, 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn fragments_at_hand_count_against_the_include_budget() {
    let fake = Fake::with_ready([], [("/r", "R")]);
    let page = "<esi:include src=\"/r\" onerror=\"continue\"/>".repeat(5);
    let body: &'static str = Box::leak(page.into_boxed_str());
    let r = run(
        body,
        &fake,
        EsiLimits {
            max_includes: 3,
            ..limits()
        },
    )
    .await;
    assert_eq!(r.text, "RRR");
    assert!(r.error.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_parsed_template_assembles_like_its_body() {
    let fake = Fake::with_ready([("/f", frag(5, "F"))], [("/r", "R")]);
    let body = "<p><esi:include src=\"/f\"/>-<esi:include src=\"/r\"/>\
                <esi:choose><esi:when test=\"1==1\">yes</esi:when></esi:choose></p>";
    let streamed = run(body, &fake, limits()).await.text;
    let nodes: Arc<[Node]> = crate::parse(body.as_bytes()).into();
    let fetcher: Arc<dyn FragmentFetcher> = Arc::clone(&fake) as _;
    let mut out = assemble_parsed(nodes, Arc::new(EsiVars::new()), fetcher, limits());
    let mut text = String::new();
    while let Some(item) = out.next().await {
        text.push_str(&String::from_utf8_lossy(&item.expect("no error")));
    }
    assert_eq!(text, "<p>F-Ryes</p>");
    assert_eq!(text, streamed);
}

#[tokio::test(start_paused = true)]
async fn page_text_is_not_read_far_ahead_of_a_pending_include() {
    let fake = Fake::new([("/slow", frag(100, "S"))]);
    const MIB: usize = 1024 * 1024;
    let chunks = 2 * MAX_PAGE_AHEAD / MIB;
    // When each page chunk was read.
    let pulled: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let t0 = Instant::now();
    let body = {
        let pulled = Arc::clone(&pulled);
        let first = stream::iter([Ok::<_, BoxError>(Bytes::from_static(
            b"<esi:include src=\"/slow\"/>",
        ))]);
        let rest = stream::iter(0..chunks).map(move |_| {
            pulled.lock().expect("pulled").push(t0.elapsed());
            Ok::<_, BoxError>(Bytes::from(vec![b'a'; MIB]))
        });
        first.chain(rest).boxed()
    };
    let fetcher: Arc<dyn FragmentFetcher> = Arc::clone(&fake) as _;
    let mut out = assemble(body, Arc::new(EsiVars::new()), fetcher, omit());
    let mut len = 0;
    let mut first = None;
    while let Some(item) = out.next().await {
        let b = item.expect("no error");
        first.get_or_insert(b[0]);
        len += b.len();
    }
    assert_eq!(first, Some(b'S'));
    assert_eq!(len, 1 + chunks * MIB, "the whole page, in order");
    let pulled = pulled.lock().expect("pulled");
    let early = pulled.iter().filter(|t| **t < 100 * MS).count();
    assert_eq!(
        early,
        MAX_PAGE_AHEAD / MIB,
        "while /slow is pending, the page is read up to the limit only"
    );
}

/// A fragment of `chunks` chunks of `size` bytes of `byte`, each chunk
/// `every_ms` after the one before.
fn big(delay_ms: u64, chunks: usize, size: usize, byte: u8, every_ms: u64) -> Frag {
    let text: &'static str = Box::leak(
        String::from_utf8(vec![byte; size])
            .expect("ascii")
            .into_boxed_str(),
    );
    Frag {
        chunks: (0..chunks)
            .map(|i| {
                let d = if i == 0 { 0 } else { every_ms };
                (Duration::from_millis(d), text)
            })
            .collect(),
        ..frag(delay_ms, "")
    }
}

/// Assemble `markup` to the end (a hang fails after 30 s of the paused
/// clock, far past every delay below); the text and the page's budget peak.
async fn run_budgeted(
    markup: &'static str,
    fake: &Arc<Fake>,
    limits: EsiLimits,
) -> (String, usize) {
    let fetcher: Arc<dyn FragmentFetcher> = Arc::clone(fake) as _;
    let (mut out, budget) = start_page(
        PageInput::Stream(page(vec![(0, markup)])),
        Arc::new(EsiVars::new()),
        fetcher,
        limits,
    );
    let collect = async {
        let mut text = String::new();
        while let Some(item) = out.next().await {
            text.push_str(&String::from_utf8_lossy(&item.expect("no error")));
        }
        text
    };
    let text = tokio::time::timeout(Duration::from_secs(30), collect)
        .await
        .expect("the page hangs");
    (text, budget.peak.load(Ordering::Relaxed))
}

fn tight(max_buffered_bytes: usize, max_concurrency: usize) -> EsiLimits {
    EsiLimits {
        max_buffered_bytes,
        max_concurrency,
        include_timeout: Duration::from_secs(10),
        page_deadline: Duration::from_secs(3600),
        ..limits()
    }
}

#[tokio::test(start_paused = true)]
async fn fragment_output_ahead_of_its_turn_is_bounded_by_the_budget() {
    const MIB: usize = 1024 * 1024;
    let srcs = [
        "/f0", "/f1", "/f2", "/f3", "/f4", "/f5", "/f6", "/f7", "/f8", "/f9",
    ];
    let mut frags = vec![("/slow", frag(1000, "S"))];
    for (i, src) in srcs.iter().enumerate() {
        // 4 MiB each, in 1 MiB chunks, all at once.
        frags.push((*src, big(0, 4, MIB, b'a' + i as u8, 0)));
    }
    let fake = Fake::new(frags);
    let markup = "<esi:include src=\"/slow\"/><esi:include src=\"/f0\"/>\
        <esi:include src=\"/f1\"/><esi:include src=\"/f2\"/><esi:include src=\"/f3\"/>\
        <esi:include src=\"/f4\"/><esi:include src=\"/f5\"/><esi:include src=\"/f6\"/>\
        <esi:include src=\"/f7\"/><esi:include src=\"/f8\"/><esi:include src=\"/f9\"/>";
    let (text, peak) = run_budgeted(markup, &fake, tight(MIB, 16)).await;
    let mut want = String::from("S");
    for i in 0..10u8 {
        want.push_str(&String::from_utf8(vec![b'a' + i; 4 * MIB]).expect("ascii"));
    }
    assert!(text == want, "the whole page, in order");
    assert!(fake.omitted().is_empty(), "{:?}", fake.omitted());
    assert!(peak > 0, "fragments ahead were held");
    assert!(
        peak <= 2 * MIB,
        "held {peak} bytes: more than the budget and one chunk"
    );
}

#[tokio::test(start_paused = true)]
async fn backpressure_does_not_deadlock() {
    // Each fragment is larger than the 4-byte budget; they finish in
    // reverse order; some are ESI with nested fragments; serial and parallel.
    let fake = Fake::new([
        ("/a", big(300, 3, 10, b'a', 10)),
        ("/b", big(200, 3, 10, b'b', 10)),
        ("/c", big(100, 3, 10, b'c', 10)),
        (
            "/n",
            esi_frag(50, "[<esi:include src=\"/c\"/>|<esi:include src=\"/b\"/>]"),
        ),
        ("/d", big(0, 3, 10, b'd', 0)),
    ]);
    let markup = "<esi:include src=\"/a\"/><esi:include src=\"/d\"/><esi:include src=\"/n\"/>\
        <esi:include src=\"/d\"/><esi:include src=\"/b\"/>";
    let want = format!(
        "{}{}[{}|{}]{}{}",
        "a".repeat(30),
        "d".repeat(30),
        "c".repeat(30),
        "b".repeat(30),
        "d".repeat(30),
        "b".repeat(30)
    );
    for concurrency in [1, 2, 16] {
        let (text, _) = run_budgeted(markup, &fake, tight(4, concurrency)).await;
        assert_eq!(text, want, "max_concurrency {concurrency}");
    }
    assert!(fake.omitted().is_empty(), "{:?}", fake.omitted());
}

#[tokio::test(start_paused = true)]
async fn a_fragment_waiting_for_budget_gives_back_its_concurrency_slot() {
    // One slot. /outer takes it, and when its body ends /b (waiting since
    // the start) gets it before /a, which /outer includes. /b fills the
    // budget and must give the slot back for /a, ahead of it, to run.
    let fake = Fake::new([
        (
            "/outer",
            Frag {
                chunks: vec![
                    (Duration::ZERO, "<"),
                    (50 * MS, "<esi:include src=\"/a\"/>>"),
                ],
                ..esi_frag(0, "")
            },
        ),
        ("/a", frag(100, "A")),
        ("/b", big(0, 3, 10, b'b', 10)),
    ]);
    let markup = "<esi:include src=\"/outer\"/><esi:include src=\"/b\"/>";
    let (text, _) = run_budgeted(markup, &fake, tight(4, 1)).await;
    assert_eq!(text, format!("<A>{}", "b".repeat(30)));
    assert!(fake.omitted().is_empty(), "{:?}", fake.omitted());
}

#[tokio::test(start_paused = true)]
async fn waiting_for_budget_does_not_count_against_the_include_timeout() {
    // The front of the page takes 1.6 s (two 800 ms includes, one after
    // the other); /big waits for budget from 200 ms until then, longer
    // than its 1 s include timeout.
    let fake = Fake::new([
        (
            "/outer",
            Frag {
                chunks: vec![
                    (Duration::ZERO, "<esi:include src=\"/s1\"/>"),
                    (800 * MS, "<esi:include src=\"/s2\"/>"),
                ],
                ..esi_frag(0, "")
            },
        ),
        ("/s1", frag(800, "1")),
        ("/s2", frag(800, "2")),
        // The third chunk comes 200 ms after the wait, past the 1 s.
        ("/big", big(0, 3, 10, b'x', 200)),
    ]);
    let markup = "<esi:include src=\"/outer\"/><esi:include src=\"/big\"/>";
    let limits = EsiLimits {
        include_timeout: Duration::from_secs(1),
        ..tight(4, 16)
    };
    let (text, _) = run_budgeted(markup, &fake, limits).await;
    assert_eq!(text, format!("12{}", "x".repeat(30)));
    assert!(fake.omitted().is_empty(), "{:?}", fake.omitted());
}

#[tokio::test(start_paused = true)]
async fn an_attempt_larger_than_the_budget_falls_back_to_except() {
    let fake = Fake::new([
        ("/slow", frag(100, "S")),
        ("/big", big(0, 3, 10, b'x', 10)),
        ("/small", frag(0, "ok")),
    ]);
    let markup = "<esi:include src=\"/slow\"/>\
        <esi:try><esi:attempt><esi:include src=\"/big\"/></esi:attempt>\
        <esi:except>E</esi:except></esi:try>\
        <esi:try><esi:attempt>[<esi:include src=\"/small\"/>]</esi:attempt>\
        <esi:except>F</esi:except></esi:try>";
    let (text, _) = run_budgeted(markup, &fake, tight(16, 1)).await;
    assert_eq!(text, "SE[ok]");
}

/// Serves `/big`: `chunks` chunks of 64 KiB, counting the chunks pulled.
struct Counting {
    chunks: usize,
    pulled: Arc<AtomicUsize>,
}

impl FragmentFetcher for Counting {
    fn fetch(&self, _src: &str) -> Fetch {
        let pulled = Arc::clone(&self.pulled);
        let body = stream::iter(0..self.chunks).map(move |_| {
            pulled.fetch_add(1, Ordering::Relaxed);
            Ok::<_, BoxError>(Bytes::from(vec![b'x'; 64 * 1024]))
        });
        Fetch::Pending(Box::pin(std::future::ready(Ok(Fragment {
            status: 200,
            body: body.boxed(),
            esi: false,
        }))))
    }
}

#[tokio::test(start_paused = true)]
async fn the_front_of_the_page_waits_for_a_slow_client() {
    const MIB: usize = 1024 * 1024;
    let pulled = Arc::new(AtomicUsize::new(0));
    let fetcher: Arc<dyn FragmentFetcher> = Arc::new(Counting {
        chunks: 640,
        pulled: Arc::clone(&pulled),
    });
    let mut out = assemble(
        page(vec![(0, "<esi:include src=\"/big\"/>")]),
        Arc::new(EsiVars::new()),
        fetcher,
        tight(MIB, 16),
    );
    let first = out.next().await.expect("a chunk").expect("ok");
    // The client stops reading for a while.
    sleep(Duration::from_secs(10)).await;
    let held = pulled.load(Ordering::Relaxed) * 64 * 1024 - first.len();
    // The budget and one chunk in flight, and the page output's chunks.
    assert!(
        held <= MIB + (1 + OUTPUT_BUFFER) * 64 * 1024,
        "{held} bytes read ahead of a client that does not read"
    );
    let mut len = first.len();
    while let Some(b) = out.next().await {
        len += b.expect("ok").len();
    }
    assert_eq!(
        len,
        640 * 64 * 1024,
        "the whole fragment once the client reads"
    );
}

/// Serves `/slow` (after 1 s) and `/frag`: ESI, an include of `/slow` and
/// then `chunks` chunks of 64 KiB of text, counting the chunks pulled.
struct FragAhead {
    chunks: usize,
    pulled: Arc<AtomicUsize>,
}

impl FragmentFetcher for FragAhead {
    fn fetch(&self, src: &str) -> Fetch {
        if src == "/slow" {
            return Fetch::Pending(Box::pin(async {
                sleep(Duration::from_secs(1)).await;
                Ok(Fragment {
                    status: 200,
                    body: stream::iter([Ok(Bytes::from_static(b"S"))]).boxed(),
                    esi: false,
                })
            }));
        }
        let pulled = Arc::clone(&self.pulled);
        let text = stream::iter(0..self.chunks).map(move |_| {
            pulled.fetch_add(1, Ordering::Relaxed);
            Ok::<_, BoxError>(Bytes::from(vec![b'x'; 64 * 1024]))
        });
        let body = stream::iter([Ok(Bytes::from_static(b"<esi:include src=\"/slow\"/>"))])
            .chain(text)
            .boxed();
        Fetch::Pending(Box::pin(std::future::ready(Ok(Fragment {
            status: 200,
            body,
            esi: true,
        }))))
    }
}

#[tokio::test(start_paused = true)]
async fn fragment_text_behind_a_pending_include_is_bounded() {
    const MIB: usize = 1024 * 1024;
    // One concurrency slot: /frag must give it back while it stops
    // reading, or /slow (which it includes) never runs.
    for concurrency in [1, 16] {
        let pulled = Arc::new(AtomicUsize::new(0));
        let fetcher: Arc<dyn FragmentFetcher> = Arc::new(FragAhead {
            chunks: 160,
            pulled: Arc::clone(&pulled),
        });
        let (mut out, budget) = start_page(
            PageInput::Stream(page(vec![(0, "<esi:include src=\"/frag\"/>")])),
            Arc::new(EsiVars::new()),
            fetcher,
            tight(MIB, concurrency),
        );
        let collect = async {
            let mut first = None;
            let mut len = 0;
            while let Some(b) = out.next().await {
                let b = b.expect("ok");
                if first.is_none() {
                    // While /slow is pending, /frag's text is read up to the budget.
                    first = Some(pulled.load(Ordering::Relaxed));
                }
                len += b.len();
            }
            (first, len)
        };
        let (first, len) = tokio::time::timeout(Duration::from_secs(30), collect)
            .await
            .expect("the page hangs");
        assert_eq!(len, 1 + 160 * 64 * 1024, "max_concurrency {concurrency}");
        let early = first.expect("output");
        assert!(
            early * 64 * 1024 <= 2 * MIB,
            "{early} chunks read behind /slow (max_concurrency {concurrency})"
        );
        let peak = budget.peak.load(Ordering::Relaxed);
        assert!(peak <= 2 * MIB + 64 * 1024, "peak {peak}");
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_behind_a_slow_include_share_the_budget() {
    const KIB: usize = 1024;
    // Eight try blocks, each within the 1 MiB budget (768 KiB), together
    // six times it, ready long before their turn.
    let srcs = ["/t0", "/t1", "/t2", "/t3", "/t4", "/t5", "/t6", "/t7"];
    let mut frags = vec![("/slow", frag(1000, "S"))];
    for (i, src) in srcs.iter().enumerate() {
        frags.push((*src, big(0, 3, 256 * KIB, b'a' + i as u8, 0)));
    }
    let fake = Fake::new(frags);
    let block = |src: &str| {
        format!(
            "<esi:try><esi:attempt><esi:include src=\"{src}\"/></esi:attempt>\
             <esi:except>E</esi:except></esi:try>"
        )
    };
    let mut markup = String::from("<esi:include src=\"/slow\"/>");
    for src in srcs {
        markup.push_str(&block(src));
    }
    let markup: &'static str = Box::leak(markup.into_boxed_str());
    let (text, peak) = run_budgeted(markup, &fake, tight(1024 * KIB, 16)).await;
    let mut want = String::from("S");
    for i in 0..8u8 {
        want.push_str(&String::from_utf8(vec![b'a' + i; 768 * KIB]).expect("ascii"));
    }
    assert!(text == want, "every attempt succeeded, in order");
    // The budget and a chunk behind the front, and the attempt at the front.
    assert!(peak <= 2 * (1024 + 256) * KIB, "held {peak} bytes");
}

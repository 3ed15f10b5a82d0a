//! A `wasi:http/service` 0.3 component: `handle` is an async function and
//! the body a stream, written after the response is returned. Beside the
//! page, its fragment and `/hello`, the routes the tests use: `/count`
//! (how many requests this instance has served, this one included: an
//! instance reused across requests counts up), `/trap`, `/spin`, `/slow?ms=N` (a
//! timer, then `/count`'s answer) and `/fetch?url=U&after_ms=N` (an
//! outgoing GET, after a timer); `/big?kb=N` a page of N KiB, as the 0.2
//! example's (the benchmark's 16 KiB page).

wit_bindgen::generate!({
    path: "../wit-p3",
    world: "inlay:components-p3/service",
    generate_all,
});

use std::sync::atomic::{AtomicU64, Ordering};

use exports::wasi::http::handler::Guest;
use wasi::http::types::{ErrorCode, Fields, Request, Response, Scheme};

struct App;

export!(App);

/// Requests this instance has served.
static SERVED: AtomicU64 = AtomicU64::new(0);

/// The value of `name` in query `q`, percent-decoded.
fn param(q: &str, name: &str) -> Option<String> {
    let v = q.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?;
    let mut out = Vec::new();
    let mut bytes = v.bytes();
    while let Some(b) = bytes.next() {
        let hex = |b: Option<u8>| (b? as char).to_digit(16);
        match b {
            b'%' => out.push((hex(bytes.next()).unwrap_or(0) * 16 + hex(bytes.next()).unwrap_or(0)) as u8),
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// A page of about `kb` KiB (the same as the 0.2 example's).
fn big(kb: usize) -> String {
    let mut s = String::with_capacity(kb * 1024 + 64);
    s.push_str("<html><body>\n");
    let line = "<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do.</p>\n";
    while s.len() + line.len() + 16 <= kb * 1024 {
        s.push_str(line);
    }
    s.push_str("</body></html>\n");
    s
}

/// `GET url`: its status and body, or the error.
async fn fetch(url: &str) -> String {
    let Some(rest) = url.strip_prefix("http://") else {
        return "error: not an http:// URL".into();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (_, trailers) = wit_future::new(|| Ok(None));
    let (req, _sent) = Request::new(Fields::new(), None, trailers, None);
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some(authority));
    let _ = req.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
    match wasi::http::client::send(req).await {
        Ok(resp) => {
            let status = resp.get_status_code();
            let (_, done) = wit_future::new(|| Ok(()));
            let (body, _trailers) = Response::consume_body(resp, done);
            let body = body.collect().await;
            format!("{status} {}", String::from_utf8_lossy(&body))
        }
        Err(e) => format!("error: {e:?}"),
    }
}

impl Guest for App {
    async fn handle(request: Request) -> Result<Response, ErrorCode> {
        let served = SERVED.fetch_add(1, Ordering::Relaxed) + 1;
        let pq = request.get_path_with_query().unwrap_or_else(|| "/".into());
        let (path, query) = pq.split_once('?').unwrap_or((&pq, ""));
        let made: String;
        let (status, cc, body): (u16, &str, &[u8]) = match path {
            "/" => (200, "max-age=60", b"<html><body><h1>Rust 0.3 component</h1>\n<esi:include src=\"/fragment\"/>\n</body></html>\n"),
            "/fragment" => (200, "max-age=60", b"<p>fragment from a Rust 0.3 component</p>"),
            "/hello" => (200, "max-age=60", b"hello from a Rust 0.3 component\n"),
            "/big" => {
                let kb: usize = param(query, "kb").and_then(|v| v.parse().ok()).unwrap_or(16);
                made = big(kb.min(4096));
                (200, "max-age=60", made.as_bytes())
            }
            "/count" => {
                made = served.to_string();
                (200, "no-store", made.as_bytes())
            }
            "/slow" => {
                let ms: u64 = param(query, "ms").and_then(|v| v.parse().ok()).unwrap_or(100);
                wasi::clocks::monotonic_clock::wait_for(ms * 1_000_000).await;
                made = served.to_string();
                (200, "no-store", made.as_bytes())
            }
            "/fetch" => {
                if let Some(ms) = param(query, "after_ms").and_then(|v| v.parse::<u64>().ok()) {
                    wasi::clocks::monotonic_clock::wait_for(ms * 1_000_000).await;
                }
                made = fetch(&param(query, "url").unwrap_or_default()).await;
                (200, "no-store", made.as_bytes())
            }
            "/trap" => panic!("a trap on purpose"),
            "/spin" => loop {
                std::hint::black_box(SERVED.load(Ordering::Relaxed));
            },
            _ => (404, "no-store", b"not found\n"),
        };
        let mut fields: Vec<(String, Vec<u8>)> = vec![
            ("content-type".into(), b"text/html".to_vec()),
            ("cache-control".into(), cc.as_bytes().to_vec()),
        ];
        if pq == "/" {
            fields.push(("surrogate-control".into(), b"content=\"ESI/1.0\"".to_vec()));
        }
        let headers = Fields::from_list(&fields).map_err(|_| ErrorCode::InternalError(None))?;
        let (mut tx, rx) = wit_stream::new();
        let (trailers_tx, trailers_rx) = wit_future::new(|| Ok(None));
        let (response, _sent) = Response::new(headers, Some(rx), trailers_rx);
        let _ = response.set_status_code(status);
        let body = body.to_vec();
        wit_bindgen::spawn_local(async move {
            let _ = tx.write_all(body).await;
            drop(tx);
            let _ = trailers_tx.write(Ok(None)).await;
        });
        Ok(response)
    }
}

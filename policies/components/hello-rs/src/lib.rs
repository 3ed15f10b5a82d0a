//! A `wasi:http/proxy` 0.2 component, served by Inlay as a backend
//! (`inlay serve --component target/components/hello-rs.wasm`) or by
//! `wasmtime serve`, unchanged.
//!
//! Routes: `/` a page that includes `/fragment` with ESI; `/fragment`;
//! `/hello` a short text; `/big?kb=N` a page of N KiB; `/esi?n=N` a page of N
//! uncacheable fragments `/frag?i=K` (the benchmark's). The others are what
//! the host's tests need: `/env?name=X` (an environment variable),
//! `/fetch?url=U` (an outgoing request; answers its status or the error),
//! `/file?path=P` (reads a file of the read-only directory), `/trap` (panics), `/spin` (never ends),
//! `/grow` (allocates until refused), `/count` (how many requests this
//! instance has served).

use std::cell::Cell;
use std::io::Write as _;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingRequest, OutgoingResponse,
    ResponseOutparam, Scheme,
};

struct App;

wasip2::http::proxy::export!(App);

thread_local! {
    static SERVED: Cell<u32> = const { Cell::new(0) };
}

impl wasip2::exports::http::incoming_handler::Guest for App {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        SERVED.with(|n| n.set(n.get() + 1));
        let pq = request.path_with_query().unwrap_or_else(|| "/".into());
        let (path, query) = pq.split_once('?').unwrap_or((&pq, ""));
        match path {
            "/" => page(
                out,
                200,
                &[
                    ("content-type", "text/html; charset=utf-8"),
                    ("cache-control", "max-age=60"),
                    ("surrogate-control", "content=\"ESI/1.0\""),
                ],
                b"<html><body><h1>Rust component</h1>\n<esi:include src=\"/fragment\"/>\n</body></html>\n",
            ),
            "/fragment" => page(
                out,
                200,
                &[("content-type", "text/html"), ("cache-control", "max-age=60")],
                b"<p>fragment from a Rust component</p>",
            ),
            "/hello" => page(
                out,
                200,
                &[("content-type", "text/plain"), ("cache-control", "max-age=60")],
                b"hello from a Rust component\n",
            ),
            "/big" => {
                let kb: usize = param(query, "kb").and_then(|v| v.parse().ok()).unwrap_or(16);
                let body = big(kb.min(4096));
                page(out, 200, &[("content-type", "text/html")], body.as_bytes())
            }
            "/esi" => {
                // A page of N includes of uncacheable fragments (the
                // benchmark's ESI page): every page fetches them all.
                let n: usize = param(query, "n").and_then(|v| v.parse().ok()).unwrap_or(10);
                let mut body = String::from("<html><body>\n");
                for i in 0..n.min(100) {
                    body.push_str(&format!("<esi:include src=\"/frag?i={i}\"/>\n"));
                }
                body.push_str("</body></html>\n");
                page(
                    out,
                    200,
                    &[
                        ("content-type", "text/html"),
                        ("cache-control", "no-store"),
                        ("surrogate-control", "content=\"ESI/1.0\""),
                    ],
                    body.as_bytes(),
                )
            }
            "/frag" => {
                let i = param(query, "i").unwrap_or_default();
                let body = format!("<p>fragment {i}</p>");
                page(out, 200, &[("cache-control", "no-store")], body.as_bytes())
            }
            "/env" => {
                let name = param(query, "name").unwrap_or_default();
                let value = wasip2::cli::environment::get_environment()
                    .into_iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v);
                match value {
                    Some(v) => page(out, 200, &[("cache-control", "no-store")], v.as_bytes()),
                    None => page(out, 404, &[("cache-control", "no-store")], b"unset"),
                }
            }
            "/fetch" => {
                let url = param(query, "url").unwrap_or_default();
                let answer = fetch(&url);
                page(out, 200, &[("cache-control", "no-store")], answer.as_bytes())
            }
            "/file" => {
                let path = param(query, "path").unwrap_or_default();
                let answer = read_file(&path);
                page(out, 200, &[("cache-control", "no-store")], answer.as_bytes())
            }
            "/count" => {
                let n = SERVED.with(Cell::get);
                page(out, 200, &[("cache-control", "no-store")], n.to_string().as_bytes())
            }
            "/trap" => panic!("the /trap route panics"),
            "/spin" => spin(),
            "/grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            _ => page(out, 404, &[("content-type", "text/plain")], b"not found\n"),
        }
    }
}

/// Loops forever, unseen by the optimiser.
fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// A page of about `kb` KiB.
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

/// The value of `name` in a query string, percent-decoded.
fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The text of `path` under the first preopened directory, or the error
/// (with no directory configured there is none).
fn read_file(path: &str) -> String {
    use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
    let dirs = wasip2::filesystem::preopens::get_directories();
    let Some((dir, _)) = dirs.first() else {
        return "error: no directory".into();
    };
    let file = match dir.open_at(
        PathFlags::empty(),
        path.trim_start_matches('/'),
        OpenFlags::empty(),
        DescriptorFlags::READ,
    ) {
        Ok(f) => f,
        Err(e) => return format!("error: {e:?}"),
    };
    match file.read(1 << 20, 0) {
        Ok((bytes, _)) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("error: {e:?}"),
    }
}

/// GETs `url`; its status and body, or the error.
fn fetch(url: &str) -> String {
    let Some(rest) = url.strip_prefix("http://") else {
        return "error: only http:// URLs".into();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let req = OutgoingRequest::new(Fields::new());
    let _ = req.set_method(&Method::Get);
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some(authority));
    let _ = req.set_path_with_query(Some(path));
    let future = match outgoing_handler::handle(req, None) {
        Ok(f) => f,
        Err(e) => return format!("error: {e:?}"),
    };
    future.subscribe().block();
    let resp = match future.get() {
        Some(Ok(Ok(resp))) => resp,
        Some(Ok(Err(e))) => return format!("error: {e:?}"),
        _ => return "error: no response".into(),
    };
    let status = resp.status();
    let mut text = Vec::new();
    if let Ok(body) = resp.consume()
        && let Ok(stream) = body.stream()
    {
        while let Ok(chunk) = stream.blocking_read(64 * 1024) {
            text.extend_from_slice(&chunk);
        }
    }
    format!("{status} {}", String::from_utf8_lossy(&text))
}

/// Answers with `status`, `headers` and `body`.
fn page(out: ResponseOutparam, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    let fields = Fields::new();
    for (k, v) in headers {
        let _ = fields.append(k, v.as_bytes());
    }
    let resp = OutgoingResponse::new(fields);
    let _ = resp.set_status_code(status);
    let outgoing = resp.body().expect("the body is taken once");
    ResponseOutparam::set(out, Ok(resp));
    {
        let mut stream = outgoing.write().expect("the stream is taken once");
        // `Write` for wasi streams writes in chunks the host accepts.
        let _ = stream.write_all(body);
        let _ = stream.flush();
    }
    let _ = OutgoingBody::finish(outgoing, None);
}

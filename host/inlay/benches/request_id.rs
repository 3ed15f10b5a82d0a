//! What request ids and the Server-Timing switch add to every request,
//! hits included, with the default config (ids on, Server-Timing off).
//!
//! Run: `cargo bench -p inlay --bench request_id`
//!
//! `baseline` only clones a typical request's fields (every other case
//! does too); `minted` and `client_id` add the id for a request without
//! and with a sane `X-Request-Id`; `per_request` is all a request pays:
//! the id, the flag removal, the trailer check, the log's copy of the id
//! and the response field.

// `criterion_group!` generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Version, header};
use inlay::config::ServerConfig;
use inlay::request_id::RequestIds;
use inlay_core::server_timing;

fn server_config() -> ServerConfig {
    let mut server = inlay::config::Config::embedded_default().server;
    server.request_id_header = Some(header::HeaderName::from_static("x-request-id"));
    server.trust_request_id = true;
    server
}

fn request_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::HOST, HeaderValue::from_static("www.example.com"));
    h.insert(header::USER_AGENT, HeaderValue::from_static("curl/8.5.0"));
    h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("gzip, br"),
    );
    h
}

fn bench(c: &mut Criterion) {
    let ids = RequestIds::new(&server_config());
    let plain = request_headers();
    let mut with_id = request_headers();
    with_id.insert(
        "x-request-id",
        HeaderValue::from_static("lb-0123456789abcdef"),
    );
    let mut g = c.benchmark_group("request_id");
    g.bench_function("baseline", |b| b.iter(|| black_box(plain.clone())));
    g.bench_function("minted", |b| {
        b.iter(|| {
            let mut h = plain.clone();
            black_box(ids.assign(&mut h));
            h
        })
    });
    g.bench_function("client_id", |b| {
        b.iter(|| {
            let mut h = with_id.clone();
            black_box(ids.assign(&mut h));
            h
        })
    });
    g.bench_function("per_request", |b| {
        let mut resp = HeaderMap::new();
        b.iter(|| {
            let mut h = plain.clone();
            let id = ids.assign(&mut h);
            h.remove(server_timing::REQUEST_FLAG);
            black_box(server_timing::trailers_allowed(Version::HTTP_11, &h));
            let logged = id.as_ref().and_then(|v| v.to_str().ok()).map(str::to_owned);
            if let (Some(name), Some(id)) = (ids.header(), id) {
                resp.insert(name.clone(), id);
            }
            black_box(logged);
            h
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

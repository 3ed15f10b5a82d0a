//! ESI parser throughput.
//!
//! Run: `cargo bench -p inlay-esi --bench parse`
//!
//! Pages of 4 MiB fed in 64 KiB chunks (as they come off the network):
//! `plain` has no `<` at all (the memchr fast path), `html` is ordinary
//! markup with no ESI, `esi` is markup with an include every ~2 KiB.

// `criterion_group!` generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use inlay_esi::EsiParser;

const PAGE: usize = 4 << 20;
const CHUNK: usize = 64 << 10;

fn repeat_to(unit: &str, len: usize) -> Bytes {
    let mut s = String::with_capacity(len + unit.len());
    while s.len() < len {
        s.push_str(unit);
    }
    Bytes::from(s)
}

fn pages() -> Vec<(&'static str, Bytes)> {
    let plain = repeat_to(
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor \
         incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud. ",
        PAGE,
    );
    let html_unit = "<div class=\"product\"><a href=\"/p/123\"><img src=\"/i/123.jpg\" alt=\"x\"></a>\
        <h2>Product name</h2><p>Some description text &amp; details.</p><span>$ 12.50</span></div>\n";
    let html = repeat_to(html_unit, PAGE);
    let mut esi_unit = html_unit.repeat(8);
    esi_unit.push_str("<esi:include src=\"/fragments/price?id=123\" onerror=\"continue\"/>\n");
    let esi = repeat_to(&esi_unit, PAGE);
    vec![("plain", plain), ("html", html), ("esi", esi)]
}

fn parse_all(page: &Bytes) -> usize {
    let mut parser = EsiParser::new();
    let mut nodes = 0;
    let mut at = 0;
    while at < page.len() {
        let end = (at + CHUNK).min(page.len());
        nodes += parser.feed_bytes(page.slice(at..end)).len();
        at = end;
    }
    nodes + parser.finish().len()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("esi_parse");
    for (name, page) in pages() {
        g.throughput(Throughput::Bytes(page.len() as u64));
        g.bench_with_input(BenchmarkId::new("feed_64k", name), &page, |b, page| {
            b.iter(|| black_box(parse_all(black_box(page))));
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

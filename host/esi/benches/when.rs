//! `<esi:when test="... matches ...">` evaluation on a template parsed once,
//! as a cached template is evaluated on every request.
//!
//! Run: `cargo bench -p inlay-esi --bench when`
//!
//! `ua_literal` and `word_literal` have the pattern written in the template
//! (compiled on first use); `ua_variable` takes it from a variable with the
//! same value each time (compiled once), `ua_variable_changing` from one
//! whose value alternates (compiled every time, as a client-supplied pattern
//! would be); `nested_plus` is `(a+)+$` against 30 'a's and a 'b',
//! exponential for a backtracking matcher.

// `criterion_group!` generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use inlay_esi::{EsiVars, Node, parse};

const UA: &str = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 \
                  (KHTML, like Gecko) Chrome/124.0.0.0 Mobile Safari/537.36";

fn choose(test: &str) -> Node {
    let page = format!("<esi:choose><esi:when test=\"{test}\">yes</esi:when></esi:choose>");
    match parse(page.as_bytes()).pop() {
        Some(node @ Node::Choose(_)) => node,
        other => panic!("not a choose: {other:?}"),
    }
}

fn bench(c: &mut Criterion) {
    let mut vars = EsiVars::new();
    vars.set("UA", UA);
    vars.set("Q", "summer_sale2024");
    vars.set("RE", "(iphone|android).*mobile");
    vars.set("AB", format!("{}b", "a".repeat(30)));
    let cases = [
        (
            "ua_literal",
            "$(UA) matches_i '''(iphone|android).*mobile'''",
        ),
        ("word_literal", "$(Q) matches '''^\\w+$'''"),
        ("ua_variable", "$(UA) matches_i $(RE)"),
        ("nested_plus", "$(AB) matches '''(a+)+$'''"),
    ];
    let mut g = c.benchmark_group("esi_when");
    for (name, test) in cases {
        let Node::Choose(node) = choose(test) else {
            unreachable!()
        };
        g.bench_function(name, |b| {
            b.iter(|| black_box(node.select(black_box(&vars)).len()));
        });
    }
    let Node::Choose(node) = choose("$(UA) matches_i $(RE)") else {
        unreachable!()
    };
    let mut other = vars.clone();
    other.set("RE", "(iphone|android).*mobil");
    let pair = [vars, other];
    let mut turn = 0;
    g.bench_function("ua_variable_changing", |b| {
        b.iter(|| {
            turn ^= 1;
            black_box(node.select(black_box(&pair[turn])).len())
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

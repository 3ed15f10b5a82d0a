//! Fuzz `<esi:when>` tests. The input is a test, or `pattern\nsubject`:
//! parsing and evaluating the test (alone, and inside a choose, after
//! attribute decoding) must not panic, and a regular expression written in
//! a test must give what the same pattern taken from a variable gives.
#![no_main]

use inlay_esi::{EsiVars, Expr, Node, parse};
use libfuzzer_sys::fuzz_target;

fn vars(subject: &str, pattern: &str) -> EsiVars {
    let mut v = EsiVars::new();
    v.set("A", "abc");
    v.set("N", "10");
    v.set(
        "UA",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0) Mobile <b> 123 é",
    );
    v.set_entry("HTTP_COOKIE", "a", "1");
    v.set("S", subject);
    v.set("P", pattern);
    v
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, subject) = text.split_once('\n').unwrap_or((text, "aaa"));
    let vars = vars(subject, pattern);

    if let Ok(e) = Expr::parse(text) {
        let _ = e.eval(&vars);
    }
    let page = format!(
        "<esi:choose><esi:when test=\"{text}\">w</esi:when><esi:otherwise>o</esi:otherwise></esi:choose>"
    );
    for node in parse(page.as_bytes()) {
        if let Node::Choose(c) = node {
            c.select(&vars);
        }
    }

    // A quote could end the written literal early.
    if !pattern.contains('\'') {
        for op in ["matches", "matches_i"] {
            let written = Expr::parse(&format!("$(S) {op} '''{pattern}'''")).map(|e| e.eval(&vars));
            let from_var = Expr::parse(&format!("$(S) {op} $(P)")).map(|e| e.eval(&vars));
            assert_eq!(written, from_var, "{op} {pattern:?} on {subject:?}");
        }
    }
});

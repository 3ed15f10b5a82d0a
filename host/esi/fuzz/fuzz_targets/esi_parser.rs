//! Fuzz the ESI parser: arbitrary bytes, split at an arbitrary point, must
//! parse to the same nodes as the unsplit input, and evaluating the result
//! (when tests, regular expressions, templates) must not panic.
#![no_main]

use inlay_esi::{EsiParser, EsiVars, Node, coalesce, parse};
use libfuzzer_sys::fuzz_target;

fn evaluate(nodes: &[Node], vars: &EsiVars) {
    for node in nodes {
        match node {
            Node::Text(_) => {}
            Node::Vars(t) => {
                t.render(vars);
            }
            Node::Include(i) => {
                i.src.render_string(vars);
                if let Some(a) = &i.alt {
                    a.render_string(vars);
                }
            }
            Node::Choose(c) => {
                for w in &c.whens {
                    evaluate(&w.body, vars);
                }
                evaluate(&c.otherwise, vars);
                evaluate(c.select(vars), vars);
            }
            Node::Try(t) => {
                evaluate(&t.attempt, vars);
                evaluate(&t.except, vars);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // The first two bytes choose the split point.
    let Some((head, input)) = data.split_at_checked(2) else {
        return;
    };
    let split = usize::from(u16::from_le_bytes([head[0], head[1]])) % (input.len() + 1);
    let whole = coalesce(parse(input));

    let mut parser = EsiParser::new();
    let mut nodes = parser.feed(&input[..split]);
    nodes.extend(parser.feed(&input[split..]));
    nodes.extend(parser.finish());
    assert_eq!(
        coalesce(nodes),
        whole,
        "splitting at {split} changed the result"
    );

    let mut vars = EsiVars::new();
    vars.set("A", "abc");
    vars.set("N", "10");
    vars.set_entry("HTTP_COOKIE", "a", "1");
    evaluate(&whole, &vars);
});

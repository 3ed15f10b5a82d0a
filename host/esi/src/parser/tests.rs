use proptest::prelude::*;

use super::*;
use crate::vars::VarRef;

/// A compact, readable form of parsed nodes for assertions.
fn show(nodes: &[Node]) -> String {
    let mut s = String::new();
    for n in nodes {
        match n {
            Node::Text(b) => s.push_str(&String::from_utf8_lossy(b)),
            Node::Vars(t) => s.push_str(&show_template(t)),
            Node::Include(i) => {
                s.push_str(&format!("[include {}", show_template(&i.src)));
                if let Some(a) = &i.alt {
                    s.push_str(&format!(" alt={}", show_template(a)));
                }
                if i.onerror_continue {
                    s.push_str(" continue");
                }
                s.push(']');
            }
            Node::Choose(c) => {
                s.push_str("[choose");
                for w in &c.whens {
                    let test = match &w.test {
                        Ok(_) => w.test_text.clone(),
                        Err(_) => format!("BAD:{}", w.test_text),
                    };
                    s.push_str(&format!(" when({test}){{{}}}", show(&w.body)));
                }
                s.push_str(&format!(" otherwise{{{}}}]", show(&c.otherwise)));
            }
            Node::Try(t) => {
                s.push_str(&format!(
                    "[try {{{}}} except {{{}}}]",
                    show(&t.attempt),
                    show(&t.except)
                ));
            }
        }
    }
    s
}

fn show_template(t: &Template) -> String {
    let mut s = String::new();
    for p in &t.parts {
        match p {
            TemplatePart::Literal(b) => s.push_str(&String::from_utf8_lossy(b)),
            TemplatePart::Var(VarRef { name, key, default }) => {
                s.push('{');
                s.push_str(name);
                if let Some(k) = key {
                    s.push_str(&format!("[{k}]"));
                }
                if let Some(d) = default {
                    s.push_str(&format!("|{d}"));
                }
                s.push('}');
            }
        }
    }
    s
}

fn p(input: &str) -> String {
    show(&coalesce(parse(input.as_bytes())))
}

#[test]
fn plain_text_passes_through() {
    let html = "<!DOCTYPE html><html><head><title>x</title></head>\
                <body class='a'>&amp; <e> <esi <esix:y/> a<b $(X) --> </body></html>";
    assert_eq!(p(html), html);
    let nodes = parse(html.as_bytes());
    assert_eq!(nodes.len(), 1, "one text run, not split at each '<'");
}

#[test]
fn include_forms() {
    assert_eq!(p(r#"a<esi:include src="/x"/>b"#), "a[include /x]b");
    assert_eq!(p(r#"<esi:include src='/x' />"#), "[include /x]");
    assert_eq!(p(r#"<esi:include src=/x/>"#), "[include /x]");
    assert_eq!(
        p(r#"<esi:include src="/x" alt="/y" onerror="continue"/>"#),
        "[include /x alt=/y continue]"
    );
    assert_eq!(
        p(r#"<esi:include src="/x" onerror="abort"/>"#),
        "[include /x]"
    );
    // Non-self-closed form: the closing tag is ignored.
    assert_eq!(
        p(r#"<esi:include src="/x"></esi:include>z"#),
        "[include /x]z"
    );
    // Quoted `>` and `/>` inside attribute values do not end the tag.
    assert_eq!(p(r#"<esi:include src="/a>b/>c"/>"#), "[include /a>b/>c]");
    // Entities are decoded.
    assert_eq!(
        p(r#"<esi:include src="/q?a=1&amp;b=2&#x3C;&#62;"/>"#),
        "[include /q?a=1&b=2<>]"
    );
    // Variables in src and alt.
    assert_eq!(
        p(r#"<esi:include src="/u/$(HTTP_COOKIE{id})?h=$(HTTP_HOST)" alt="/$(X|d)"/>"#),
        "[include /u/{HTTP_COOKIE[id]}?h={HTTP_HOST} alt=/{X|d}]"
    );
    // Missing src: dropped.
    assert_eq!(p(r#"a<esi:include alt="/y"/>b"#), "ab");
    // Whitespace and newlines between attributes.
    assert_eq!(p("<esi:include\n\tsrc=\"/x\"\n/>"), "[include /x]");
}

#[test]
fn remove_and_comment() {
    assert_eq!(
        p(r#"a<esi:remove><a href="/x">x</a><esi:include src="/no"/></esi:remove>b"#),
        "ab"
    );
    assert_eq!(p("a<esi:remove>x</esi:remove  >b"), "ab");
    assert_eq!(p("a<esi:remove/>b"), "ab");
    assert_eq!(p(r#"a<esi:comment text="hello"/>b"#), "ab");
    assert_eq!(p("a<esi:remove>never closed <p>"), "a");
}

#[test]
fn esi_comment_wrapper() {
    assert_eq!(
        p(r#"a<!--esi <esi:include src="/x"/> -->b"#),
        "a [include /x] b"
    );
    assert_eq!(p("a<!--esi--->b"), "a-b");
    // An ordinary comment inside does not nest: the first --> ends it.
    assert_eq!(p("<!--esi x <!-- y --> z -->"), " x <!-- y  z -->");
    // `-->` inside a tag does not end the wrapper.
    assert_eq!(
        p(r#"<!--esi <esi:include src="a-->b"/> -->"#),
        " [include a-->b] "
    );
    // Unclosed at EOF: the content was emitted.
    assert_eq!(p("<!--esi abc -"), " abc -");
}

#[test]
fn html_comments_and_cdata_are_opaque() {
    let s = r#"<!-- <esi:include src="/x"/> --><![CDATA[ <esi:include src="/y"/> ]]>"#;
    assert_eq!(p(s), s);
    assert_eq!(
        p("<!-- never closed <esi:include src='/x'/>"),
        "<!-- never closed <esi:include src='/x'/>"
    );
    assert_eq!(
        p(r#"<!----><esi:include src="/x"/>"#),
        "<!---->[include /x]"
    );
}

#[test]
fn choose_when_otherwise() {
    let s = r#"<esi:choose>
        <esi:when test="$(HTTP_COOKIE{group})=='gold'">G<esi:include src="/gold"/></esi:when>
        <esi:when test="$(A) &amp; !$(B)">AB</esi:when>
        <esi:otherwise>O</esi:otherwise>
    </esi:choose>"#;
    assert_eq!(
        p(s),
        "[choose when($(HTTP_COOKIE{group})=='gold'){G[include /gold]} when($(A) & !$(B)){AB} otherwise{O}]"
    );
    // Bad test: kept, marked, false at evaluation.
    assert_eq!(
        p(r#"<esi:choose><esi:when test="==">x</esi:when></esi:choose>"#),
        "[choose when(BAD:==){x} otherwise{}]"
    );
    // Missing test attribute.
    assert_eq!(
        p(r#"<esi:choose><esi:when>x</esi:when></esi:choose>"#),
        "[choose when(BAD:){x} otherwise{}]"
    );
    // Nested choose inside a when.
    assert_eq!(
        p(
            r#"<esi:choose><esi:when test="1"><esi:choose><esi:otherwise>i</esi:otherwise></esi:choose></esi:when></esi:choose>"#
        ),
        "[choose when(1){[choose otherwise{i}]} otherwise{}]"
    );
    // First otherwise wins.
    assert_eq!(
        p(
            r#"<esi:choose><esi:otherwise>1</esi:otherwise><esi:otherwise>2</esi:otherwise></esi:choose>"#
        ),
        "[choose otherwise{1}]"
    );
}

#[test]
fn choose_selects_branch() {
    let nodes = parse(
        br#"<esi:choose><esi:when test="$(X)=='a'">A</esi:when><esi:when test="$(X)=='b'">B</esi:when><esi:otherwise>O</esi:otherwise></esi:choose>"#,
    );
    let [Node::Choose(c)] = nodes.as_slice() else {
        panic!("one choose expected: {nodes:?}")
    };
    let mut v = EsiVars::new();
    assert_eq!(show(c.select(&v)), "O");
    v.set("X", "b");
    assert_eq!(show(c.select(&v)), "B");
    v.set("X", "a");
    assert_eq!(show(c.selected_body(&v)), "A");
}

#[test]
fn a_when_whose_pattern_fails_is_false_and_the_next_branch_is_chosen() {
    let nodes = parse(
        br#"<esi:choose><esi:when test="$(UA) matches '''(a)\1'''">backref</esi:when><esi:when test="$(UA) matches '''[[]'''">class</esi:when><esi:when test="$(UA) matches_i '''(iphone|android).*mobile'''">M</esi:when><esi:otherwise>D</esi:otherwise></esi:choose>"#,
    );
    let [Node::Choose(c)] = nodes.as_slice() else {
        panic!("one choose expected: {nodes:?}")
    };
    let mut v = EsiVars::new();
    v.set("UA", "aa Android 14 Mobile");
    assert_eq!(show(c.select(&v)), "M");
    v.set("UA", "Windows NT; aa [");
    assert_eq!(show(c.select(&v)), "D", "the same parse, evaluated again");
}

#[test]
fn try_attempt_except() {
    assert_eq!(
        p(
            r#"<esi:try><esi:attempt>a<esi:include src="/x"/></esi:attempt><esi:except>e</esi:except></esi:try>"#
        ),
        "[try {a[include /x]} except {e}]"
    );
    assert_eq!(
        p("<esi:try><esi:except>e</esi:except></esi:try>"),
        "[try {} except {e}]"
    );
    assert_eq!(p("<esi:try>junk</esi:try>"), "[try {} except {}]");
}

#[test]
fn vars_blocks() {
    assert_eq!(
        p(
            r#"<esi:vars><a href="/$(HTTP_HOST)?c=$(HTTP_COOKIE{c}|'none')">$(X|d) $ $( $(bad</a></esi:vars>$(NOT)"#
        ),
        r#"<a href="/{HTTP_HOST}?c={HTTP_COOKIE[c]|none}">{X|d} $ $( $(bad</a>$(NOT)"#
    );
    let nodes = coalesce(parse(b"<esi:vars>x$(A)y</esi:vars>"));
    assert!(
        matches!(nodes.as_slice(), [Node::Vars(t)] if t.parts.len() == 3),
        "{nodes:?}"
    );
    // Includes inside vars; stray close ignored.
    assert_eq!(
        p(r#"</esi:vars><esi:vars>$(A)<esi:include src="/$(B)"/></esi:vars>"#),
        "{A}[include /{B}]"
    );
    // Not held back: text is emitted as it arrives.
    let mut parser = EsiParser::new();
    let first = parser.feed(b"<esi:vars>hello $(HTTP_HOST) wor");
    assert_eq!(show(&coalesce(first)), "hello {HTTP_HOST} wor");
    let rest = parser.feed(b"ld $(HTTP");
    assert_eq!(show(&rest), "ld ");
    assert_eq!(parser.pending_len(), 6);
    assert_eq!(show(&parser.finish()), "$(HTTP");
}

#[test]
fn malformed_markup() {
    // Unknown tags dropped, content kept.
    assert_eq!(p("a<esi:inline name='x'>b</esi:inline>c<esi:foo/>"), "abc");
    // Bad tag names.
    assert_eq!(p("a<esi:>b<esi:in&clude src='x'/>c"), "abc");
    // An unterminated quote runs to the end of input: the `<` is text.
    assert_eq!(
        p("a<esi:in\"clude src='x'/>c"),
        "a<esi:in\"clude src='x'/>c"
    );
    // Misplaced branch tags.
    assert_eq!(
        p("<esi:when test='1'>w</esi:when><esi:attempt>a</esi:attempt>"),
        "wa"
    );
    // Stray closing tags.
    assert_eq!(p("a</esi:choose></esi:try></esi:include>b"), "ab");
    // Content directly in choose/try is dropped.
    assert_eq!(
        p("<esi:choose>junk<esi:include src='/x'/><esi:otherwise>o</esi:otherwise></esi:choose>"),
        "[choose otherwise{o}]"
    );
    // Implicit close by an outer closing tag.
    assert_eq!(
        p("<esi:choose><esi:when test='1'>w</esi:choose>after"),
        "[choose when(1){w} otherwise{}]after"
    );
    // Unclosed at EOF: closed implicitly.
    assert_eq!(
        p("<esi:try><esi:attempt>a<esi:include src='/x'/>"),
        "[try {a[include /x]} except {}]"
    );
    // Unterminated tag at EOF: text.
    assert_eq!(p("a<esi:include src='/x'"), "a<esi:include src='/x'");
    assert_eq!(p("a<esi:include src='/x>"), "a<esi:include src='/x>");
    // Junk attributes.
    assert_eq!(
        p(r#"<esi:include = "q" src="/x" src="/y" 'z' onerror=continue/>"#),
        "[include /x continue]"
    );
    // Partial prefixes at EOF.
    for s in ["<", "<e", "<esi", "</esi", "<!-", "<!--e", "<![CDA", "a$"] {
        assert_eq!(p(s), s);
    }
}

#[test]
fn over_long_tag_passes_through() {
    let long = format!("<esi:include src=\"{}\"/>after", "x".repeat(MAX_TAG_LEN));
    assert_eq!(p(&long), long);
    // Just under the cap is still a tag.
    let ok = format!("<esi:include src=\"{}\"/>", "x".repeat(MAX_TAG_LEN - 40));
    assert!(p(&ok).starts_with("[include xxx"));
    // Streaming in small chunks holds back at most the cap.
    let mut parser = EsiParser::new();
    for c in long.as_bytes().chunks(1000) {
        parser.feed(c);
        assert!(parser.pending_len() <= MAX_TAG_LEN);
    }
}

#[test]
fn nesting_is_capped() {
    let depth = MAX_BLOCK_NESTING + 10;
    let mut s = String::new();
    for _ in 0..depth {
        s.push_str("<esi:try><esi:attempt>");
    }
    s.push('x');
    for _ in 0..depth {
        s.push_str("</esi:attempt></esi:try>");
    }
    let nodes = parse(s.as_bytes());
    fn depth_of(nodes: &[Node]) -> usize {
        nodes
            .iter()
            .map(|n| match n {
                Node::Try(t) => 1 + depth_of(&t.attempt),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }
    // Each try uses two frames (try + attempt).
    assert_eq!(depth_of(&nodes), MAX_BLOCK_NESTING / 2);
    assert!(show(&nodes).contains('x'));
}

#[test]
fn an_unclosed_block_is_closed_when_it_holds_too_much() {
    // An attempt that never closes, followed by more text than the limit:
    // the block is closed at exactly MAX_BLOCK_BYTES of content and the rest
    // is ordinary content, emitted as it streams.
    let body = "a".repeat(MAX_BLOCK_BYTES + 10);
    let input = format!("<esi:try><esi:attempt>{body}</esi:attempt></esi:try>tail");
    let whole = coalesce(parse(input.as_bytes()));
    let Node::Try(t) = &whole[0] else {
        panic!("{:?}", &whole[..1])
    };
    let inside: usize = t
        .attempt
        .iter()
        .map(|n| match n {
            Node::Text(b) => b.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(
        inside,
        MAX_BLOCK_BYTES - 2 * 64,
        "two block tags count 64 each"
    );
    let Node::Text(rest) = &whole[1] else {
        panic!("{:?}", &whole[1..])
    };
    assert_eq!(
        rest.len(),
        body.len() - inside + "tail".len(),
        "the closing tags are dropped"
    );
    assert_eq!(whole.len(), 2);
    // The same wherever the input is split.
    let cuts: Vec<usize> = (1..40).map(|i| i * 27_001).collect();
    assert_eq!(split_parse(input.as_bytes(), &cuts), whole);

    // The parser does not hold it: streamed, the text past the limit comes
    // out before the end of input.
    let mut parser = EsiParser::new();
    let mut early = parser.feed(b"<esi:choose><esi:when test=\"1\">");
    for _ in 0..(2 * MAX_BLOCK_BYTES / 4096) {
        early.extend(parser.feed(&[b'x'; 4096]));
    }
    assert!(
        early.iter().any(|n| matches!(n, Node::Choose(_))),
        "the choose was closed and emitted while streaming"
    );

    // Many empty branches count too.
    let many = "<esi:when test=\"1\"></esi:when>".repeat(2 * MAX_BLOCK_BYTES / 64);
    let nodes = parse(format!("<esi:choose>{many}").as_bytes());
    let Node::Choose(c) = &nodes[0] else {
        panic!("a choose first")
    };
    // The choose tag and each when count 64: the limit falls on the last when.
    assert_eq!(c.whens.len(), MAX_BLOCK_BYTES / 64);
}

#[test]
fn text_is_not_held_back() {
    let mut parser = EsiParser::new();
    // `<d` cannot start ESI markup: nothing is held back.
    let out = parser.feed(b"Hello world <di");
    assert_eq!(show(&out), "Hello world <di");
    assert_eq!(parser.pending_len(), 0);
    let out = parser.feed(b"v> more <es");
    assert_eq!(show(&out), "v> more ");
    assert_eq!(parser.pending_len(), 3);
    let out = parser.feed(br#"i:include src="/a"/> tail"#);
    assert_eq!(show(&out), "[include /a] tail");
    assert_eq!(parser.pending_len(), 0);
    // A block is emitted when it closes.
    assert!(parser.feed(b"<esi:try><esi:attempt>a").is_empty());
    assert!(parser.feed(b"</esi:attempt>").is_empty());
    assert_eq!(show(&parser.feed(b"</esi:try>z")), "[try {a} except {}]z");
}

#[test]
fn text_shares_the_chunk() {
    let chunk = Bytes::from_static(b"zero copy text");
    let mut parser = EsiParser::new();
    let out = parser.feed_bytes(chunk.clone());
    let [Node::Text(t)] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!(t.as_ptr(), chunk.as_ptr());
}

/// Pieces that exercise every state of the parser when concatenated.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "text ",
        "<",
        ">",
        "<div class=\"a\">",
        "</div>",
        "<e",
        "<esi:include src=\"/a\"/>",
        "<esi:include src='/b?x=$(QUERY_STRING{x})' alt=\"/c\" onerror=\"continue\"/>",
        "<esi:include src=\"/q>\">",
        "</esi:include>",
        "<esi:remove>",
        "</esi:remove>",
        "<esi:comment text=\"c\"/>",
        "<!--esi ",
        " -->",
        "-->",
        "--",
        "-",
        "<!-- ",
        "<![CDATA[",
        "]]>",
        "<esi:choose>",
        "<esi:when test=\"$(A)=='1' &amp; 2 > 1\">",
        "</esi:when>",
        "<esi:otherwise>",
        "</esi:otherwise>",
        "</esi:choose>",
        "<esi:try>",
        "<esi:attempt>",
        "</esi:attempt>",
        "<esi:except>",
        "</esi:except>",
        "</esi:try>",
        "<esi:vars>",
        "</esi:vars>",
        "$(HTTP_HOST)",
        "$(HTTP_COOKIE{a}|'d')",
        "$(",
        "$",
        "\"",
        "'",
        "<esi:unknown a=b>",
        "</esi:",
        "\u{e9}\u{4e2d}",
    ])
}

fn split_parse(input: &[u8], cuts: &[usize]) -> Vec<Node> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.sort_unstable();
    let mut parser = EsiParser::new();
    let mut nodes = Vec::new();
    let mut at = 0;
    for c in cuts {
        nodes.extend(parser.feed(&input[at..c]));
        at = c;
    }
    nodes.extend(parser.feed(&input[at..]));
    nodes.extend(parser.finish());
    coalesce(nodes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_split_gives_the_same_nodes(
        pieces in prop::collection::vec(piece(), 0..40),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let input = pieces.concat();
        let whole = coalesce(parse(input.as_bytes()));
        prop_assert_eq!(split_parse(input.as_bytes(), &cuts), whole);
    }

    #[test]
    fn byte_at_a_time_gives_the_same_nodes(pieces in prop::collection::vec(piece(), 0..25)) {
        let input = pieces.concat();
        let whole = coalesce(parse(input.as_bytes()));
        let cuts: Vec<usize> = (0..input.len()).collect();
        prop_assert_eq!(split_parse(input.as_bytes(), &cuts), whole);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_split_freely(
        input in prop::collection::vec(any::<u8>(), 0..400),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let whole = coalesce(parse(&input));
        prop_assert_eq!(split_parse(&input, &cuts), whole);
    }

    #[test]
    fn markup_without_esi_is_unchanged(
        pieces in prop::collection::vec(prop::sample::select(vec![
            "text", "<", ">", "<div>", "<!-- c -->", "-->", "$(A)", "<e", "<es", "<esx", "</e>", "<![CDATA[x]]>", "&amp;",
        ]), 0..40),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let input = pieces.concat();
        let nodes = split_parse(input.as_bytes(), &cuts);
        prop_assert_eq!(show(&nodes), input);
    }
}

//! The ban expression language (Varnish's ban syntax): conditions on the
//! request's URL and host and on the stored response, joined by `&&`.
//!
//! ```text
//! expression := condition ( "&&" condition )*
//! condition  := field operator argument
//! field      := req.url | req.http.host | obj.status | obj.http.<name>
//! operator   := == | != | ~ | !~          (~ is a regex match)
//! argument   := "quoted, \" escapes a quote" | unquoted-without-spaces
//! ```
//!
//! Tokens are separated by spaces. `req.url` is the path and query, as
//! the cache key holds it; `req.http.host` the Host, lower-cased (`==` and
//! `!=` compare it without case). Only these two request fields are
//! allowed: they are part of every object's key, so the background walk
//! (the lurker) can test any ban without the request. `obj.http.<name>`
//! matches when any of the stored fields of that name does (`!=` and `!~`
//! when none does; an absent field is `!=` to anything).

use inlay_storage::ObjectMeta;
use regex_automata::meta::{self, Regex};
use regex_automata::util::syntax;
use regex_automata::{Input, MatchKind};

use super::BanError;

/// Longest ban expression accepted, in bytes.
pub const MAX_BAN_EXPRESSION_LEN: usize = 4 * 1024;
/// Most conditions in one ban.
pub const MAX_BAN_CONDITIONS: usize = 16;
/// Most heap one compiled regex's NFA may take (`regex`'s `size_limit`;
/// the matchers built from it take about as much again, all counted in
/// [`BanExpression::memory`]).
const MAX_REGEX_SIZE: usize = 64 * 1024;
/// Lazy DFA cache per regex and thread (`regex`'s `dfa_size_limit`).
const MAX_DFA_CACHE: usize = 64 * 1024;

/// What a condition looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Url,
    Host,
    Status,
    /// A stored response field, by lower-case name.
    ObjHeader(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Match,
    NoMatch,
}

impl Op {
    fn negated(self) -> bool {
        matches!(self, Op::Ne | Op::NoMatch)
    }
}

#[derive(Debug, Clone)]
struct Condition {
    field: Field,
    op: Op,
    value: Vec<u8>,
    regex: Option<Regex>,
}

impl Condition {
    /// Whether `subject` satisfies the positive form (`==` or `~`).
    fn positive(&self, subject: &[u8]) -> bool {
        match &self.regex {
            Some(re) => re.is_match(Input::new(subject).earliest(true)),
            None => subject == self.value.as_slice(),
        }
    }

    /// The heap this condition holds, in bytes (see [`BanExpression::memory`]).
    fn memory(&self) -> usize {
        let field = match &self.field {
            Field::ObjHeader(name) => name.capacity(),
            _ => 0,
        };
        let regex = self.regex.as_ref().map_or(0, regex_memory);
        std::mem::size_of::<Self>() + field + self.value.capacity() + regex
    }

    fn holds(&self, s: &BanSubject<'_>) -> bool {
        let single = |v: Option<&str>| match v {
            // Unknown (a key too long to hold it): assume it matches, so a
            // ban never leaves an object it might cover.
            None => true,
            Some(v) => self.positive(v.as_bytes()) != self.op.negated(),
        };
        match &self.field {
            Field::Url => single(s.url),
            Field::Host => single(s.host),
            Field::Status => {
                self.positive(s.meta.status.to_string().as_bytes()) != self.op.negated()
            }
            Field::ObjHeader(name) => {
                let any = s
                    .meta
                    .headers
                    .iter()
                    .any(|(n, v)| n == name && self.positive(v));
                any != self.op.negated()
            }
        }
    }
}

/// What a ban is tested against: the request's URL and host as the cache
/// key holds them (`None` when unknown) and the stored metadata.
#[derive(Debug, Clone, Copy)]
pub struct BanSubject<'a> {
    /// Path and query.
    pub url: Option<&'a str>,
    /// Host, lower-case.
    pub host: Option<&'a str>,
    /// The stored object's metadata.
    pub meta: &'a ObjectMeta,
}

/// A parsed ban expression.
#[derive(Debug, Clone)]
pub struct BanExpression {
    text: String,
    conditions: Vec<Condition>,
    /// [`BanExpression::memory`], counted once at parse.
    memory: usize,
}

/// One token and where it starts.
struct Token {
    pos: usize,
    text: String,
    quoted: bool,
}

fn syntax(pos: usize, msg: impl Into<String>) -> BanError {
    BanError::Syntax {
        pos,
        msg: msg.into(),
    }
}

fn tokens(s: &str) -> Result<Vec<Token>, BanError> {
    let mut out = Vec::new();
    let mut it = s.char_indices().peekable();
    while let Some(&(pos, c)) = it.peek() {
        if c.is_whitespace() {
            it.next();
            continue;
        }
        let mut text = String::new();
        if c == '"' {
            it.next();
            let mut closed = false;
            while let Some((_, c)) = it.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' if it.peek().is_some_and(|&(_, n)| n == '"') => {
                        text.push('"');
                        it.next();
                    }
                    c => text.push(c),
                }
            }
            if !closed {
                return Err(syntax(pos, "unterminated quoted argument"));
            }
            out.push(Token {
                pos,
                text,
                quoted: true,
            });
        } else {
            while let Some(&(_, c)) = it.peek() {
                if c.is_whitespace() {
                    break;
                }
                text.push(c);
                it.next();
            }
            out.push(Token {
                pos,
                text,
                quoted: false,
            });
        }
    }
    Ok(out)
}

fn field(t: &Token) -> Result<Field, BanError> {
    let expected = "expected a field: req.url, req.http.host, obj.status or obj.http.<name>";
    if t.quoted {
        return Err(syntax(t.pos, expected));
    }
    let lower = t.text.to_ascii_lowercase();
    match lower.as_str() {
        "req.url" => return Ok(Field::Url),
        "req.http.host" => return Ok(Field::Host),
        "obj.status" => return Ok(Field::Status),
        _ => {}
    }
    if let Some(name) = lower.strip_prefix("obj.http.") {
        if name.is_empty() || http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(syntax(t.pos, format!("`{}` is not a header name", t.text)));
        }
        return Ok(Field::ObjHeader(name.to_owned()));
    }
    if lower.starts_with("req.http.") {
        return Err(syntax(
            t.pos,
            "only req.http.host can be banned on among request fields (the others are not \
             part of the cache key, so stored objects cannot be tested against them)",
        ));
    }
    Err(syntax(
        t.pos,
        format!("unknown field `{}`; {expected}", t.text),
    ))
}

fn operator(t: Option<&Token>, end: usize) -> Result<Op, BanError> {
    let expected = "expected an operator: ==, !=, ~ or !~";
    let Some(t) = t else {
        return Err(syntax(end, expected));
    };
    let op = match (t.quoted, t.text.as_str()) {
        (false, "==") => Op::Eq,
        (false, "!=") => Op::Ne,
        (false, "~") => Op::Match,
        (false, "!~") => Op::NoMatch,
        _ => return Err(syntax(t.pos, format!("{expected}, found `{}`", t.text))),
    };
    Ok(op)
}

/// A regex as `regex::bytes::Regex` builds it (the same engine, the same
/// syntax and match semantics: bytes, Unicode classes, leftmost-first),
/// built here with `regex-automata` for its `memory_usage`.
fn regex(pattern: &str, pos: usize) -> Result<Regex, BanError> {
    let config = meta::Config::new()
        .match_kind(MatchKind::LeftmostFirst)
        .utf8_empty(false)
        .nfa_size_limit(Some(MAX_REGEX_SIZE))
        .hybrid_cache_capacity(MAX_DFA_CACHE);
    meta::Builder::new()
        .configure(config)
        .syntax(syntax::Config::new().utf8(false))
        .build(pattern)
        .map_err(|e| {
            let why = match (e.size_limit(), e.syntax_error()) {
                (Some(_), _) => format!(
                    "the regex compiles to more than {} KiB; make it simpler",
                    MAX_REGEX_SIZE / 1024
                ),
                (None, Some(e)) => format!("bad regex: {e}"),
                (None, None) => format!("bad regex: {e}"),
            };
            syntax(pos, why)
        })
}

/// The heap a compiled regex holds: its matchers as `regex-automata`
/// counts them (the NFAs, the one-pass DFA, the prefilter), plus one
/// search cache as it is made (its first search makes it; the lazy DFA's
/// part then grows with the states it meets, to at most
/// [`MAX_DFA_CACHE`] per thread searching). Measured for the issue's
/// `[a-z0-9_]{737}I`: 72 KiB of matchers and a 24 KiB cache, against 88
/// KiB of resident memory per regex compiled.
fn regex_memory(re: &Regex) -> usize {
    re.memory_usage() + re.create_cache().memory_usage()
}

impl BanExpression {
    /// Parses an expression such as
    /// `req.url ~ ^/products/ && obj.http.content-type ~ json`. Errors give
    /// the byte position of the offending token.
    pub fn parse(text: &str) -> Result<BanExpression, BanError> {
        if text.len() > MAX_BAN_EXPRESSION_LEN {
            return Err(BanError::TooLong {
                len: text.len(),
                limit: MAX_BAN_EXPRESSION_LEN,
            });
        }
        let toks = tokens(text)?;
        if toks.is_empty() {
            return Err(BanError::Empty);
        }
        let mut conditions = Vec::new();
        let mut i = 0;
        loop {
            if conditions.len() == MAX_BAN_CONDITIONS {
                return Err(syntax(
                    toks[i].pos,
                    format!("at most {MAX_BAN_CONDITIONS} conditions in one ban"),
                ));
            }
            let Some(f) = toks.get(i) else {
                return Err(syntax(text.len(), "expected a condition after &&"));
            };
            let field = field(f)?;
            let op = operator(toks.get(i + 1), text.len())?;
            let Some(arg) = toks.get(i + 2) else {
                return Err(syntax(
                    text.len(),
                    "expected an argument after the operator",
                ));
            };
            let mut value = arg.text.clone();
            let regex = match op {
                Op::Match | Op::NoMatch => Some(regex(&value, arg.pos)?),
                Op::Eq | Op::Ne => {
                    match &field {
                        Field::Status => {
                            let n: u16 = value.parse().map_err(|_| {
                                syntax(arg.pos, format!("`{value}` is not a status code"))
                            })?;
                            value = n.to_string();
                        }
                        Field::Host => value.make_ascii_lowercase(),
                        Field::Url | Field::ObjHeader(_) => {}
                    }
                    None
                }
            };
            conditions.push(Condition {
                field,
                op,
                value: value.into_bytes(),
                regex,
            });
            i += 3;
            match toks.get(i) {
                None => break,
                Some(t) if !t.quoted && t.text == "&&" => i += 1,
                Some(t) => {
                    return Err(syntax(
                        t.pos,
                        format!("expected && or the end, found `{}`", t.text),
                    ));
                }
            }
        }
        Ok(BanExpression::new(text.to_owned(), conditions))
    }

    fn new(text: String, conditions: Vec<Condition>) -> BanExpression {
        let memory = std::mem::size_of::<BanExpression>()
            + text.capacity()
            + conditions.iter().map(Condition::memory).sum::<usize>();
        BanExpression {
            text,
            conditions,
            memory,
        }
    }

    /// An expression that bans everything older than it (stands in for a
    /// persisted ban that can no longer be read).
    pub(crate) fn everything() -> BanExpression {
        BanExpression::new(
            "<everything: a persisted ban could not be read>".into(),
            Vec::new(),
        )
    }

    /// The heap this expression holds, in bytes: its text, its conditions
    /// and their compiled regexes (the matchers `regex-automata` reports
    /// and one search cache). What the ban memory budget counts.
    pub fn memory(&self) -> usize {
        self.memory
    }

    /// The expression as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether every condition holds for `subject`.
    pub fn matches(&self, subject: &BanSubject<'_>) -> bool {
        self.conditions.iter().all(|c| c.holds(subject))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(status: u16, headers: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            ..ObjectMeta::default()
        }
    }

    fn matches(expr: &str, url: &str, host: &str, m: &ObjectMeta) -> bool {
        BanExpression::parse(expr)
            .expect(expr)
            .matches(&BanSubject {
                url: Some(url),
                host: Some(host),
                meta: m,
            })
    }

    #[test]
    fn the_issue_example_matches_json_products_only() {
        let e = "req.url ~ ^/products/ && obj.http.content-type ~ json";
        let json = meta(200, &[("content-type", "application/json")]);
        let html = meta(200, &[("content-type", "text/html")]);
        assert!(matches(e, "/products/1", "a.com", &json));
        assert!(!matches(e, "/products/1", "a.com", &html));
        assert!(!matches(e, "/about", "a.com", &json));
    }

    #[test]
    fn every_field_and_operator() {
        let m = meta(
            404,
            &[
                ("x-tag", "a"),
                ("x-tag", "b"),
                ("cache-control", "max-age=5"),
            ],
        );
        assert!(matches("req.url == /a?b=1", "/a?b=1", "h", &m));
        assert!(!matches("req.url == /a", "/a?b=1", "h", &m));
        assert!(matches("req.url != /a", "/a?b=1", "h", &m));
        assert!(matches("req.url !~ ^/z", "/a", "h", &m));
        assert!(matches(
            "req.http.host == Example.COM",
            "/",
            "example.com",
            &m
        ));
        assert!(matches(
            "req.http.host ~ \\.example\\.com$",
            "/",
            "www.example.com",
            &m
        ));
        assert!(matches("obj.status == 404", "/", "h", &m));
        assert!(!matches("obj.status != 404", "/", "h", &m));
        assert!(matches("obj.status ~ ^4", "/", "h", &m));
        // Any of the fields of a name matches; != only when none does.
        assert!(matches("obj.http.x-tag == b", "/", "h", &m));
        assert!(!matches("obj.http.x-tag != b", "/", "h", &m));
        assert!(matches("obj.http.X-Tag != c", "/", "h", &m));
        // An absent field equals nothing and differs from everything.
        assert!(!matches("obj.http.x-none == a", "/", "h", &m));
        assert!(matches("obj.http.x-none != a", "/", "h", &m));
        assert!(matches("obj.http.x-none !~ .", "/", "h", &m));
    }

    #[test]
    fn quoted_arguments_hold_spaces_and_escaped_quotes() {
        let m = meta(200, &[("x-title", "say \"hi\" now")]);
        assert!(matches(
            r#"obj.http.x-title == "say \"hi\" now""#,
            "/",
            "h",
            &m
        ));
        assert!(matches(r#"req.url ~ "^/a b""#, "/a b/c", "h", &m));
        // A quoted && is an argument, not a separator.
        assert!(matches(r#"req.url == "&&""#, "&&", "h", &m));
    }

    #[test]
    fn an_unknown_url_counts_as_matching() {
        let m = meta(200, &[]);
        let e = BanExpression::parse("req.url ~ ^/x && obj.status == 200").unwrap();
        assert!(e.matches(&BanSubject {
            url: None,
            host: None,
            meta: &m
        }));
        let e = BanExpression::parse("req.url ~ ^/x && obj.status == 500").unwrap();
        assert!(!e.matches(&BanSubject {
            url: None,
            host: None,
            meta: &m
        }));
    }

    fn err(expr: &str) -> BanError {
        BanExpression::parse(expr).expect_err(expr)
    }

    fn pos(expr: &str) -> usize {
        match err(expr) {
            BanError::Syntax { pos, .. } => pos,
            other => panic!("{expr}: {other}"),
        }
    }

    #[test]
    fn bad_expressions_are_refused_with_the_position() {
        assert_eq!(err(""), BanError::Empty);
        assert_eq!(err("   "), BanError::Empty);
        assert_eq!(pos("req.uri ~ x"), 0);
        assert_eq!(pos("req.url = x"), 8);
        assert_eq!(pos("req.url =="), 10);
        assert_eq!(pos("req.url"), 7);
        assert_eq!(pos("req.url == a b"), 13);
        assert_eq!(pos("req.url == a &&"), 15);
        assert_eq!(pos("req.url == a && obj.status == abc"), 30);
        assert_eq!(pos("req.url ~ (unclosed"), 10);
        assert_eq!(pos("req.url == \"open"), 11);
        assert_eq!(pos("req.http.cookie ~ x"), 0);
        assert_eq!(pos("obj.http. ~ x"), 0);
        assert_eq!(pos("\"req.url\" ~ x"), 0);
        let msg = err("req.http.cookie ~ x").to_string();
        assert!(msg.contains("req.http.host"), "{msg}");
    }

    #[test]
    fn limits_on_length_conditions_and_regex_size() {
        let long = format!("req.url == {}", "a".repeat(MAX_BAN_EXPRESSION_LEN));
        assert!(matches!(err(&long), BanError::TooLong { .. }));
        let many = vec!["obj.status == 200"; MAX_BAN_CONDITIONS + 1].join(" && ");
        assert!(err(&many).to_string().contains("at most"));
        let ok = vec!["obj.status == 200"; MAX_BAN_CONDITIONS].join(" && ");
        assert!(BanExpression::parse(&ok).is_ok());
        let huge = err(r"req.url ~ \w{1000}").to_string();
        assert!(huge.contains("KiB"), "{huge}");
    }
}

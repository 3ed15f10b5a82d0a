//! The ESI expression language of `<esi:when test="...">`.
//!
//! Grammar (loosest binding first):
//!
//! ```text
//! expr    := and ('|' and)*            // `||` is accepted too
//! and     := not ('&' not)*            // `&&` is accepted too
//! not     := '!' not | compare
//! compare := primary (op primary)?     // op: == != < > <= >= has has_i matches matches_i
//! primary := '(' expr ')' | 'string' | '''string''' | number | $(VAR{key}|default)
//! ```
//!
//! `!` binds looser than a comparison, so `!$(A) == 'x'` means
//! `!($(A) == 'x')`. Comparisons are numeric when both sides are numbers
//! (number literals, or variables whose value is a decimal number), else
//! byte-wise on the string forms. An unset variable is the empty string
//! (or its default). A bare operand is true unless it is empty, `false` or
//! the number 0. `has`/`has_i` test for a substring (`_i`: ASCII
//! case-insensitive).
//!
//! # Regular expressions
//!
//! `matches`/`matches_i` search the left side for the regular expression on
//! the right, with the [`regex`] crate (see [`crate::pattern`]): matching
//! takes time linear in the subject, so no pattern can make a test slow. A
//! pattern written in the template (`'''...'''` needs no escaping) is
//! compiled the first time the test is evaluated and kept with the parsed
//! template; one taken from a variable is compiled when its value differs
//! from the last evaluation's (so a value set once by a policy is compiled
//! once per template, and a client-supplied one at each request). A
//! pattern that does not compile, is longer than [`MAX_PATTERN_LEN`] bytes
//! or compiles to more than [`MAX_COMPILED_SIZE`] bytes, or a subject
//! longer than [`MAX_SUBJECT_LEN`] bytes, makes the test false with a
//! warning in the log; never a panic.
//!
//! The syntax is the `regex` crate's
//! (<https://docs.rs/regex/1/regex/#syntax>). Where it differs from the
//! hand-written backtracking engine of earlier versions:
//!
//! | pattern | now | before |
//! |---|---|---|
//! | `\d`, `\D` | ASCII digits (kept: rewritten to `[0-9]`; the crate's are Unicode) | the same |
//! | `\<`, `\>` | literal `<`, `>` (kept, as in Perl; the crate's are word boundaries) | the same |
//! | `\1` (back-references); `(?=` `(?!` `(?<=` `(?<!` (look-around) | error: a linear-time engine cannot match them | error |
//! | `\b` `\B` `\A` `\z`; `\pL` `\p{Greek}`; `\x41` `\u{e9}`; flags `(?i)` `(?m)` `(?s)` `(?x)`; named groups `(?P<n>...)` | supported | error |
//! | `a**`, `a*+`, `a{2}{3}` | a repeat of a repeat (`*+` is not possessive) | error |
//! | counts over 1000 (`a{1001}`) | up to the compiled-size limit | error |
//! | `[` inside a class | opens a nested or POSIX class (`[[:digit:]]`); `&&` `--` `~~` are set operations; write `\[` for a literal `[` | literal `[` |
//! | `\é` (escaping a non-ASCII character) | error | literal `é` |
//! | `matches_i` | Unicode simple case folding (`é` matches `É`) | ASCII case only |
//! | `\w` | Unicode word characters, combining marks and connector punctuation included | Unicode letters and digits, and `_` |
//! | long subjects | over [`MAX_SUBJECT_LEN`] bytes (8 KiB): false | over 8192 characters: false |
//! | cost | linear in the subject; the pattern bounded by [`MAX_COMPILED_SIZE`] | a step budget: a costly search gave up (false) |
//!
//! Unchanged: a search unless anchored; `^`/`$` are the start/end of the
//! subject; `.` matches anything but `\n`; `\s` is Unicode white space.

use std::borrow::Cow;

use super::pattern::{LastPattern, Pattern, PatternError};
#[cfg(doc)]
use super::pattern::{MAX_COMPILED_SIZE, MAX_PATTERN_LEN, MAX_SUBJECT_LEN};
use super::vars::{EsiVars, VarRef, VarScan, scan_var_ref};

/// Deepest nesting of parentheses and `!` accepted, so hostile input cannot
/// overflow the stack.
const MAX_NESTING: usize = 64;

/// Most `&` and `|` operators in one expression: a chain of them nests as
/// deep as it is long, and evaluation recurses that deep.
const MAX_OPERATORS: usize = 256;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `>`
    Gt,
    /// `<=`
    Le,
    /// `>=`
    Ge,
    /// `has`: the left side contains the right side.
    Has,
    /// `has_i`: as `has`, ASCII case-insensitive.
    HasI,
    /// `matches`: the left side contains a match of the regular expression on the right.
    Matches,
    /// `matches_i`: as `matches`, ASCII case-insensitive.
    MatchesI,
}

/// A parsed `test` expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `a | b`
    Or(Box<Expr>, Box<Expr>),
    /// `a & b`
    And(Box<Expr>, Box<Expr>),
    /// `!a`
    Not(Box<Expr>),
    /// `a op b`
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    /// A quoted string.
    Str(String),
    /// A number literal, with its text for string comparisons.
    Num(f64, String),
    /// A variable reference.
    Var(VarRef),
    /// A regular expression written in the template on the right of
    /// `matches`/`matches_i`: compiled on first evaluation, then kept.
    Pattern(Pattern),
    /// The right of `matches`/`matches_i` when it is computed (a variable):
    /// compiled when the computed text differs from the last evaluation's.
    PatternOf(Box<Expr>, LastPattern),
}

/// Why a `test` expression could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    /// A character that starts no token.
    #[error("unexpected character {0:?} at byte {1}")]
    UnexpectedChar(char, usize),
    /// A quoted string without its closing quote.
    #[error("unterminated string starting at byte {0}")]
    UnterminatedString(usize),
    /// `$` that does not start a valid `$(NAME...)` reference.
    #[error("malformed variable reference at byte {0}")]
    BadVariable(usize),
    /// A word that is not an operator.
    #[error("unknown word {0:?}")]
    UnknownWord(String),
    /// The tokens do not form an expression.
    #[error("unexpected {0} in expression")]
    Syntax(String),
    /// More than the allowed nesting of parentheses and `!`.
    #[error("expression nested deeper than {MAX_NESTING}")]
    TooDeep,
    /// More than the allowed number of `&` and `|` operators.
    #[error("more than {MAX_OPERATORS} & and | operators")]
    TooManyOperators,
    /// The expression is empty.
    #[error("empty expression")]
    Empty,
}

/// Why evaluating an expression failed (the test then counts as false).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// The right side of `matches` is not a regular expression we support,
    /// or is too costly, or the left side is too long to search.
    #[error("bad regular expression: {0}")]
    Regex(#[from] PatternError),
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    LParen,
    RParen,
    Not,
    And,
    Or,
    Op(CmpOp),
    Str(String),
    Num(f64, String),
    Var(VarRef),
}

fn describe(t: Option<&Token>) -> String {
    match t {
        None => "end of expression".to_owned(),
        Some(t) => format!("{t:?}"),
    }
}

fn tokenize(s: &str) -> Result<Vec<Token>, ExprError> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        match c {
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            b'(' => {
                out.push(Token::LParen);
                i += 1;
            }
            b')' => {
                out.push(Token::RParen);
                i += 1;
            }
            b'!' if next == Some(b'=') => {
                out.push(Token::Op(CmpOp::Ne));
                i += 2;
            }
            b'!' => {
                out.push(Token::Not);
                i += 1;
            }
            b'=' if next == Some(b'=') => {
                out.push(Token::Op(CmpOp::Eq));
                i += 2;
            }
            b'<' | b'>' => {
                let eq = next == Some(b'=');
                out.push(Token::Op(match (c, eq) {
                    (b'<', false) => CmpOp::Lt,
                    (b'<', true) => CmpOp::Le,
                    (_, false) => CmpOp::Gt,
                    (_, true) => CmpOp::Ge,
                }));
                i += if eq { 2 } else { 1 };
            }
            b'&' | b'|' => {
                out.push(if c == b'&' { Token::And } else { Token::Or });
                i += if next == Some(c) { 2 } else { 1 };
            }
            b'\'' => {
                let (text, len) =
                    string_literal(&s[i..]).ok_or(ExprError::UnterminatedString(i))?;
                out.push(Token::Str(text));
                i += len;
            }
            b'$' => match scan_var_ref(&b[i..]) {
                VarScan::Complete(len, v) => {
                    out.push(Token::Var(v));
                    i += len;
                }
                VarScan::Incomplete | VarScan::Invalid => return Err(ExprError::BadVariable(i)),
            },
            b'0'..=b'9' | b'-' | b'+' | b'.' => {
                let len = number_len(&b[i..]);
                if len == 0 {
                    return Err(ExprError::UnexpectedChar(c as char, i));
                }
                let text = &s[i..i + len];
                let n = text
                    .parse::<f64>()
                    .map_err(|_| ExprError::UnexpectedChar(c as char, i))?;
                out.push(Token::Num(n, text.to_owned()));
                i += len;
            }
            c if c.is_ascii_alphabetic() => {
                let len = b[i..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                    .count();
                let word = &s[i..i + len];
                let op = match word {
                    "has" => CmpOp::Has,
                    "has_i" => CmpOp::HasI,
                    "matches" => CmpOp::Matches,
                    "matches_i" => CmpOp::MatchesI,
                    _ => return Err(ExprError::UnknownWord(word.to_owned())),
                };
                out.push(Token::Op(op));
                i += len;
            }
            _ => {
                let ch = s[i..].chars().next().unwrap_or('?');
                return Err(ExprError::UnexpectedChar(ch, i));
            }
        }
    }
    Ok(out)
}

/// A `'...'` string (backslash escapes the next character) or a
/// `'''...'''` string (no escapes, for regular expressions). Returns the
/// text and the bytes consumed.
fn string_literal(s: &str) -> Option<(String, usize)> {
    if let Some(rest) = s.strip_prefix("'''") {
        let end = rest.find("'''")?;
        return Some((rest[..end].to_owned(), end + 6));
    }
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?.1),
            '\'' => return Some((out, i + 1)),
            c => out.push(c),
        }
    }
    None
}

/// Length of `[+-]?digits[.digits]` (or `.digits`) at the start of `b`.
fn number_len(b: &[u8]) -> usize {
    let mut i = usize::from(matches!(b.first(), Some(b'-' | b'+')));
    let int = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    i += int;
    let mut frac = 0;
    if b.get(i) == Some(&b'.') {
        frac = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if frac > 0 {
            i += 1 + frac;
        }
    }
    if int == 0 && frac == 0 { 0 } else { i }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
    operators: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn or(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.and()?;
        while self.peek() == Some(&Token::Or) {
            self.operator()?;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.not()?;
        while self.peek() == Some(&Token::And) {
            self.operator()?;
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    /// Consume a `&` or `|`, counting it against [`MAX_OPERATORS`].
    fn operator(&mut self) -> Result<(), ExprError> {
        self.operators += 1;
        if self.operators > MAX_OPERATORS {
            return Err(ExprError::TooManyOperators);
        }
        self.pos += 1;
        Ok(())
    }

    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ExprError>,
    ) -> Result<T, ExprError> {
        if self.depth >= MAX_NESTING {
            return Err(ExprError::TooDeep);
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn not(&mut self) -> Result<Expr, ExprError> {
        if self.peek() == Some(&Token::Not) {
            self.pos += 1;
            return self.nested(|p| Ok(Expr::Not(Box::new(p.not()?))));
        }
        self.compare()
    }

    fn compare(&mut self) -> Result<Expr, ExprError> {
        let left = self.primary()?;
        if let Some(Token::Op(op)) = self.peek() {
            let op = *op;
            self.pos += 1;
            let right = match (op, self.primary()?) {
                // Written in the template: compiled once, not per evaluation.
                (CmpOp::Matches | CmpOp::MatchesI, Expr::Str(s) | Expr::Num(_, s)) => {
                    Expr::Pattern(Pattern::new(&s, op == CmpOp::MatchesI))
                }
                (CmpOp::Matches | CmpOp::MatchesI, computed) => {
                    Expr::PatternOf(Box::new(computed), LastPattern::default())
                }
                (_, right) => right,
            };
            return Ok(Expr::Compare(op, Box::new(left), Box::new(right)));
        }
        Ok(left)
    }

    fn primary(&mut self) -> Result<Expr, ExprError> {
        match self.next() {
            Some(Token::LParen) => {
                let e = self.nested(Self::or)?;
                match self.next() {
                    Some(Token::RParen) => Ok(e),
                    t => Err(ExprError::Syntax(describe(t.as_ref()))),
                }
            }
            Some(Token::Str(s)) => Ok(Expr::Str(s)),
            Some(Token::Num(n, t)) => Ok(Expr::Num(n, t)),
            Some(Token::Var(v)) => Ok(Expr::Var(v)),
            t => Err(ExprError::Syntax(describe(t.as_ref()))),
        }
    }
}

/// A value during evaluation.
enum Value<'a> {
    Str(Cow<'a, str>),
    Num(f64, Cow<'a, str>),
    Bool(bool),
}

impl Value<'_> {
    fn truthy(&self) -> bool {
        match self {
            Value::Bool(b) => *b,
            Value::Num(n, _) => *n != 0.0,
            Value::Str(s) => !s.is_empty() && s != "false",
        }
    }

    fn text(&self) -> &str {
        match self {
            Value::Str(s) | Value::Num(_, s) => s,
            Value::Bool(true) => "true",
            Value::Bool(false) => "false",
        }
    }

    fn number(&self) -> Option<f64> {
        match self {
            Value::Num(n, _) => Some(*n),
            _ => None,
        }
    }
}

/// A variable's value is numeric when it is entirely a decimal number.
fn numeric_value(s: Cow<'_, str>) -> Value<'_> {
    let t = s.trim();
    if !t.is_empty()
        && number_len(t.as_bytes()) == t.len()
        && let Ok(n) = t.parse::<f64>()
    {
        return Value::Num(n, s);
    }
    Value::Str(s)
}

impl Expr {
    /// Parse a `test` attribute value (already entity-decoded).
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let tokens = tokenize(text)?;
        if tokens.is_empty() {
            return Err(ExprError::Empty);
        }
        let mut p = Parser {
            tokens,
            pos: 0,
            depth: 0,
            operators: 0,
        };
        let e = p.or()?;
        match p.peek() {
            None => Ok(e),
            t => Err(ExprError::Syntax(describe(t))),
        }
    }

    /// How many compiled patterns this test keeps with its template (one
    /// per `matches`/`matches_i`).
    pub(crate) fn pattern_count(&self) -> usize {
        match self {
            Expr::Or(a, b) | Expr::And(a, b) | Expr::Compare(_, a, b) => {
                a.pattern_count() + b.pattern_count()
            }
            Expr::Not(a) => a.pattern_count(),
            Expr::Pattern(_) => 1,
            Expr::PatternOf(e, _) => 1 + e.pattern_count(),
            Expr::Str(_) | Expr::Num(..) | Expr::Var(_) => 0,
        }
    }

    /// Evaluate as a condition.
    pub fn eval(&self, vars: &EsiVars) -> Result<bool, EvalError> {
        Ok(self.value(vars)?.truthy())
    }

    fn value<'a>(&'a self, vars: &'a EsiVars) -> Result<Value<'a>, EvalError> {
        Ok(match self {
            Expr::Or(a, b) => Value::Bool(a.eval(vars)? || b.eval(vars)?),
            Expr::And(a, b) => Value::Bool(a.eval(vars)? && b.eval(vars)?),
            Expr::Not(a) => Value::Bool(!a.eval(vars)?),
            Expr::Str(s) => Value::Str(Cow::Borrowed(s)),
            Expr::Num(n, t) => Value::Num(*n, Cow::Borrowed(t)),
            Expr::Var(v) => numeric_value(vars.resolve(v).unwrap_or(Cow::Borrowed(""))),
            Expr::Pattern(p) => Value::Str(Cow::Borrowed(p.source())),
            Expr::PatternOf(e, _) => e.value(vars)?,
            Expr::Compare(op, a, b) => {
                let a = a.value(vars)?;
                Value::Bool(match (op, &**b) {
                    (CmpOp::Matches | CmpOp::MatchesI, Expr::Pattern(p)) => p.is_match(a.text())?,
                    (CmpOp::Matches | CmpOp::MatchesI, Expr::PatternOf(e, last)) => {
                        let source = e.value(vars)?;
                        let pattern = last.get(source.text(), *op == CmpOp::MatchesI);
                        pattern.is_match(a.text())?
                    }
                    (op, b) => compare(*op, &a, &b.value(vars)?)?,
                })
            }
        })
    }
}

fn compare(op: CmpOp, a: &Value<'_>, b: &Value<'_>) -> Result<bool, EvalError> {
    use std::cmp::Ordering;
    let ord = || match (a.number(), b.number()) {
        (Some(x), Some(y)) => x.partial_cmp(&y),
        _ => Some(a.text().cmp(b.text())),
    };
    Ok(match op {
        CmpOp::Eq => ord() == Some(Ordering::Equal),
        CmpOp::Ne => ord() != Some(Ordering::Equal),
        CmpOp::Lt => ord() == Some(Ordering::Less),
        CmpOp::Gt => ord() == Some(Ordering::Greater),
        CmpOp::Le => matches!(ord(), Some(Ordering::Less | Ordering::Equal)),
        CmpOp::Ge => matches!(ord(), Some(Ordering::Greater | Ordering::Equal)),
        CmpOp::Has => a.text().contains(b.text()),
        CmpOp::HasI => a
            .text()
            .to_ascii_lowercase()
            .contains(&b.text().to_ascii_lowercase()),
        // Only an expression built by hand gets here: compiled for this
        // evaluation only.
        CmpOp::Matches | CmpOp::MatchesI => {
            Pattern::new(b.text(), op == CmpOp::MatchesI).is_match(a.text())?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> EsiVars {
        let mut v = EsiVars::new();
        v.set("A", "abc");
        v.set("N", "10");
        v.set("EMPTY", "");
        v.set("F", "false");
        v.set_entry("D", "k", "Hello World");
        v
    }

    fn t(s: &str) -> bool {
        Expr::parse(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .eval(&vars())
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn comparisons() {
        assert!(t("$(A) == 'abc'"));
        assert!(!t("$(A) != 'abc'"));
        assert!(t("$(A) != 'abd'"));
        assert!(t("$(A) < 'abd'"));
        assert!(t("$(A) <= 'abc'"));
        assert!(t("$(A) >= 'abc'"));
        assert!(!t("$(A) > 'abc'"));
        // Numeric when both sides are numbers, string otherwise.
        assert!(t("$(N) > 9"));
        assert!(t("$(N) == 10.0"));
        assert!(t("$(N) < '9'"), "a quoted literal compares as a string");
        assert!(t("-1.5 < .5"));
        assert!(t("$(MISSING) == ''"));
        assert!(t("$(MISSING|7) == 7"));
        assert!(t("$(D{k}) == 'Hello World'"));
    }

    #[test]
    fn logic_and_precedence() {
        assert!(t("$(A) == 'abc' & $(N) == 10"));
        assert!(t("$(A) == 'x' | $(N) == 10"));
        assert!(!t("$(A) == 'x' | $(N) == 11"));
        assert!(t("$(A) == 'x' || $(N) == 10 && $(A) == 'abc'"));
        assert!(t("!$(A) == 'x'"), "! applies to the whole comparison");
        assert!(t("!($(A) == 'x') & !!$(A)"));
        assert!(t("($(A) == 'x' | $(A) == 'abc') & ($(N) >= 10)"));
        // `&` binds tighter than `|`.
        assert!(t("$(N) == 10 | $(A) == 'x' & $(A) == 'y'"));
        assert!(!t("($(N) == 10 | $(A) == 'x') & $(A) == 'y'"));
    }

    #[test]
    fn truthiness() {
        assert!(t("$(A)"));
        assert!(!t("$(EMPTY)"));
        assert!(!t("$(MISSING)"));
        assert!(!t("$(F)"));
        assert!(!t("0"));
        assert!(t("'x'"));
        assert!(t("!$(MISSING)"));
    }

    #[test]
    fn string_ops() {
        assert!(t("$(D{k}) has 'World'"));
        assert!(!t("$(D{k}) has 'world'"));
        assert!(t("$(D{k}) has_i 'world'"));
        assert!(t("$(D{k}) matches '''^Hel+o\\s+W'''"));
        assert!(!t("$(D{k}) matches 'world'"));
        assert!(t("$(D{k}) matches_i 'WORLD$'"));
        assert!(t("'it\\'s' == \"it's\"".replace('"', "'''").as_str()));
    }

    #[test]
    fn bad_regex_is_an_eval_error() {
        let e = Expr::parse("$(A) matches '(('").expect("parses");
        assert!(matches!(
            e.eval(&vars()),
            Err(EvalError::Regex(PatternError::Syntax(_)))
        ));
        let e = Expr::parse("$(A) matches '''(a)\\1'''").expect("parses");
        assert_eq!(
            e.eval(&vars()),
            Err(EvalError::Regex(PatternError::Syntax(
                "backreferences are not supported".into()
            ))),
            "a linear engine has no back-references"
        );
        let e = Expr::parse("$(A) matches '''\\w{20}'''").expect("parses");
        assert_eq!(
            e.eval(&vars()),
            Err(EvalError::Regex(PatternError::TooLarge))
        );
    }

    #[test]
    fn a_written_pattern_is_compiled_with_the_test() {
        let e = Expr::parse("$(A) matches_i '''^A\\w+$'''").expect("parses");
        let Expr::Compare(CmpOp::MatchesI, _, right) = &e else {
            panic!("not a matches_i comparison: {e:?}")
        };
        assert_eq!(**right, Expr::Pattern(Pattern::new("^A\\w+$", true)));
        assert_eq!(e.eval(&vars()), Ok(true));
        // Other operators keep a string.
        assert!(matches!(
            Expr::parse("$(A) has 'x'"),
            Ok(Expr::Compare(CmpOp::Has, _, r)) if *r == Expr::Str("x".into())
        ));
    }

    #[test]
    fn a_pattern_from_a_variable_is_compiled_at_evaluation() {
        let mut v = vars();
        v.set("RE", "^ab");
        v.set("BAD", "(");
        let e = Expr::parse("$(A) matches $(RE)").expect("parses");
        assert_eq!(e.eval(&v), Ok(true));
        v.set("RE", "^b");
        assert_eq!(e.eval(&v), Ok(false), "the variable's current value");
        let e = Expr::parse("$(A) matches_i $(RE|'B')").expect("parses");
        assert_eq!(e.eval(&vars()), Ok(true));
        let e = Expr::parse("$(A) matches $(BAD)").expect("parses");
        assert!(e.eval(&v).is_err());
        assert_eq!(e.eval(&v), e.eval(&v), "the same error again");
        v.set("BAD", "^a");
        assert_eq!(e.eval(&v), Ok(true), "a new value is compiled anew");
    }

    #[test]
    fn a_hostile_subject_gets_the_right_answer() {
        let mut v = vars();
        v.set("AB", format!("{}b", "a".repeat(30)));
        for (test, want) in [
            ("$(AB) matches '''(a+)+$'''", false),
            ("$(AB) matches '''^(a|aa)+b$'''", true),
            ("!($(AB) matches '''^(a*)*$''')", true),
        ] {
            assert_eq!(
                Expr::parse(test).map(|e| e.eval(&v)),
                Ok(Ok(want)),
                "{test}"
            );
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "   ",
            "$(A) ==",
            "== 'a'",
            "'unterminated",
            "$(A",
            "$(A) = 'a'",
            "foo == 'a'",
            "($(A) == 'a'",
            "$(A) == 'a')",
            "$(A) == 'a' 'b'",
            "#",
            "-",
        ] {
            assert!(Expr::parse(bad).is_err(), "{bad:?} should not parse");
        }
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(Expr::parse(&deep), Err(ExprError::TooDeep));
        let nots = format!("{}1", "!".repeat(100));
        assert_eq!(Expr::parse(&nots), Err(ExprError::TooDeep));
        // A long chain nests as deep as it is long: refused, so evaluating
        // (and dropping) it cannot overflow the stack.
        let chain = format!("{}0", "0|".repeat(MAX_OPERATORS + 1));
        assert_eq!(Expr::parse(&chain), Err(ExprError::TooManyOperators));
        let chain = format!("{}0", "0&".repeat(MAX_OPERATORS + 1));
        assert_eq!(Expr::parse(&chain), Err(ExprError::TooManyOperators));
        let longest = format!("{}1", "0|".repeat(MAX_OPERATORS));
        assert_eq!(Expr::parse(&longest).map(|e| e.eval(&vars())), Ok(Ok(true)));
    }
}

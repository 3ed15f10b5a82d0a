//! A small backtracking regular-expression matcher for `matches` /
//! `matches_i` in ESI tests.
//!
//! Supported: literals, `.`, `^`, `$`, `[...]`/`[^...]` with ranges,
//! `\d \D \w \W \s \S` and escaped punctuation, groups `(...)` and
//! `(?:...)`, alternation `|`, quantifiers `* + ? {n} {n,} {n,m}` and their
//! lazy forms (`*?` ...). Not supported (an error, so the test is false):
//! back-references, look-around, `\b`, named groups, flags. Matching is a
//! search (the pattern may match anywhere unless anchored). Work is bounded
//! by a step budget and a recursion limit, so a hostile pattern costs at
//! most a few milliseconds and then fails.

/// Longest pattern accepted.
const MAX_PATTERN: usize = 1024;
/// Longest subject (in characters) searched.
const MAX_SUBJECT: usize = 8192;
/// Matcher steps before giving up.
const STEP_BUDGET: u32 = 200_000;
/// Deepest matcher recursion (bounds stack use).
const MAX_RECURSION: u32 = 1_000;
/// Deepest group nesting in a pattern.
const MAX_GROUPS_NESTING: usize = 32;

/// Why a pattern cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegexError {
    /// The pattern is not valid in the supported syntax.
    #[error("{0}")]
    Syntax(String),
    /// The pattern or subject is too long, or matching took too many steps.
    #[error("regular expression too costly")]
    TooCostly,
}

#[derive(Debug, Clone)]
enum ClassItem {
    Range(char, char),
    Digit(bool),
    Word(bool),
    Space(bool),
}

#[derive(Debug, Clone)]
enum Node {
    Char(char),
    Any,
    Class(bool, Vec<ClassItem>),
    Start,
    End,
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
        greedy: bool,
    },
}

/// A compiled pattern.
#[derive(Debug, Clone)]
pub struct Regex {
    root: Node,
    case_insensitive: bool,
}

struct PatternParser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    depth: usize,
}

fn syntax(msg: &str) -> RegexError {
    RegexError::Syntax(msg.to_owned())
}

impl PatternParser<'_> {
    fn alt(&mut self) -> Result<Node, RegexError> {
        let mut branches = vec![self.concat()?];
        while self.chars.peek() == Some(&'|') {
            self.chars.next();
            branches.push(self.concat()?);
        }
        Ok(if branches.len() == 1 {
            branches.pop().unwrap_or(Node::Concat(Vec::new()))
        } else {
            Node::Alt(branches)
        })
    }

    fn concat(&mut self) -> Result<Node, RegexError> {
        let mut items = Vec::new();
        while let Some(&c) = self.chars.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            let atom = self.quantified(atom)?;
            items.push(atom);
        }
        Ok(Node::Concat(items))
    }

    fn number(&mut self) -> Option<u32> {
        let mut n: Option<u32> = None;
        while let Some(d) = self.chars.peek().and_then(|c| c.to_digit(10)) {
            self.chars.next();
            n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d));
        }
        n
    }

    fn quantified(&mut self, atom: Node) -> Result<Node, RegexError> {
        let (min, max) = match self.chars.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.chars.next();
                let min = self.number().ok_or_else(|| syntax("bad {} quantifier"))?;
                let max = if self.chars.peek() == Some(&',') {
                    self.chars.next();
                    self.number()
                } else {
                    Some(min)
                };
                if self.chars.peek() != Some(&'}') {
                    return Err(syntax("bad {} quantifier"));
                }
                if max.is_some_and(|m| m < min) || min > 1000 || max.is_some_and(|m| m > 1000) {
                    return Err(syntax("bad {} bounds"));
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.chars.next();
        if matches!(atom, Node::Start | Node::End) {
            return Err(syntax("quantifier after an anchor"));
        }
        let greedy = if self.chars.peek() == Some(&'?') {
            self.chars.next();
            false
        } else {
            true
        };
        if matches!(self.chars.peek(), Some('*' | '+' | '?' | '{')) {
            return Err(syntax("repeated quantifier"));
        }
        Ok(Node::Repeat {
            node: Box::new(atom),
            min,
            max,
            greedy,
        })
    }

    fn escape(&mut self) -> Result<Result<char, ClassItem>, RegexError> {
        let c = self
            .chars
            .next()
            .ok_or_else(|| syntax("trailing backslash"))?;
        Ok(match c {
            'd' => Err(ClassItem::Digit(true)),
            'D' => Err(ClassItem::Digit(false)),
            'w' => Err(ClassItem::Word(true)),
            'W' => Err(ClassItem::Word(false)),
            's' => Err(ClassItem::Space(true)),
            'S' => Err(ClassItem::Space(false)),
            'n' => Ok('\n'),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            c if c.is_ascii_alphanumeric() => return Err(syntax("unsupported escape")),
            c => Ok(c),
        })
    }

    fn atom(&mut self) -> Result<Node, RegexError> {
        let c = self.chars.next().ok_or_else(|| syntax("unexpected end"))?;
        Ok(match c {
            '.' => Node::Any,
            '^' => Node::Start,
            '$' => Node::End,
            '(' => {
                if self.depth >= MAX_GROUPS_NESTING {
                    return Err(RegexError::TooCostly);
                }
                if self.chars.peek() == Some(&'?') {
                    self.chars.next();
                    if self.chars.next() != Some(':') {
                        return Err(syntax("unsupported group kind"));
                    }
                }
                self.depth += 1;
                let inner = self.alt()?;
                self.depth -= 1;
                if self.chars.next() != Some(')') {
                    return Err(syntax("unclosed group"));
                }
                inner
            }
            '[' => self.class()?,
            '\\' => match self.escape()? {
                Ok(c) => Node::Char(c),
                Err(item) => Node::Class(false, vec![item]),
            },
            '*' | '+' | '?' | '{' => return Err(syntax("quantifier without operand")),
            ')' => return Err(syntax("unbalanced )")),
            c => Node::Char(c),
        })
    }

    fn class(&mut self) -> Result<Node, RegexError> {
        let negated = if self.chars.peek() == Some(&'^') {
            self.chars.next();
            true
        } else {
            false
        };
        let mut items = Vec::new();
        let mut first = true;
        loop {
            let c = self.chars.next().ok_or_else(|| syntax("unclosed class"))?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = if c == '\\' {
                match self.escape()? {
                    Ok(c) => c,
                    Err(item) => {
                        items.push(item);
                        continue;
                    }
                }
            } else {
                c
            };
            let mut lookahead = self.chars.clone();
            if lookahead.next() == Some('-') && lookahead.peek().is_some_and(|c| *c != ']') {
                self.chars.next();
                let hi = match self.chars.next() {
                    Some('\\') => self.escape()?.map_err(|_| syntax("class in range"))?,
                    Some(c) => c,
                    None => return Err(syntax("unclosed class")),
                };
                if hi < lo {
                    return Err(syntax("reversed range"));
                }
                items.push(ClassItem::Range(lo, hi));
            } else {
                items.push(ClassItem::Range(lo, lo));
            }
        }
        Ok(Node::Class(negated, items))
    }
}

fn item_matches(item: &ClassItem, c: char) -> bool {
    match *item {
        ClassItem::Range(lo, hi) => lo <= c && c <= hi,
        ClassItem::Digit(yes) => c.is_ascii_digit() == yes,
        ClassItem::Word(yes) => (c.is_alphanumeric() || c == '_') == yes,
        ClassItem::Space(yes) => c.is_whitespace() == yes,
    }
}

struct Matcher<'a> {
    subject: &'a [char],
    ci: bool,
    steps: u32,
    depth: u32,
}

type Cont<'c> = &'c mut dyn FnMut(&mut Matcher<'_>, usize) -> Result<bool, RegexError>;

impl Matcher<'_> {
    fn tick(&mut self) -> Result<(), RegexError> {
        self.steps += 1;
        if self.steps > STEP_BUDGET {
            return Err(RegexError::TooCostly);
        }
        Ok(())
    }

    fn char_eq(&self, a: char, b: char) -> bool {
        a == b || (self.ci && a.eq_ignore_ascii_case(&b))
    }

    fn class_matches(&self, negated: bool, items: &[ClassItem], c: char) -> bool {
        let hit = |c: char| items.iter().any(|i| item_matches(i, c));
        let found =
            hit(c) || (self.ci && (hit(c.to_ascii_lowercase()) || hit(c.to_ascii_uppercase())));
        found != negated
    }

    /// Match `node` at `pos`, then call `k` with the end position.
    fn m(&mut self, node: &Node, pos: usize, k: Cont<'_>) -> Result<bool, RegexError> {
        self.tick()?;
        self.depth += 1;
        if self.depth > MAX_RECURSION {
            return Err(RegexError::TooCostly);
        }
        let r = self.m_inner(node, pos, k);
        self.depth -= 1;
        r
    }

    fn m_inner(&mut self, node: &Node, pos: usize, k: Cont<'_>) -> Result<bool, RegexError> {
        let cur = self.subject.get(pos).copied();
        match node {
            Node::Char(c) => match cur {
                Some(s) if self.char_eq(*c, s) => k(self, pos + 1),
                _ => Ok(false),
            },
            Node::Any => match cur {
                Some(s) if s != '\n' => k(self, pos + 1),
                _ => Ok(false),
            },
            Node::Class(neg, items) => match cur {
                Some(s) if self.class_matches(*neg, items, s) => k(self, pos + 1),
                _ => Ok(false),
            },
            Node::Start => {
                if pos == 0 {
                    k(self, pos)
                } else {
                    Ok(false)
                }
            }
            Node::End => {
                if pos == self.subject.len() {
                    k(self, pos)
                } else {
                    Ok(false)
                }
            }
            Node::Concat(items) => self.seq(items, pos, k),
            Node::Alt(branches) => {
                for b in branches {
                    if self.m(b, pos, &mut *k)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Node::Repeat {
                node,
                min,
                max,
                greedy,
            } => {
                if self.is_single_char(node) {
                    self.repeat_chars(node, *min, *max, *greedy, pos, k)
                } else {
                    self.repeat(node, *min, *max, *greedy, 0, pos, usize::MAX, k)
                }
            }
        }
    }

    fn is_single_char(&self, node: &Node) -> bool {
        matches!(node, Node::Char(_) | Node::Any | Node::Class(..))
    }

    fn single_matches(&self, node: &Node, c: char) -> bool {
        match node {
            Node::Char(p) => self.char_eq(*p, c),
            Node::Any => c != '\n',
            Node::Class(neg, items) => self.class_matches(*neg, items, c),
            _ => false,
        }
    }

    /// A repeated single-character matcher (`.*`, `\d+`, `[a-z]{2,}`):
    /// measured in a loop, so long subjects do not recurse per character.
    fn repeat_chars(
        &mut self,
        node: &Node,
        min: u32,
        max: Option<u32>,
        greedy: bool,
        pos: usize,
        k: Cont<'_>,
    ) -> Result<bool, RegexError> {
        let limit = max.map_or(usize::MAX, |m| m as usize);
        let mut n = 0usize;
        while n < limit {
            match self.subject.get(pos + n) {
                Some(&c) if self.single_matches(node, c) => n += 1,
                _ => break,
            }
        }
        let min = min as usize;
        if n < min {
            return Ok(false);
        }
        if greedy {
            for i in (min..=n).rev() {
                self.tick()?;
                if k(self, pos + i)? {
                    return Ok(true);
                }
            }
        } else {
            for i in min..=n {
                self.tick()?;
                if k(self, pos + i)? {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    fn seq(&mut self, items: &[Node], pos: usize, k: Cont<'_>) -> Result<bool, RegexError> {
        match items.split_first() {
            None => k(self, pos),
            Some((first, rest)) => self.m(first, pos, &mut |m: &mut Matcher<'_>, p| {
                m.seq(rest, p, &mut *k)
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        node: &Node,
        min: u32,
        max: Option<u32>,
        greedy: bool,
        count: u32,
        pos: usize,
        last: usize,
        k: Cont<'_>,
    ) -> Result<bool, RegexError> {
        self.tick()?;
        // An iteration that consumed nothing cannot make progress: stop
        // repeating so `(a*)*` terminates.
        if count > min && pos == last {
            return Ok(false);
        }
        let may_stop = count >= min;
        let may_go = max.is_none_or(|m| count < m);
        if may_stop && !greedy && k(self, pos)? {
            return Ok(true);
        }
        if may_go
            && self.m(node, pos, &mut |m: &mut Matcher<'_>, p| {
                m.repeat(node, min, max, greedy, count + 1, p, pos, &mut *k)
            })?
        {
            return Ok(true);
        }
        if may_stop && greedy {
            return k(self, pos);
        }
        Ok(false)
    }
}

impl Regex {
    /// Compile `pattern`; `case_insensitive` folds ASCII case.
    pub fn new(pattern: &str, case_insensitive: bool) -> Result<Regex, RegexError> {
        if pattern.len() > MAX_PATTERN {
            return Err(RegexError::TooCostly);
        }
        let mut p = PatternParser {
            chars: pattern.chars().peekable(),
            depth: 0,
        };
        let root = p.alt()?;
        if p.chars.next().is_some() {
            return Err(syntax("unbalanced )"));
        }
        Ok(Regex {
            root,
            case_insensitive,
        })
    }

    /// Does the pattern match anywhere in `subject`?
    pub fn is_match(&self, subject: &str) -> Result<bool, RegexError> {
        let chars: Vec<char> = subject.chars().take(MAX_SUBJECT + 1).collect();
        if chars.len() > MAX_SUBJECT {
            return Err(RegexError::TooCostly);
        }
        let mut m = Matcher {
            subject: &chars,
            ci: self.case_insensitive,
            steps: 0,
            depth: 0,
        };
        let anchored =
            matches!(&self.root, Node::Concat(items) if matches!(items.first(), Some(Node::Start)));
        let last_start = if anchored { 0 } else { chars.len() };
        for start in 0..=last_start {
            if m.m(&self.root, start, &mut |_, _| Ok(true))? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is(p: &str, s: &str) -> bool {
        Regex::new(p, false)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .is_match(s)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    #[test]
    fn basics() {
        assert!(is("abc", "xxabcxx"));
        assert!(!is("^abc", "xabc"));
        assert!(is("^abc$", "abc"));
        assert!(!is("^abc$", "abcd"));
        assert!(is("a.c", "abc"));
        assert!(is("colou?r", "color"));
        assert!(is("colou?r", "colour"));
        assert!(is("^a+b*c$", "aaac"));
        assert!(!is("^a+b*c$", "bc"));
        assert!(is("^(ab|cd)+$", "abcdab"));
        assert!(!is("^(ab|cd)+$", "abce"));
        assert!(is("^a{2,3}$", "aaa"));
        assert!(!is("^a{2,3}$", "aaaa"));
        assert!(is("^a{2}$", "aa"));
        assert!(is("^a{2,}$", "aaaaa"));
        assert!(is("^[a-c]+$", "abcabc"));
        assert!(!is("^[^a-c]+$", "abd"));
        assert!(is("^[-x]+$", "-x-"));
        assert!(is("^\\d+\\.\\d+$", "10.25"));
        assert!(is("MSIE \\d", "Mozilla/4.0 (compatible; MSIE 6.0)"));
        assert!(is("^(?:a|b)c$", "bc"));
        assert!(is("^a.*?b$", "axxb"));
        assert!(is("^(a*)*$", "aaaa"));
        assert!(is("", "anything"));
        assert!(is("\\(x\\)", "(x)"));
        assert!(is("^[\\w-]+$", "a_b-9"));
        assert!(
            Regex::new("hello", true)
                .and_then(|r| r.is_match("HeLLo"))
                .unwrap_or(false)
        );
        assert!(
            Regex::new("[a-z]+$", true)
                .and_then(|r| r.is_match("ABC"))
                .unwrap_or(false)
        );
    }

    #[test]
    fn errors() {
        for bad in [
            "(", ")", "[a", "a{", "a{3,1}", "*a", "a**", "\\", "\\b", "(?=a)", "[z-a]",
        ] {
            assert!(
                Regex::new(bad, false).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn catastrophic_patterns_are_bounded() {
        let r = Regex::new("^(a+)+$", false).expect("valid");
        let subject = format!("{}b", "a".repeat(40));
        assert_eq!(r.is_match(&subject), Err(RegexError::TooCostly));
        let long = "a".repeat(MAX_SUBJECT + 1);
        assert_eq!(
            Regex::new("a", false).and_then(|r| r.is_match(&long)),
            Err(RegexError::TooCostly)
        );
        // Single-character repeats run in a loop: long subjects are fine.
        let r = Regex::new("^a*$", false).expect("valid");
        assert_eq!(r.is_match(&"a".repeat(MAX_SUBJECT)), Ok(true));
        // Group repeats recurse; a long subject fails cleanly instead of overflowing the stack.
        let r = Regex::new("^(ab)*$", false).expect("valid");
        assert!(r.is_match(&"ab".repeat(MAX_SUBJECT / 2)).is_err());
    }
}

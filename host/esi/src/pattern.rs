//! Regular expressions for `matches` / `matches_i` in ESI tests, on the
//! [`regex`] crate: matching takes time linear in the subject (no
//! backtracking), and size limits bound what a pattern may compile to, so
//! neither a hostile template nor a hostile variable can make a test slow.
//!
//! The syntax is the `regex` crate's, with the hand-written engine this
//! replaced kept where the two would otherwise silently disagree: `\d` is
//! ASCII `[0-9]`, and `\<` / `\>` are the literal `<` / `>` (as in Perl),
//! not word boundaries. [`crate::expr`] lists what else changed. Matching is
//! a search: the pattern may match anywhere in the subject unless anchored
//! with `^` / `$` (start / end of the subject; `(?m)` makes them lines).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use regex::{Regex, RegexBuilder};

/// Longest pattern accepted, in bytes.
pub const MAX_PATTERN_LEN: usize = 1024;
/// Longest subject searched, in bytes. Linear matching still costs the
/// compiled pattern's size per subject byte when the lazy DFA gives up;
/// this keeps the worst test in the tens of milliseconds.
pub const MAX_SUBJECT_LEN: usize = 8 * 1024;
/// Most heap a compiled pattern may take ([`RegexBuilder::size_limit`]).
/// Unicode classes are large: `\w` alone takes about 50 KB, so `\w{5}`
/// fits and `\w{20}` does not (write `[A-Za-z0-9_]{20}` instead).
pub const MAX_COMPILED_SIZE: usize = 256 * 1024;
/// Cache of the lazy DFA per pattern and thread
/// ([`RegexBuilder::dfa_size_limit`]); when full, matching falls back to a
/// slower engine that is still linear.
pub const MAX_DFA_CACHE: usize = 256 * 1024;

/// Why a pattern could not be matched; the test then counts as false.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Not valid `regex` syntax, or a construct it does not support
    /// (back-references, look-around).
    #[error("{0}")]
    Syntax(String),
    /// The pattern is longer than [`MAX_PATTERN_LEN`].
    #[error("pattern of {0} bytes is longer than {MAX_PATTERN_LEN}")]
    TooLong(usize),
    /// The pattern compiles to more than [`MAX_COMPILED_SIZE`].
    #[error("pattern compiles to more than {MAX_COMPILED_SIZE} bytes")]
    TooLarge,
    /// The subject is longer than [`MAX_SUBJECT_LEN`].
    #[error("subject of {0} bytes is longer than {MAX_SUBJECT_LEN}")]
    SubjectTooLong(usize),
}

/// A `matches` / `matches_i` pattern, compiled on first use. Clones share
/// the compiled form, so a pattern written in a cached template is compiled
/// once, not on every request.
#[derive(Clone)]
pub struct Pattern {
    source: Arc<str>,
    case_insensitive: bool,
    compiled: Arc<OnceLock<Result<Regex, PatternError>>>,
}

impl Pattern {
    /// A pattern; `case_insensitive` (for `matches_i`) folds case by
    /// Unicode's simple case folding. Nothing is compiled yet.
    pub fn new(source: &str, case_insensitive: bool) -> Pattern {
        Pattern {
            source: source.into(),
            case_insensitive,
            compiled: Arc::default(),
        }
    }

    /// The pattern as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether it is a `matches_i` pattern.
    pub fn case_insensitive(&self) -> bool {
        self.case_insensitive
    }

    /// Does the pattern match anywhere in `subject`? Compiles the pattern
    /// the first time (a failure is kept too, and returned every time).
    pub fn is_match(&self, subject: &str) -> Result<bool, PatternError> {
        if subject.len() > MAX_SUBJECT_LEN {
            return Err(PatternError::SubjectTooLong(subject.len()));
        }
        let regex = self
            .compiled
            .get_or_init(|| compile(&self.source, self.case_insensitive))
            .as_ref()
            .map_err(Clone::clone)?;
        Ok(regex.is_match(subject))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.case_insensitive == other.case_insensitive
    }
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pattern")
            .field("source", &self.source)
            .field("case_insensitive", &self.case_insensitive)
            .finish_non_exhaustive()
    }
}

/// The pattern last used by a `matches` whose pattern is computed at
/// evaluation (a variable): reused while the computed text stays the same.
/// Clones share it.
#[derive(Clone, Default)]
pub struct LastPattern(Arc<Mutex<Option<Pattern>>>);

impl LastPattern {
    /// The pattern for `source`: the last one when it is the same, else a
    /// new one, kept in its place (compiled outside the lock, on first use).
    pub fn get(&self, source: &str, case_insensitive: bool) -> Pattern {
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match &*last {
            Some(p) if p.source() == source && p.case_insensitive() == case_insensitive => {
                p.clone()
            }
            _ => last.insert(Pattern::new(source, case_insensitive)).clone(),
        }
    }
}

/// A cache, so any two are equal: expressions compare by what they say.
impl PartialEq for LastPattern {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for LastPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastPattern").finish_non_exhaustive()
    }
}

fn compile(source: &str, case_insensitive: bool) -> Result<Regex, PatternError> {
    if source.len() > MAX_PATTERN_LEN {
        return Err(PatternError::TooLong(source.len()));
    }
    RegexBuilder::new(&esi_to_regex_syntax(source))
        .case_insensitive(case_insensitive)
        .size_limit(MAX_COMPILED_SIZE)
        .dfa_size_limit(MAX_DFA_CACHE)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => PatternError::TooLarge,
            // The message's last line says what is wrong; the lines above
            // quote the translated pattern, which the author did not write.
            e => {
                let msg = e.to_string();
                let last = msg.lines().last().unwrap_or_default();
                PatternError::Syntax(last.trim_start_matches("error: ").to_owned())
            }
        })
}

/// Rewrites the escapes whose meaning in the `regex` crate differs from the
/// ESI engine's (see the module docs). A backslash always takes the next
/// character as an escape, inside classes too, so a left-to-right scan is
/// exact; `[0-9]` is valid inside a class as a nested class.
fn esi_to_regex_syntax(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 8);
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str("[0-9]"),
            Some('D') => out.push_str("[^0-9]"),
            Some(lit @ ('<' | '>')) => out.push(lit),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            // A trailing backslash stays, for the regex crate to reject.
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is(p: &str, s: &str) -> bool {
        Pattern::new(p, false)
            .is_match(s)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn is_i(p: &str, s: &str) -> bool {
        Pattern::new(p, true)
            .is_match(s)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    #[test]
    fn the_syntax_the_esi_engine_accepted() {
        assert!(is("abc", "xxabcxx"), "a search, not a whole match");
        assert!(!is("^abc", "xabc"));
        assert!(is("^abc$", "abc"));
        assert!(!is("^abc$", "abcd"));
        assert!(!is("^abc$", "abc\n"), "$ is the end of the subject only");
        assert!(is("a.c", "abc"));
        assert!(!is("a.c", "a\nc"), ". does not match a newline");
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
        assert!(is("^[]a]+$", "]a"), "] first in a class is literal");
        assert!(is("^\\d+\\.\\d+$", "10.25"));
        assert!(is("MSIE \\d", "Mozilla/4.0 (compatible; MSIE 6.0)"));
        assert!(is("^(?:a|b)c$", "bc"));
        assert!(is("^a.*?b$", "axxb"));
        assert!(is("^(a*)*$", "aaaa"));
        assert!(is("", "anything"));
        assert!(is("\\(x\\)", "(x)"));
        assert!(is("^[\\w-]+$", "a_b-9"));
        assert!(is("^\\w+$", "größe"), "\\w is Unicode, as before");
        assert!(is("^\\s$", "\u{a0}"), "\\s is Unicode, as before");
        assert!(is("\\t\\n\\r", "\t\n\r"));
        assert!(is("^a\\-b\\/c\\'d$", "a-b/c'd"), "escaped punctuation");
        assert!(is_i("hello", "HeLLo"));
        assert!(is_i("[a-z]+$", "ABC"));
    }

    #[test]
    fn escapes_kept_from_the_esi_engine() {
        // \d is ASCII, also inside classes and negated.
        assert!(!is("\\d", "٣"), "Arabic-Indic three is not \\d");
        assert!(!is("[\\d]", "٣"));
        assert!(is("^[\\d_]+$", "1_2"));
        assert!(is("^\\D$", "٣"));
        assert!(is("^[^\\d]$", "x"));
        assert!(!is("^[^\\d]$", "7"));
        // \< and \> are literal angle brackets, not word boundaries.
        assert!(is("\\<b\\>", "<b>bold</b>"));
        assert!(!is("\\<b", "a b"));
        assert!(is("[\\<]", "<"));
        // An escaped backslash does not start an escape.
        assert!(is("^\\\\d$", "\\d"));
    }

    #[test]
    fn where_the_regex_crate_differs_from_the_esi_engine() {
        // Accepted now, an error (so false) before.
        assert!(is("\\bcat\\b", "a cat sat"));
        assert!(!is("\\bcat\\b", "concatenate"));
        assert!(is("(?i)^abc$", "ABC"));
        assert!(is("^(?P<y>\\d{4})$", "2024"));
        assert!(is("^\\p{Greek}+$", "αβγ"));
        assert!(is("^\\x41$", "A"));
        assert!(
            is("^a**$", "aaa"),
            "stacked repeats are a repeat of a repeat"
        );
        // Meaning changed inside classes: `[` opens a nested or POSIX class.
        assert!(is("^[[:digit:]]+$", "42"));
        assert!(matches!(
            Pattern::new("[[]", false).is_match("["),
            Err(PatternError::Syntax(_))
        ));
        assert!(is("^[\\[]$", "["), "an escaped [ is literal");
        // Unicode case folding for matches_i, where the engine folded ASCII.
        assert!(is_i("^é$", "É"));
        assert!(is_i("^k$", "\u{212a}"), "KELVIN SIGN folds to k");
    }

    #[test]
    fn unsupported_syntax_is_an_error_not_a_panic() {
        for bad in [
            "(", ")", "[a", "a{", "a{3,1}", "*a", "\\", "[z-a]", "(?=a)", "(?<=a)b", "\\1",
            "(a)\\1", "\\é",
        ] {
            match Pattern::new(bad, false).is_match("a") {
                Err(PatternError::Syntax(msg)) => {
                    assert!(!msg.contains('\n'), "{bad:?}: one-line message {msg:?}");
                }
                other => panic!("{bad:?} should be a syntax error, got {other:?}"),
            }
        }
        assert_eq!(
            Pattern::new("(a)\\1", false).is_match("aa"),
            Err(PatternError::Syntax(
                "backreferences are not supported".into()
            ))
        );
    }

    #[test]
    fn pathological_patterns_answer_correctly() {
        // Exponential for a backtracking matcher; the old engine gave up
        // (an error, so false). A linear engine gives the answer.
        let subject = format!("{}b", "a".repeat(30));
        assert_eq!(Pattern::new("(a+)+$", false).is_match(&subject), Ok(false));
        assert_eq!(
            Pattern::new("^(a|aa)+b$", false).is_match(&subject),
            Ok(true)
        );
        assert_eq!(
            Pattern::new("^(a|a?)+$", false).is_match(&subject),
            Ok(false)
        );
        let long = "a".repeat(MAX_SUBJECT_LEN);
        assert_eq!(Pattern::new("^(a+)+$", false).is_match(&long), Ok(true));
        assert_eq!(Pattern::new("(a*)*b", false).is_match(&long), Ok(false));
        // A large alternation within the length limit.
        let words: Vec<String> = (0..150).map(|i| format!("w{i}x")).collect();
        let alternation = format!("^({})+$", words.join("|"));
        assert!(alternation.len() <= MAX_PATTERN_LEN);
        let hit = words.concat();
        assert_eq!(Pattern::new(&alternation, false).is_match(&hit), Ok(true));
        assert_eq!(
            Pattern::new(&alternation, false).is_match(&format!("{hit}w")),
            Ok(false)
        );
    }

    #[test]
    fn limits_refuse_costly_patterns_and_subjects() {
        // Short, but Unicode \w twenty times over is several hundred KB.
        let big = "\\w{20}";
        assert!(big.len() < MAX_PATTERN_LEN);
        assert_eq!(
            Pattern::new(big, false).is_match("a"),
            Err(PatternError::TooLarge)
        );
        assert_eq!(Pattern::new("\\w{5}", false).is_match("abcde"), Ok(true));
        let long = "a".repeat(MAX_PATTERN_LEN + 1);
        assert_eq!(
            Pattern::new(&long, false).is_match("a"),
            Err(PatternError::TooLong(MAX_PATTERN_LEN + 1))
        );
        let subject = "a".repeat(MAX_SUBJECT_LEN + 1);
        assert_eq!(
            Pattern::new("a", false).is_match(&subject),
            Err(PatternError::SubjectTooLong(MAX_SUBJECT_LEN + 1))
        );
    }

    #[test]
    fn the_last_pattern_is_reused_while_its_text_stays() {
        let last = LastPattern::default();
        assert_eq!(last.get("^a", false).is_match("ab"), Ok(true));
        let again = last.get("^a", false);
        assert!(again.compiled.get().is_some(), "compiled before: reused");
        let other = last.get("^a", true);
        assert!(
            other.compiled.get().is_none(),
            "matches_i is another pattern"
        );
        assert_eq!(other.is_match("AB"), Ok(true));
        assert!(last.get("^b", true).compiled.get().is_none());
    }

    #[test]
    fn clones_share_one_compilation() {
        let p = Pattern::new("^x", false);
        let q = p.clone();
        assert_eq!(q.is_match("xy"), Ok(true));
        assert!(p.compiled.get().is_some(), "compiled through the clone");
        assert_eq!(p, Pattern::new("^x", false));
        assert_ne!(p, Pattern::new("^x", true));
    }
}

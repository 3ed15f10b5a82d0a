//! ESI variables (`$(NAME)`, `$(NAME{key})`, `$(NAME|default)`) and the
//! templates that use them: include `src`/`alt` attributes and the text of
//! `<esi:vars>` blocks.

use std::borrow::Cow;
use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;

/// Longest variable reference (`$(...)`) the parser recognises; anything
/// longer is literal text. Bounds what the streaming parser holds back.
pub const MAX_VAR_REF_LEN: usize = 1024;

/// A reference to a variable: `$(NAME)`, `$(NAME{key})`, `$(NAME|default)`,
/// `$(NAME{key}|'default')`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarRef {
    /// Variable name, e.g. `HTTP_COOKIE`.
    pub name: String,
    /// Dictionary key or list member between `{` and `}`.
    pub key: Option<String>,
    /// Value used when the variable (or key) is not set.
    pub default: Option<String>,
}

/// One piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    /// Bytes copied as they are.
    Literal(Bytes),
    /// A variable, replaced by its value (or default, or nothing).
    Var(VarRef),
}

/// Text with variable references, rendered against [`EsiVars`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Template {
    /// Pieces in order.
    pub parts: Vec<TemplatePart>,
}

/// Outcome of recognising a variable reference at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum VarScan {
    /// A reference of this many bytes.
    Complete(usize, VarRef),
    /// The buffer ends before the reference could be decided.
    Incomplete,
    /// Not a variable reference: the `$` is literal.
    Invalid,
}

/// Recognise `$(...)` at the start of `s` (which starts with `$`).
pub(crate) fn scan_var_ref(s: &[u8]) -> VarScan {
    debug_assert!(s.first() == Some(&b'$'));
    let limit = s.len().min(MAX_VAR_REF_LEN);
    let at = |i: usize| -> Option<u8> { if i < limit { Some(s[i]) } else { None } };
    // Distinguish "ran out of input" (maybe more is coming) from "too long".
    let out_of_input = |i: usize| {
        if i >= MAX_VAR_REF_LEN {
            VarScan::Invalid
        } else {
            VarScan::Incomplete
        }
    };
    let mut i = 1;
    match at(i) {
        None => return out_of_input(i),
        Some(b'(') => i += 1,
        Some(_) => return VarScan::Invalid,
    }
    let name_start = i;
    loop {
        match at(i) {
            None => return out_of_input(i),
            Some(c) if c.is_ascii_alphanumeric() || c == b'_' => i += 1,
            Some(_) => break,
        }
    }
    if i == name_start || s[name_start].is_ascii_digit() {
        return VarScan::Invalid;
    }
    let name = String::from_utf8_lossy(&s[name_start..i]).into_owned();
    let mut key = None;
    if at(i) == Some(b'{') {
        i += 1;
        let key_start = i;
        loop {
            match at(i) {
                None => return out_of_input(i),
                Some(b'}') => break,
                // A key never spans markup or another reference.
                Some(b'<' | b'>' | b'(' | b')' | b'{' | b'$') => return VarScan::Invalid,
                Some(_) => i += 1,
            }
        }
        key = Some(String::from_utf8_lossy(&s[key_start..i]).into_owned());
        i += 1;
    }
    let mut default = None;
    match at(i) {
        None => return out_of_input(i),
        Some(b')') => {}
        Some(b'|') => {
            i += 1;
            match at(i) {
                None => return out_of_input(i),
                Some(b'\'') => {
                    i += 1;
                    let d_start = i;
                    loop {
                        match at(i) {
                            None => return out_of_input(i),
                            Some(b'\'') => break,
                            Some(_) => i += 1,
                        }
                    }
                    default = Some(String::from_utf8_lossy(&s[d_start..i]).into_owned());
                    i += 1;
                    match at(i) {
                        None => return out_of_input(i),
                        Some(b')') => {}
                        Some(_) => return VarScan::Invalid,
                    }
                }
                Some(_) => {
                    let d_start = i;
                    loop {
                        match at(i) {
                            None => return out_of_input(i),
                            Some(b')') => break,
                            Some(b'<' | b'>' | b'(' | b'$' | b'\'') => return VarScan::Invalid,
                            Some(_) => i += 1,
                        }
                    }
                    default = Some(String::from_utf8_lossy(&s[d_start..i]).into_owned());
                }
            }
        }
        Some(_) => return VarScan::Invalid,
    }
    // `s[i]` is the closing parenthesis.
    VarScan::Complete(i + 1, VarRef { name, key, default })
}

impl Template {
    /// Parse text that may contain variable references (an attribute value).
    /// Malformed references are kept as literal text.
    pub fn parse(text: &[u8]) -> Template {
        let mut t = TemplateBuilder::default();
        let mut i = 0;
        while i < text.len() {
            match memchr::memchr(b'$', &text[i..]) {
                None => {
                    t.literal(&text[i..]);
                    break;
                }
                Some(off) => {
                    t.literal(&text[i..i + off]);
                    i += off;
                    match scan_var_ref(&text[i..]) {
                        VarScan::Complete(len, var) => {
                            t.var(var);
                            i += len;
                        }
                        VarScan::Incomplete | VarScan::Invalid => {
                            t.literal(b"$");
                            i += 1;
                        }
                    }
                }
            }
        }
        t.finish()
    }

    /// A template that is only literal text.
    pub fn literal(text: impl Into<Bytes>) -> Template {
        let text = text.into();
        let parts = if text.is_empty() {
            Vec::new()
        } else {
            vec![TemplatePart::Literal(text)]
        };
        Template { parts }
    }

    /// True when the template has no variable references.
    pub fn is_literal(&self) -> bool {
        self.parts
            .iter()
            .all(|p| matches!(p, TemplatePart::Literal(_)))
    }

    /// Substitute variables. Unset variables without a default render as
    /// nothing, as the ESI specification says.
    pub fn render(&self, vars: &EsiVars) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [TemplatePart::Literal(b)] => b.clone(),
            parts => {
                let mut out = BytesMut::new();
                for part in parts {
                    match part {
                        TemplatePart::Literal(b) => out.extend_from_slice(b),
                        TemplatePart::Var(v) => {
                            if let Some(value) = vars.resolve(v) {
                                out.extend_from_slice(value.as_bytes());
                            }
                        }
                    }
                }
                out.freeze()
            }
        }
    }

    /// [`Template::render`] as a string (invalid UTF-8 replaced), for include URLs.
    pub fn render_string(&self, vars: &EsiVars) -> String {
        String::from_utf8_lossy(&self.render(vars)).into_owned()
    }

    /// Append another template, merging adjacent literals.
    pub(crate) fn append(&mut self, other: Template) {
        for part in other.parts {
            match (self.parts.last_mut(), part) {
                (Some(TemplatePart::Literal(a)), TemplatePart::Literal(b)) => {
                    let mut m = BytesMut::with_capacity(a.len() + b.len());
                    m.extend_from_slice(a);
                    m.extend_from_slice(&b);
                    *a = m.freeze();
                }
                (_, part) => self.parts.push(part),
            }
        }
    }
}

/// Accumulates template parts, merging adjacent literal text.
#[derive(Default)]
pub(crate) struct TemplateBuilder {
    parts: Vec<TemplatePart>,
    pending: BytesMut,
}

impl TemplateBuilder {
    pub(crate) fn literal(&mut self, b: &[u8]) {
        self.pending.extend_from_slice(b);
    }

    pub(crate) fn var(&mut self, v: VarRef) {
        self.flush();
        self.parts.push(TemplatePart::Var(v));
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let p = self.pending.split().freeze();
        match self.parts.last_mut() {
            Some(TemplatePart::Literal(a)) => {
                let mut m = BytesMut::with_capacity(a.len() + p.len());
                m.extend_from_slice(a);
                m.extend_from_slice(&p);
                *a = m.freeze();
            }
            _ => self.parts.push(TemplatePart::Literal(p)),
        }
    }

    pub(crate) fn finish(mut self) -> Template {
        self.flush();
        Template { parts: self.parts }
    }
}

/// A variable set by a policy: a plain value and/or dictionary entries.
#[derive(Debug, Clone, Default)]
struct CustomVar {
    value: Option<String>,
    entries: HashMap<String, String>,
}

/// The variables ESI markup can read, built from the client request and
/// extended by policies.
///
/// | variable | whole value | `{key}` |
/// |---|---|---|
/// | `HTTP_HOST` | Host | - |
/// | `HTTP_COOKIE` | Cookie header(s), joined by `; ` | cookie value |
/// | `HTTP_USER_AGENT` | User-Agent | `browser` (`MSIE`, `MOZILLA`, `OTHER`), `os` (`WIN`, `MAC`, `UNIX`, `OTHER`), `version` |
/// | `QUERY_STRING` | query without `?` | first value of the parameter, as sent (not percent-decoded) |
/// | `HTTP_ACCEPT_LANGUAGE` | Accept-Language | `true`/`false`: is the language (or a sub-tag of it) accepted with q > 0 |
/// | `HTTP_REFERER` | Referer | - |
///
/// Variables set with [`EsiVars::set`] / [`EsiVars::set_entry`] take
/// precedence over the built-in ones of the same name.
#[derive(Debug, Clone, Default)]
pub struct EsiVars {
    host: Option<String>,
    cookie: Option<String>,
    cookies: Vec<(String, String)>,
    user_agent: Option<String>,
    query: Option<String>,
    accept_language: Option<String>,
    languages: Vec<String>,
    referer: Option<String>,
    custom: HashMap<String, CustomVar>,
}

fn header_string(headers: &HeaderMap, name: http::header::HeaderName, sep: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for v in headers.get_all(name) {
        let v = String::from_utf8_lossy(v.as_bytes());
        match &mut out {
            None => out = Some(v.into_owned()),
            Some(o) => {
                o.push_str(sep);
                o.push_str(&v);
            }
        }
    }
    out
}

impl EsiVars {
    /// No variables at all (every reference renders empty or its default).
    pub fn new() -> EsiVars {
        EsiVars::default()
    }

    /// Variables for a client request: `host` is the Host the client asked
    /// for, `path_and_query` the request target (`/a/b?x=1`).
    pub fn from_request(host: &str, path_and_query: &str, headers: &HeaderMap) -> EsiVars {
        use http::header;
        let cookie = header_string(headers, header::COOKIE, "; ");
        let cookies = cookie.as_deref().map(parse_cookies).unwrap_or_default();
        let accept_language = header_string(headers, header::ACCEPT_LANGUAGE, ", ");
        let languages = accept_language
            .as_deref()
            .map(parse_accept_language)
            .unwrap_or_default();
        let query = path_and_query
            .split_once('?')
            .map(|(_, q)| q.split('#').next().unwrap_or("").to_owned());
        EsiVars {
            host: (!host.is_empty()).then(|| host.to_owned()),
            cookie,
            cookies,
            user_agent: header_string(headers, header::USER_AGENT, " "),
            query,
            accept_language,
            languages,
            referer: header_string(headers, header::REFERER, ", "),
            custom: HashMap::new(),
        }
    }

    /// Set a custom variable (`$(NAME)`), e.g. from a policy.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.custom.entry(name.into()).or_default().value = Some(value.into());
    }

    /// Set one entry of a custom dictionary variable (`$(NAME{key})`).
    pub fn set_entry(
        &mut self,
        name: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
    ) {
        self.custom
            .entry(name.into())
            .or_default()
            .entries
            .insert(key.into(), value.into());
    }

    /// The value of a variable reference: the variable, else its default,
    /// else `None`.
    pub fn resolve(&self, v: &VarRef) -> Option<Cow<'_, str>> {
        self.get(&v.name, v.key.as_deref())
            .or_else(|| v.default.as_deref().map(|d| Cow::Owned(d.to_owned())))
    }

    /// The value of `name` (with `key` for `$(NAME{key})`), if set.
    pub fn get(&self, name: &str, key: Option<&str>) -> Option<Cow<'_, str>> {
        if let Some(c) = self.custom.get(name) {
            let found = match key {
                None => c.value.as_deref(),
                Some(k) => c.entries.get(k).map(String::as_str),
            };
            if let Some(v) = found {
                return Some(Cow::Borrowed(v));
            }
        }
        let b = Cow::Borrowed;
        match (name, key) {
            ("HTTP_HOST", None) => self.host.as_deref().map(b),
            ("HTTP_COOKIE", None) => self.cookie.as_deref().map(b),
            ("HTTP_COOKIE", Some(k)) => self
                .cookies
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| b(v.as_str())),
            ("HTTP_USER_AGENT", None) => self.user_agent.as_deref().map(b),
            ("HTTP_USER_AGENT", Some(k)) => {
                let ua = self.user_agent.as_deref().unwrap_or("");
                match k {
                    "browser" => Some(b(classify_browser(ua).0)),
                    "version" => Some(Cow::Owned(classify_browser(ua).1)),
                    "os" => Some(b(classify_os(ua))),
                    _ => None,
                }
            }
            ("QUERY_STRING", None) => self.query.as_deref().map(b),
            ("QUERY_STRING", Some(k)) => self.query.as_deref().and_then(|q| {
                q.split('&').find_map(|pair| {
                    let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (n == k).then(|| b(v))
                })
            }),
            ("HTTP_ACCEPT_LANGUAGE", None) => self.accept_language.as_deref().map(b),
            ("HTTP_ACCEPT_LANGUAGE", Some(k)) => {
                let k = k.to_ascii_lowercase();
                let accepted = self.languages.iter().any(|l| {
                    l == &k || (l.starts_with(&k) && l.as_bytes().get(k.len()) == Some(&b'-'))
                });
                Some(b(if accepted { "true" } else { "false" }))
            }
            ("HTTP_REFERER", None) => self.referer.as_deref().map(b),
            _ => None,
        }
    }
}

fn parse_cookies(header: &str) -> Vec<(String, String)> {
    header
        .split(';')
        .filter_map(|c| {
            let (n, v) = c.split_once('=')?;
            let n = n.trim();
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (!n.is_empty()).then(|| (n.to_owned(), v.to_owned()))
        })
        .collect()
}

/// Languages accepted with q > 0, lower-cased.
fn parse_accept_language(header: &str) -> Vec<String> {
    header
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let tag = parts.next()?.trim().to_ascii_lowercase();
            let refused = parts.any(|p| {
                let p = p.trim();
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (!tag.is_empty() && !refused).then_some(tag)
        })
        .collect()
}

/// ESI 1.0 browser classes (`MSIE`, `MOZILLA`, `OTHER`) and the version.
fn classify_browser(ua: &str) -> (&'static str, String) {
    let version_after = |marker: &str| -> Option<String> {
        let at = ua.find(marker)? + marker.len();
        let v: String = ua[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        (!v.is_empty()).then_some(v)
    };
    if ua.contains("MSIE ") || ua.contains("Trident/") {
        let v = version_after("MSIE ")
            .or_else(|| version_after("rv:"))
            .unwrap_or_default();
        ("MSIE", v)
    } else if ua.starts_with("Mozilla/") {
        ("MOZILLA", version_after("Mozilla/").unwrap_or_default())
    } else {
        let v = ua
            .split_once('/')
            .map(|(_, rest)| {
                rest.chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect()
            })
            .unwrap_or_default();
        ("OTHER", v)
    }
}

/// ESI 1.0 operating-system classes: `WIN`, `MAC`, `UNIX`, `OTHER`.
fn classify_os(ua: &str) -> &'static str {
    if ua.contains("Windows") || ua.contains("Win32") || ua.contains("Win64") || ua.contains("Win9")
    {
        "WIN"
    } else if ua.contains("Mac") || ua.contains("iPhone") || ua.contains("iPad") {
        "MAC"
    } else if [
        "Linux", "X11", "BSD", "SunOS", "Unix", "UNIX", "AIX", "HP-UX",
    ]
    .iter()
    .any(|m| ua.contains(m))
    {
        "UNIX"
    } else {
        "OTHER"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn vars() -> EsiVars {
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_static("a=1; group=gold"));
        h.append("cookie", HeaderValue::from_static("sid=\"xyz\""));
        h.insert(
            "user-agent",
            HeaderValue::from_static(
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/120.0",
            ),
        );
        h.insert(
            "accept-language",
            HeaderValue::from_static("en-US,en;q=0.9, fr;q=0, de"),
        );
        h.insert("referer", HeaderValue::from_static("https://ref.example/"));
        EsiVars::from_request("www.example.com", "/p?x=1&y=a%20b&z", &h)
    }

    fn get(v: &EsiVars, name: &str, key: Option<&str>) -> Option<String> {
        v.get(name, key).map(|c| c.into_owned())
    }

    #[test]
    fn request_variables() {
        let v = vars();
        assert_eq!(
            get(&v, "HTTP_HOST", None).as_deref(),
            Some("www.example.com")
        );
        assert_eq!(
            get(&v, "HTTP_COOKIE", None).as_deref(),
            Some("a=1; group=gold; sid=\"xyz\"")
        );
        assert_eq!(
            get(&v, "HTTP_COOKIE", Some("group")).as_deref(),
            Some("gold")
        );
        assert_eq!(get(&v, "HTTP_COOKIE", Some("sid")).as_deref(), Some("xyz"));
        assert_eq!(get(&v, "HTTP_COOKIE", Some("nope")), None);
        assert_eq!(
            get(&v, "QUERY_STRING", None).as_deref(),
            Some("x=1&y=a%20b&z")
        );
        assert_eq!(get(&v, "QUERY_STRING", Some("y")).as_deref(), Some("a%20b"));
        assert_eq!(get(&v, "QUERY_STRING", Some("z")).as_deref(), Some(""));
        assert_eq!(get(&v, "QUERY_STRING", Some("w")), None);
        assert_eq!(
            get(&v, "HTTP_REFERER", None).as_deref(),
            Some("https://ref.example/")
        );
        assert_eq!(get(&v, "NOPE", None), None);
    }

    #[test]
    fn accept_language_members() {
        let v = vars();
        let lang = |l| get(&v, "HTTP_ACCEPT_LANGUAGE", Some(l));
        assert_eq!(lang("en").as_deref(), Some("true"));
        assert_eq!(lang("EN-us").as_deref(), Some("true"));
        assert_eq!(lang("de").as_deref(), Some("true"));
        assert_eq!(lang("fr").as_deref(), Some("false"), "q=0 means refused");
        assert_eq!(
            lang("e").as_deref(),
            Some("false"),
            "prefix must end at a sub-tag"
        );
        assert_eq!(lang("es").as_deref(), Some("false"));
    }

    #[test]
    fn user_agent_classes() {
        let v = vars();
        assert_eq!(
            get(&v, "HTTP_USER_AGENT", Some("browser")).as_deref(),
            Some("MOZILLA")
        );
        assert_eq!(
            get(&v, "HTTP_USER_AGENT", Some("version")).as_deref(),
            Some("5.0")
        );
        assert_eq!(
            get(&v, "HTTP_USER_AGENT", Some("os")).as_deref(),
            Some("WIN")
        );
        assert_eq!(
            classify_browser("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)"),
            ("MSIE", "6.0".to_owned())
        );
        assert_eq!(
            classify_browser("Mozilla/5.0 (Windows NT 6.1; Trident/7.0; rv:11.0) like Gecko"),
            ("MSIE", "11.0".to_owned())
        );
        assert_eq!(
            classify_browser("curl/8.4.0"),
            ("OTHER", "8.4.0".to_owned())
        );
        assert_eq!(
            classify_os("Mozilla/5.0 (Macintosh; Intel Mac OS X 14_0)"),
            "MAC"
        );
        assert_eq!(classify_os("Mozilla/5.0 (X11; Linux x86_64)"), "UNIX");
        assert_eq!(classify_os("curl/8.4.0"), "OTHER");
    }

    #[test]
    fn custom_variables_override_and_dictionaries() {
        let mut v = vars();
        v.set("HTTP_HOST", "override");
        v.set("SEGMENT", "b");
        v.set_entry("GEO", "country", "NL");
        assert_eq!(get(&v, "HTTP_HOST", None).as_deref(), Some("override"));
        assert_eq!(get(&v, "SEGMENT", None).as_deref(), Some("b"));
        assert_eq!(get(&v, "GEO", Some("country")).as_deref(), Some("NL"));
        assert_eq!(get(&v, "GEO", None), None);
        // An override of the plain value leaves built-in keys reachable.
        assert_eq!(get(&v, "HTTP_COOKIE", Some("a")).as_deref(), Some("1"));
    }

    #[test]
    fn var_ref_forms() {
        let c = |s: &str| scan_var_ref(s.as_bytes());
        let var = |n: &str, k: Option<&str>, d: Option<&str>| VarRef {
            name: n.into(),
            key: k.map(Into::into),
            default: d.map(Into::into),
        };
        assert_eq!(c("$(A)x"), VarScan::Complete(4, var("A", None, None)));
        assert_eq!(
            c("$(A{k})"),
            VarScan::Complete(7, var("A", Some("k"), None))
        );
        assert_eq!(
            c("$(A|d e)"),
            VarScan::Complete(8, var("A", None, Some("d e")))
        );
        assert_eq!(
            c("$(A{k}|'x)y')"),
            VarScan::Complete(13, var("A", Some("k"), Some("x)y")))
        );
        assert_eq!(
            c("$(A{k}|'')"),
            VarScan::Complete(10, var("A", Some("k"), Some("")))
        );
        assert_eq!(c("$"), VarScan::Incomplete);
        assert_eq!(c("$(A{k"), VarScan::Incomplete);
        assert_eq!(c("$(A|'x'"), VarScan::Incomplete);
        assert_eq!(c("$x"), VarScan::Invalid);
        assert_eq!(c("$()"), VarScan::Invalid);
        assert_eq!(c("$(1A)"), VarScan::Invalid);
        assert_eq!(c("$(A B)"), VarScan::Invalid);
        assert_eq!(c("$(A{<})"), VarScan::Invalid);
        let long = format!("$(A|{}", "x".repeat(MAX_VAR_REF_LEN));
        assert_eq!(
            c(&long),
            VarScan::Invalid,
            "over-long references are literal"
        );
    }

    #[test]
    fn template_render() {
        let v = vars();
        let t = Template::parse(
            b"http://$(HTTP_HOST)/x?g=$(HTTP_COOKIE{group})&m=$(MISSING|none)&$$(bad",
        );
        assert_eq!(
            &t.render(&v)[..],
            b"http://www.example.com/x?g=gold&m=none&$$(bad"
        );
        assert!(!t.is_literal());
        assert!(Template::parse(b"plain $ text").is_literal());
        assert_eq!(&Template::parse(b"$(NOPE)").render(&v)[..], b"");
    }
}

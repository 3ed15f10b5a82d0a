//! The cache key: host, path and query and what the policy added (the
//! primary key, Varnish's `hash_data`), and the variant a request selects
//! among the responses stored under it (Vary).

use http::HeaderMap;
use inlay_core::RequestHead;

/// Separates the primary key from the Vary variant in a storage key.
pub(crate) const VARIANT_SEP: char = '\u{1}';
/// Separates the parts of a primary key.
const PART_SEP: char = '\u{2}';

/// The cache key of a request before Vary: host, path and query, and what
/// the policy added (Varnish's `hash_data`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrimaryKey(String);

impl PrimaryKey {
    /// Build the key. Control characters in policy data are escaped so they
    /// cannot forge the separators.
    pub fn new(host: &str, path_and_query: &str, extra: &[String]) -> Self {
        let mut k = String::with_capacity(host.len() + path_and_query.len() + 8);
        k.push_str(&host.to_ascii_lowercase());
        k.push(PART_SEP);
        k.push_str(path_and_query);
        for e in extra {
            k.push(PART_SEP);
            for c in e.chars() {
                if c.is_control() {
                    k.push_str(&format!("\\x{:02x}", c as u32));
                } else {
                    k.push(c);
                }
            }
        }
        Self(k)
    }

    /// The key of a request: its Host, path and query, and what the
    /// policy added. A Host that is not visible ASCII is escaped, not
    /// dropped: it must not share the key of requests without a Host.
    pub fn of(head: &RequestHead) -> Self {
        let host = head
            .headers
            .get(http::header::HOST)
            .map(|h| escaped(h.as_bytes()))
            .unwrap_or_default();
        Self::new(&host, head.path_and_query(), &head.cache_key_extra)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A key from its text ([`as_str`](Self::as_str)), as another node sent
    /// it; `None` unless it has a host part and no variant separator (which
    /// would make it the key of one variant, or of none).
    pub fn from_text(text: &str) -> Option<Self> {
        (text.contains(PART_SEP) && !text.contains(VARIANT_SEP)).then(|| Self(text.to_owned()))
    }

    /// Prefix shared by every variant of this key in the store.
    pub(crate) fn variants_prefix(&self) -> String {
        let mut k = String::with_capacity(self.0.len() + 16);
        k.push_str(&self.0);
        k.push(VARIANT_SEP);
        k
    }

    /// The storage key of the variant a request with `headers` selects;
    /// `codings` normalises Accept-Encoding.
    pub(crate) fn storage_key(
        &self,
        vary: &[String],
        headers: &HeaderMap,
        codings: &ContentCodings,
    ) -> String {
        let mut k = self.variants_prefix();
        for (i, name) in vary.iter().enumerate() {
            if i > 0 {
                k.push(PART_SEP);
            }
            k.push_str(name);
            k.push('=');
            k.push_str(&vary_value(name, headers, codings));
        }
        k
    }
}

/// The content codings the cache keeps apart, in the order it prefers them
/// (`cache.accept_encoding`). A request's Accept-Encoding is reduced to the
/// first of them the client accepts, or `identity`: the key uses that value
/// and a fetch for the cache sends exactly it, so every stored variant is
/// one the clients that select it can decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentCodings(Vec<String>);

impl Default for ContentCodings {
    /// `br`, then `gzip`.
    fn default() -> Self {
        Self(vec!["br".into(), "gzip".into()])
    }
}

/// The Accept-Encoding value of a request that accepts none of the codings.
const IDENTITY: &str = "identity";

impl ContentCodings {
    /// The codings, most preferred first. Names are compared without case;
    /// `identity`, `*` and empty names are dropped (identity is what is
    /// left when nothing else matches), and so are repeats.
    pub fn new<S: AsRef<str>>(preferred: &[S]) -> Self {
        let mut v: Vec<String> = Vec::new();
        for c in preferred {
            let c = c.as_ref().trim().to_ascii_lowercase();
            if !c.is_empty() && c != IDENTITY && c != "*" && !v.contains(&c) {
                v.push(c);
            }
        }
        Self(v)
    }

    /// The codings, most preferred first.
    pub fn preferred(&self) -> &[String] {
        &self.0
    }

    /// The first preferred coding the request accepts with a q-value above
    /// zero (named, or through `*` when it is not named), else `identity`.
    /// Field lines are combined; names are compared without case; an
    /// element whose q-value does not parse accepts nothing.
    pub fn negotiate(&self, headers: &HeaderMap) -> &str {
        self.negotiate_among(headers, |_| true)
    }

    /// [`negotiate`](Self::negotiate) among the codings `offered` says a
    /// response has: the first preferred coding the request accepts and
    /// that is offered, else `identity` (also when the request refuses
    /// identity: RFC 9110 section 12.5.3 says to send it uncoded then).
    /// What a client is served is chosen here, and what the key selects.
    pub fn negotiate_among(&self, headers: &HeaderMap, offered: impl Fn(&str) -> bool) -> &str {
        // (coding, accepted) of each element, in order; `*` included.
        let mut elements: Vec<(String, bool)> = Vec::new();
        for line in headers.get_all(http::header::ACCEPT_ENCODING) {
            let Ok(line) = line.to_str() else {
                continue;
            };
            for element in line.split(',') {
                let mut parts = element.split(';');
                let coding = parts.next().unwrap_or("").trim();
                if coding.is_empty() {
                    continue;
                }
                let mut accepted = true;
                for param in parts {
                    let Some((name, value)) = param.split_once('=') else {
                        continue;
                    };
                    if name.trim().eq_ignore_ascii_case("q") {
                        accepted = qvalue_above_zero(value.trim());
                    }
                }
                // Only the first mention of a coding we prefer or of `*`
                // counts: memory stays bounded by the list, however long
                // or repetitive the field.
                let relevant =
                    coding == "*" || self.0.iter().any(|c| c.eq_ignore_ascii_case(coding));
                if relevant && !elements.iter().any(|(c, _)| c.eq_ignore_ascii_case(coding)) {
                    elements.push((coding.to_ascii_lowercase(), accepted));
                }
            }
        }
        let star = elements
            .iter()
            .find(|(c, _)| c == "*")
            .is_some_and(|(_, ok)| *ok);
        for pref in &self.0 {
            let named = elements.iter().find(|(c, _)| c == pref);
            if named.map_or(star, |(_, ok)| *ok) && offered(pref) {
                return pref;
            }
        }
        IDENTITY
    }

    /// Replace the request's Accept-Encoding with the negotiated value
    /// (`identity` when it accepts none of the codings), as a fetch for the
    /// cache sends it.
    pub fn normalise(&self, headers: &mut HeaderMap) {
        let value = self.negotiate(headers).to_owned();
        // A coding name from the config is a token, hence a valid value.
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            headers.insert(http::header::ACCEPT_ENCODING, v);
        }
    }
}

/// Whether a q-value (RFC 9110 section 12.4.2) is above zero; one that does
/// not parse is not.
fn qvalue_above_zero(q: &str) -> bool {
    let mut chars = q.chars();
    match chars.next() {
        Some('0') => {}
        Some('1') => {
            return match chars.as_str().strip_prefix('.') {
                None => chars.as_str().is_empty(),
                Some(zeros) => zeros.len() <= 3 && zeros.chars().all(|c| c == '0'),
            };
        }
        _ => return false,
    }
    match chars.next() {
        None => false,
        Some('.') => {
            let digits = chars.as_str();
            digits.len() <= 3
                && digits.chars().all(|c| c.is_ascii_digit())
                && digits.chars().any(|c| c != '0')
        }
        Some(_) => false,
    }
}

/// The value of a request header as Vary compares it, normalised so that
/// spelling does not make variants: field lines are combined, whitespace
/// around list elements and empty elements are dropped; Accept-Language is
/// compared without case, whitespace or order; Accept-Encoding is reduced
/// to the coding the cache would fetch (see [`ContentCodings`]). Bytes that
/// are not visible ASCII are escaped, so they neither vanish nor forge a
/// separator.
fn vary_value(name: &str, headers: &HeaderMap, codings: &ContentCodings) -> String {
    if name == "accept-encoding" {
        return codings.negotiate(headers).to_owned();
    }
    let mut elements: Vec<String> = Vec::new();
    for line in headers.get_all(name) {
        for element in line.as_bytes().split(|b| *b == b',') {
            let element = element.trim_ascii();
            if !element.is_empty() {
                elements.push(escaped(element));
            }
        }
    }
    if name == "accept-language" {
        for e in &mut elements {
            e.retain(|c| c != ' ' && c != '\t');
            e.make_ascii_lowercase();
        }
        elements.sort();
        elements.dedup();
    }
    elements.join(",")
}

/// `bytes` as text: visible ASCII and spaces kept, a backslash doubled,
/// anything else as `\xNN`.
fn escaped(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            b' ' | 0x21..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

/// The lower-case header names a response varies on (sorted, deduplicated).
pub fn vary_names(headers: &HeaderMap) -> Vec<String> {
    let mut names: Vec<String> = headers
        .get_all(http::header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty() && n != "*")
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    fn key_of(vary: &[&str], pairs: &[(&str, &str)]) -> String {
        let vary: Vec<String> = vary.iter().map(|s| s.to_string()).collect();
        PrimaryKey::new("h", "/", &[]).storage_key(
            &vary,
            &headers(pairs),
            &ContentCodings::default(),
        )
    }

    #[test]
    fn keys_separate_hosts_urls_extras_and_variants() {
        let a = PrimaryKey::new("Example.com", "/x?a=1", &[]);
        assert_eq!(a, PrimaryKey::new("example.com", "/x?a=1", &[]));
        assert_ne!(a, PrimaryKey::new("example.org", "/x?a=1", &[]));
        assert_ne!(a, PrimaryKey::new("example.com", "/x?a=2", &[]));
        assert_ne!(a, PrimaryKey::new("example.com", "/x?a=1", &["b".into()]));
        // Policy data cannot forge a separator.
        let forged = PrimaryKey::new("h", "/", &["a\u{1}b".into()]);
        assert!(!forged.as_str().contains(VARIANT_SEP));
        let vary = ["accept-encoding", "x-ab"];
        let gz = key_of(&vary, &[("accept-encoding", "gzip;q=1"), ("x-ab", "a")]);
        let gz2 = key_of(&vary, &[("accept-encoding", "gzip"), ("x-ab", "a")]);
        let b = key_of(&vary, &[("accept-encoding", "gzip"), ("x-ab", "b")]);
        assert_eq!(gz, gz2);
        assert_ne!(gz, b);
        assert!(gz.starts_with(&PrimaryKey::new("h", "/", &[]).variants_prefix()));
    }

    #[test]
    fn a_host_that_is_not_ascii_does_not_share_the_key_of_no_host() {
        let mut with = RequestHead::default();
        with.headers.insert(
            http::header::HOST,
            http::HeaderValue::from_bytes(b"\xc3\xa9.example").unwrap(),
        );
        let without = RequestHead::default();
        assert_ne!(PrimaryKey::of(&with), PrimaryKey::of(&without));
        let mut other = RequestHead::default();
        other.headers.insert(
            http::header::HOST,
            http::HeaderValue::from_bytes(b"\xc3\xa8.example").unwrap(),
        );
        assert_ne!(PrimaryKey::of(&with), PrimaryKey::of(&other));
        // Nor a Host that spells the escape out.
        let mut spelled = RequestHead::default();
        spelled.headers.insert(
            http::header::HOST,
            http::HeaderValue::from_static("\\xc3\\xa9.example"),
        );
        assert_ne!(PrimaryKey::of(&with), PrimaryKey::of(&spelled));
    }

    fn negotiated(codings: &ContentCodings, values: &[&str]) -> String {
        let pairs: Vec<(&str, &str)> = values.iter().map(|v| ("accept-encoding", *v)).collect();
        codings.negotiate(&headers(&pairs)).to_owned()
    }

    #[test]
    fn accept_encoding_is_the_first_preferred_coding_the_client_accepts() {
        let c = ContentCodings::default();
        let cases: &[(&[&str], &str)] = &[
            (&[], "identity"),
            (&[""], "identity"),
            (&["gzip"], "gzip"),
            (&["br"], "br"),
            (&["gzip, deflate, br, zstd"], "br"),
            (&["GZIP , Br"], "br"),
            (&["deflate"], "identity"),
            (&["br;q=0, gzip"], "gzip"),
            (&["br;q=0.0, gzip;q=0.000"], "identity"),
            (&["br;q=0.001"], "br"),
            (&["br; Q=0"], "identity"),
            (&["br;q=1.000"], "br"),
            (&["br;q=bogus, gzip"], "gzip"),
            (&["br;q=2"], "identity"),
            (&["*"], "br"),
            (&["*;q=0"], "identity"),
            (&["*, br;q=0"], "gzip"),
            (&["identity;q=0"], "identity"),
            (&["identity;q=0, gzip"], "gzip"),
            (&["gzip", "br"], "br"),
            (&["gzip;q=0", "gzip"], "identity"),
            (&[",,, ; ;q=, gzip"], "gzip"),
        ];
        for (values, want) in cases {
            assert_eq!(negotiated(&c, values), *want, "{values:?}");
        }
        // The configured order decides, not the client's.
        let gzip_first = ContentCodings::new(&["gzip", "br"]);
        assert_eq!(negotiated(&gzip_first, &["br, gzip"]), "gzip");
        // `identity` and `*` are not codings to prefer.
        let odd = ContentCodings::new(&["Identity", "*", "ZSTD", "zstd", " "]);
        assert_eq!(odd.preferred(), ["zstd"]);
        // Among what a response has: the next preferred one it accepts.
        let h = headers(&[("accept-encoding", "zstd, br, gzip")]);
        let zbg = ContentCodings::new(&["zstd", "br", "gzip"]);
        assert_eq!(zbg.negotiate_among(&h, |c| c != "zstd"), "br");
        assert_eq!(zbg.negotiate_among(&h, |c| c == "gzip"), "gzip");
        assert_eq!(zbg.negotiate_among(&h, |_| false), "identity");
        // An absurdly long field costs nothing but the scan.
        let long = format!("{}gzip", "x-coding, ".repeat(10_000));
        assert_eq!(negotiated(&c, &[&long]), "gzip");
    }

    #[test]
    fn normalising_accept_encoding_is_what_the_key_uses() {
        let c = ContentCodings::default();
        for v in ["gzip, deflate, br, zstd", "gzip", "deflate", "*;q=0"] {
            let mut h = headers(&[("accept-encoding", v)]);
            let key = key_of(&["accept-encoding"], &[("accept-encoding", v)]);
            c.normalise(&mut h);
            let after: Vec<(&str, &str)> = h
                .iter()
                .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
                .collect();
            assert_eq!(after.len(), 1);
            assert_eq!(key_of(&["accept-encoding"], &after), key, "{v}");
        }
        let mut none = HeaderMap::new();
        c.normalise(&mut none);
        assert_eq!(none.get("accept-encoding").unwrap(), "identity");
    }

    #[test]
    fn browsers_with_different_lists_share_the_variant_of_their_best_coding() {
        let vary = ["accept-encoding"];
        let chrome = key_of(&vary, &[("accept-encoding", "gzip, deflate, br, zstd")]);
        let safari = key_of(&vary, &[("accept-encoding", "gzip, deflate, br")]);
        let gzip_only = key_of(&vary, &[("accept-encoding", "gzip")]);
        let none = key_of(&vary, &[]);
        assert_eq!(chrome, safari);
        assert_ne!(chrome, gzip_only);
        assert_ne!(gzip_only, none);
        assert_ne!(chrome, none);
    }

    #[test]
    fn vary_values_ignore_whitespace_and_how_lines_are_split() {
        // cache-tests vary-normalise-combine and vary-normalise-space.
        let vary = ["foo"];
        let one = key_of(&vary, &[("foo", "1, 2")]);
        assert_eq!(one, key_of(&vary, &[("foo", "1"), ("foo", "2")]));
        assert_eq!(one, key_of(&vary, &[("foo", "1,2")]));
        assert_eq!(one, key_of(&vary, &[("foo", " 1 ,\t2 ")]));
        assert_ne!(one, key_of(&vary, &[("foo", "2, 1")]), "order matters");
        assert_ne!(one, key_of(&vary, &[("foo", "1 2")]));
        assert_ne!(
            key_of(&vary, &[("foo", "")]),
            key_of(&vary, &[("foo", "a")])
        );
        // A value that is not ASCII is neither dropped nor confused.
        let mut h = HeaderMap::new();
        h.insert("foo", http::HeaderValue::from_bytes(b"\xff").unwrap());
        let k = PrimaryKey::new("h", "/", &[]);
        let codings = ContentCodings::default();
        let binary = k.storage_key(&["foo".into()], &h, &codings);
        assert_ne!(binary, key_of(&vary, &[]));
        assert_ne!(binary, key_of(&vary, &[("foo", "\\xff")]));
    }

    #[test]
    fn accept_language_ignores_order_case_and_whitespace() {
        // cache-tests vary-normalise-lang-order, -lang-case, -lang-space.
        let vary = ["accept-language"];
        let en_de = key_of(&vary, &[("accept-language", "en, de")]);
        for same in ["de, en", "eN, De", " en ,   de", "en,de,en", "de", "en"] {
            let k = key_of(&vary, &[("accept-language", same)]);
            if same.len() > 2 {
                assert_eq!(k, en_de, "{same}");
            } else {
                assert_ne!(k, en_de, "{same}");
            }
        }
        assert_eq!(
            key_of(&vary, &[("accept-language", "fr;q=0.5, de")]),
            key_of(&vary, &[("accept-language", "DE, fr ; q=0.5")]),
        );
    }

    #[test]
    fn vary_names_are_normalised() {
        let h = headers(&[
            ("vary", "Accept-Encoding, X-AB"),
            ("vary", "accept-encoding"),
        ]);
        assert_eq!(vary_names(&h), ["accept-encoding", "x-ab"]);
    }
}

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
    /// policy added.
    pub fn of(head: &RequestHead) -> Self {
        Self::new(head.host(), head.path_and_query(), &head.cache_key_extra)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Prefix shared by every variant of this key in the store.
    pub(crate) fn variants_prefix(&self) -> String {
        let mut k = String::with_capacity(self.0.len() + 16);
        k.push_str(&self.0);
        k.push(VARIANT_SEP);
        k
    }

    /// The storage key of the variant a request with `headers` selects.
    pub(crate) fn storage_key(&self, vary: &[String], headers: &HeaderMap) -> String {
        let mut k = self.variants_prefix();
        for (i, name) in vary.iter().enumerate() {
            if i > 0 {
                k.push(PART_SEP);
            }
            k.push_str(name);
            k.push('=');
            k.push_str(&vary_value(name, headers));
        }
        k
    }
}

/// The value of a request header as Vary compares it. Accept-Encoding is
/// normalised to `gzip` or nothing, as Varnish does, so that every browser's
/// slightly different list does not make a variant of its own.
fn vary_value(name: &str, headers: &HeaderMap) -> String {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if name == "accept-encoding" {
        let gzip = values.iter().flat_map(|v| v.split(',')).any(|e| {
            e.split(';')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("gzip"))
        });
        return if gzip { "gzip".into() } else { String::new() };
    }
    values
        .join(", ")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
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
        let vary = vec!["accept-encoding".to_string(), "x-ab".to_string()];
        let gz = a.storage_key(
            &vary,
            &headers(&[("accept-encoding", "br, gzip;q=1"), ("x-ab", "a")]),
        );
        let gz2 = a.storage_key(
            &vary,
            &headers(&[("accept-encoding", "gzip"), ("x-ab", "a")]),
        );
        let b = a.storage_key(
            &vary,
            &headers(&[("accept-encoding", "gzip"), ("x-ab", "b")]),
        );
        assert_eq!(gz, gz2);
        assert_ne!(gz, b);
        assert!(gz.starts_with(&a.variants_prefix()));
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

//! HTTP caching rules (RFC 9111, the Edge Architecture Specification's
//! `Surrogate-Control`, Varnish's built-in VCL): how long a response may be
//! stored and served, and whether at all.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header};
use inlay_core::CacheSettings;

/// Defaults used when a response says nothing (from `[cache]`).
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// Varnish's `default_ttl`.
    pub ttl: Duration,
    /// Varnish's `default_grace`.
    pub grace: Duration,
    /// Varnish's `default_keep`.
    pub keep: Duration,
}

/// Parsed `Cache-Control` directives that matter to a shared cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheControl {
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache` (unqualified or with field names).
    pub no_cache: bool,
    /// `private` (unqualified or with field names).
    pub private: bool,
    /// `public`.
    pub public: bool,
    /// `max-age`.
    pub max_age: Option<u64>,
    /// `s-maxage`.
    pub s_maxage: Option<u64>,
    /// `stale-while-revalidate`.
    pub stale_while_revalidate: Option<u64>,
    /// `stale-if-error`.
    pub stale_if_error: Option<u64>,
    /// `must-revalidate` or `proxy-revalidate`.
    pub must_revalidate: bool,
}

impl CacheControl {
    /// Parse every `Cache-Control` field of `headers`. Unknown or malformed
    /// directives are ignored, as RFC 9111 section 5.2 asks.
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut cc = Self::default();
        for (name, value) in directives(headers, header::CACHE_CONTROL) {
            match name.as_str() {
                "no-store" => cc.no_store = true,
                "no-cache" => cc.no_cache = true,
                "private" => cc.private = true,
                "public" => cc.public = true,
                "must-revalidate" | "proxy-revalidate" => cc.must_revalidate = true,
                "max-age" => cc.max_age = value.and_then(seconds).or(cc.max_age),
                "s-maxage" => cc.s_maxage = value.and_then(seconds).or(cc.s_maxage),
                "stale-while-revalidate" => {
                    cc.stale_while_revalidate =
                        value.and_then(seconds).or(cc.stale_while_revalidate)
                }
                "stale-if-error" => {
                    cc.stale_if_error = value.and_then(seconds).or(cc.stale_if_error)
                }
                _ => {}
            }
        }
        cc
    }
}

/// Parsed `Surrogate-Control` (Edge Architecture Specification 1.0): it
/// speaks to edge caches and wins over `Cache-Control` for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SurrogateControl {
    /// `max-age=N` (seconds fresh).
    pub max_age: Option<u64>,
    /// The `+M` of `max-age=N+M`: seconds it may be served stale.
    pub stale: Option<u64>,
    /// `no-store`.
    pub no_store: bool,
    /// `content="ESI/1.0"`: the body wants ESI processing.
    pub esi: bool,
}

impl SurrogateControl {
    /// Parse `Surrogate-Control`. Directives targeted at another device
    /// (`;name` other than `inlay`) are ignored.
    pub fn parse(headers: &HeaderMap) -> Self {
        let mut sc = Self::default();
        for v in headers.get_all("surrogate-control") {
            let Ok(v) = v.to_str() else { continue };
            for part in split_list(v) {
                let (directive, target) = match part.rsplit_once(';') {
                    Some((d, t))
                        if !d.contains('"')
                            || t.trim()
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
                    {
                        (d.trim(), Some(t.trim()))
                    }
                    _ => (part, None),
                };
                if target.is_some_and(|t| !t.eq_ignore_ascii_case("inlay")) {
                    continue;
                }
                let (name, value) = split_directive(directive);
                match name.as_str() {
                    "no-store" => sc.no_store = true,
                    "max-age" => {
                        if let Some(v) = value {
                            let (fresh, stale) = match v.split_once('+') {
                                Some((f, s)) => (f, Some(s)),
                                None => (v.as_str(), None),
                            };
                            sc.max_age = seconds(fresh.to_owned()).or(sc.max_age);
                            sc.stale = stale.and_then(|s| seconds(s.to_owned())).or(sc.stale);
                        }
                    }
                    "content"
                        if value.is_some_and(|v| {
                            v.split_whitespace()
                                .any(|c| c.eq_ignore_ascii_case("ESI/1.0"))
                        }) =>
                    {
                        sc.esi = true;
                    }
                    _ => {}
                }
            }
        }
        sc
    }
}

/// Statuses cached without explicit freshness (Varnish's built-in list).
fn cacheable_by_default(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 304 | 404 | 410 | 414
    )
}

/// Statuses that may be cached when the response gives explicit freshness.
fn cacheable_with_explicit_freshness(status: StatusCode) -> bool {
    cacheable_by_default(status) || matches!(status.as_u16(), 302 | 307 | 308 | 405 | 501)
}

/// The host's default decision for a backend response to a lookup request.
pub fn decide(
    status: StatusCode,
    headers: &HeaderMap,
    defaults: &Defaults,
    now: SystemTime,
) -> CacheSettings {
    let cc = CacheControl::parse(headers);
    let sc = SurrogateControl::parse(headers);
    let surrogate_keys = surrogate_keys(headers);
    let mut s = CacheSettings {
        cacheable: false,
        ttl: Duration::ZERO,
        grace: defaults.grace,
        keep: defaults.keep,
        surrogate_keys,
        esi: sc.esi,
    };
    let explicit = sc.max_age.or(cc.s_maxage).or(cc.max_age);
    let from_expires = || {
        let expires = headers.get(header::EXPIRES)?.to_str().ok()?;
        // RFC 9111: an invalid Expires (for example "0") means already expired.
        let expires = httpdate::parse_http_date(expires).unwrap_or(SystemTime::UNIX_EPOCH);
        let date = headers
            .get(header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .unwrap_or(now);
        Some(
            expires
                .duration_since(date)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        )
    };
    let lifetime = explicit.or_else(from_expires);
    let allowed_status = if lifetime.is_some() {
        cacheable_with_explicit_freshness(status)
    } else {
        cacheable_by_default(status)
    };
    let vary_star = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == "*");
    // Surrogate-Control speaks to us directly: its max-age overrides private / no-cache.
    let forbidden = sc.no_store
        || (sc.max_age.is_none() && (cc.no_store || cc.private || cc.no_cache))
        || headers.contains_key(header::SET_COOKIE)
        || vary_star;
    if forbidden || !allowed_status {
        return s;
    }
    let age = headers
        .get(header::AGE)
        .and_then(|a| a.to_str().ok())
        .and_then(|a| a.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let lifetime = lifetime.unwrap_or(defaults.ttl.as_secs());
    s.ttl = Duration::from_secs(lifetime.saturating_sub(age));
    s.cacheable = true;
    if let Some(swr) = sc.stale.or(cc.stale_while_revalidate) {
        s.grace = Duration::from_secs(swr);
    }
    if cc.must_revalidate {
        s.grace = Duration::ZERO;
    }
    if let Some(sie) = cc.stale_if_error {
        s.keep = s.keep.max(Duration::from_secs(sie));
    }
    s
}

/// The `Surrogate-Key` header's keys (space-separated, possibly repeated fields).
pub fn surrogate_keys(headers: &HeaderMap) -> Vec<String> {
    surrogate_keys_of(headers, "surrogate-key")
}

/// Space-separated keys from every field called `name`, sorted and deduplicated.
pub fn surrogate_keys_of(headers: &HeaderMap, name: &str) -> Vec<String> {
    let mut keys: Vec<String> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split_ascii_whitespace())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn directives(headers: &HeaderMap, name: header::HeaderName) -> Vec<(String, Option<String>)> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(split_list)
        .map(split_directive)
        .collect()
}

/// Split a comma-separated list, keeping commas inside double quotes.
fn split_list(v: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, c) in v.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(v[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(v[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

fn split_directive(d: &str) -> (String, Option<String>) {
    match d.split_once('=') {
        Some((n, v)) => (
            n.trim().to_ascii_lowercase(),
            Some(v.trim().trim_matches('"').to_owned()),
        ),
        None => (d.trim().to_ascii_lowercase(), None),
    }
}

fn seconds(v: String) -> Option<u64> {
    // Values too large for u64 are capped, per RFC 9111 section 1.2.2.
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse::<u64>().unwrap_or(u64::MAX).min(2_147_483_648))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    const D: Defaults = Defaults {
        ttl: Duration::from_secs(120),
        grace: Duration::from_secs(10),
        keep: Duration::ZERO,
    };

    fn decide_ok(pairs: &[(&str, &str)]) -> CacheSettings {
        decide(StatusCode::OK, &h(pairs), &D, SystemTime::now())
    }

    #[test]
    fn freshness_precedence_surrogate_then_s_maxage_then_max_age_then_expires() {
        assert_eq!(decide_ok(&[]).ttl, Duration::from_secs(120));
        assert_eq!(
            decide_ok(&[("cache-control", "max-age=60")]).ttl.as_secs(),
            60
        );
        assert_eq!(
            decide_ok(&[("cache-control", "max-age=60, s-maxage=30")])
                .ttl
                .as_secs(),
            30
        );
        let s = decide_ok(&[
            ("cache-control", "s-maxage=30"),
            ("surrogate-control", "max-age=300+60"),
        ]);
        assert_eq!((s.ttl.as_secs(), s.grace.as_secs()), (300, 60));
        let date = httpdate::fmt_http_date(SystemTime::now());
        let exp = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(50));
        assert_eq!(
            decide_ok(&[("date", &date), ("expires", &exp)])
                .ttl
                .as_secs(),
            50
        );
        assert!(decide_ok(&[("expires", "0")]).ttl.is_zero());
    }

    #[test]
    fn uncacheable_responses() {
        for pairs in [
            vec![("cache-control", "no-store")],
            vec![("cache-control", "private, max-age=60")],
            vec![("cache-control", "no-cache")],
            vec![("set-cookie", "a=b")],
            vec![("vary", "*")],
            vec![("surrogate-control", "no-store")],
        ] {
            assert!(!decide_ok(&pairs).cacheable, "{pairs:?}");
        }
        assert!(
            !decide(
                StatusCode::INTERNAL_SERVER_ERROR,
                &h(&[]),
                &D,
                SystemTime::now()
            )
            .cacheable
        );
        assert!(!decide(StatusCode::FOUND, &h(&[]), &D, SystemTime::now()).cacheable);
        assert!(
            decide(
                StatusCode::FOUND,
                &h(&[("cache-control", "max-age=5")]),
                &D,
                SystemTime::now()
            )
            .cacheable
        );
        // Surrogate-Control is for us; it wins over private.
        assert!(
            decide_ok(&[
                ("cache-control", "private"),
                ("surrogate-control", "max-age=10")
            ])
            .cacheable
        );
    }

    #[test]
    fn age_grace_keep_keys_and_esi() {
        let s = decide_ok(&[
            (
                "cache-control",
                "max-age=100, stale-while-revalidate=30, stale-if-error=600",
            ),
            ("age", "40"),
            ("surrogate-key", "a b"),
            ("surrogate-key", "c a"),
            ("surrogate-control", "content=\"ESI/1.0\""),
        ]);
        assert_eq!(s.ttl.as_secs(), 60);
        assert_eq!(s.grace.as_secs(), 30);
        assert_eq!(s.keep.as_secs(), 600);
        assert_eq!(s.surrogate_keys, ["a", "b", "c"]);
        assert!(s.esi);
        assert!(!decide_ok(&[("surrogate-control", "content=\"ESI/1.0\";other")]).esi);
        assert!(decide_ok(&[("surrogate-control", "content=\"ESI/1.0\";inlay")]).esi);
        assert!(
            decide_ok(&[("cache-control", "max-age=10, must-revalidate")])
                .grace
                .is_zero()
        );
    }

    proptest! {
        #[test]
        fn any_header_text_parses_without_panic(cc in ".{0,80}", sc in ".{0,80}") {
            let mut m = HeaderMap::new();
            if let Ok(v) = cc.parse() { m.insert(header::CACHE_CONTROL, v); }
            if let Ok(v) = sc.parse() { m.insert("surrogate-control", v); }
            let _ = decide(StatusCode::OK, &m, &D, SystemTime::now());
        }
    }
}

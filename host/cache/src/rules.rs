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
    /// `must-understand`: `no-store` may be ignored for a status the cache
    /// understands (RFC 9111 section 5.2.2.3).
    pub must_understand: bool,
}

impl CacheControl {
    /// Parse every `Cache-Control` field of `headers`. Unknown or malformed
    /// directives are ignored, as RFC 9111 section 5.2 asks.
    pub fn parse(headers: &HeaderMap) -> Self {
        Self::from_directives(directives(headers, header::CACHE_CONTROL))
    }

    /// The directives of the first targeted field (RFC 9213) aimed at us
    /// that has any: `Inlay-Cache-Control`, then `CDN-Cache-Control`. When
    /// there is one, `Cache-Control` and `Expires` are ignored.
    ///
    /// Targeted fields are Structured Field dictionaries (RFC 9651): one
    /// that does not parse, or whose `max-age`-like directive is not an
    /// integer, is ignored as a whole, as RFC 9213 section 2.1 asks.
    pub fn targeted(headers: &HeaderMap) -> Option<Self> {
        TARGETED_FIELDS
            .iter()
            .find_map(|name| targeted_directives(headers, name).map(Self::from_directives))
    }

    fn from_directives(directives: Vec<(String, Option<String>)>) -> Self {
        let mut cc = Self::default();
        for (name, value) in directives {
            match name.as_str() {
                "no-store" => cc.no_store = true,
                "no-cache" => cc.no_cache = true,
                "private" => cc.private = true,
                "public" => cc.public = true,
                "must-revalidate" | "proxy-revalidate" => cc.must_revalidate = true,
                "must-understand" => cc.must_understand = true,
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

/// Targeted cache-control fields (RFC 9213) Inlay obeys, first wins:
/// `Inlay-Cache-Control` is for this cache alone (and is not forwarded to
/// clients); `CDN-Cache-Control` is for every CDN on the way, so it is
/// obeyed and also forwarded, for the CDNs in front of us.
pub const TARGETED_FIELDS: [&str; 2] = ["inlay-cache-control", "cdn-cache-control"];

/// The directives of the targeted field `name`, if it is present, a valid
/// dictionary, and not empty. Bounded: a field of more than 4 KiB is ignored.
fn targeted_directives(headers: &HeaderMap, name: &str) -> Option<Vec<(String, Option<String>)>> {
    let mut text = String::new();
    for v in headers.get_all(name) {
        if !text.is_empty() {
            text.push_str(", ");
        }
        text.push_str(v.to_str().ok()?);
    }
    if text.trim().is_empty() || text.len() > 4096 {
        return None;
    }
    let dict: sfv::Dictionary = sfv::Parser::new(&text).parse().ok()?;
    let mut out = Vec::with_capacity(dict.len());
    for (key, entry) in &dict {
        let key = key.as_str();
        let numeric = matches!(
            key,
            "max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error"
        );
        let sfv::ListEntry::Item(item) = entry else {
            if numeric {
                return None;
            }
            continue;
        };
        match (&item.bare_item, numeric) {
            (sfv::BareItem::Integer(n), true) => {
                let n = i64::from(*n);
                if n < 0 {
                    return None;
                }
                out.push((key.to_owned(), Some(n.to_string())));
            }
            (_, true) => return None,
            // Flags and extensions: a value (`no-cache="x"`) changes nothing
            // a shared cache does with them here.
            (_, false) => out.push((key.to_owned(), None)),
        }
    }
    (!out.is_empty()).then_some(out)
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

/// Statuses cached with `default_ttl` when the response says nothing
/// (Varnish's built-in list).
fn cacheable_by_default(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 304 | 404 | 410 | 414
    )
}

/// Heuristically cacheable statuses (RFC 9110 section 15.1), but 206:
/// partial responses are not stored.
fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Statuses whose caching semantics Inlay understands (for `must-understand`).
fn understood(status: StatusCode) -> bool {
    heuristically_cacheable(status) || matches!(status.as_u16(), 302 | 303 | 304 | 307)
}

/// Whether a response with explicit freshness may be stored: any final
/// status (RFC 9111 section 3) but 206, as partial responses are not stored.
fn cacheable_with_explicit_freshness(status: StatusCode) -> bool {
    status.as_u16() >= 200 && status != StatusCode::PARTIAL_CONTENT
}

/// Heuristic freshness is a tenth of the time since `Last-Modified` (RFC
/// 9111 section 4.2.2), at most a day.
const HEURISTIC_MAX: u64 = 24 * 3600;

/// The host's default decision for a backend response to a lookup request.
pub fn decide(
    status: StatusCode,
    headers: &HeaderMap,
    defaults: &Defaults,
    now: SystemTime,
) -> CacheSettings {
    let targeted = CacheControl::targeted(headers);
    let has_targeted = targeted.is_some();
    let cc = targeted.unwrap_or_else(|| CacheControl::parse(headers));
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
    let date = || {
        headers
            .get(header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(parse_http_date)
            .unwrap_or(now)
    };
    let explicit = sc.max_age.or(cc.s_maxage).or(cc.max_age);
    let from_expires = || {
        // RFC 9213: a targeted field replaces Expires too.
        if has_targeted {
            return None;
        }
        let expires = headers.get(header::EXPIRES)?.to_str().ok()?;
        // RFC 9111: an invalid Expires (for example "0") means already expired.
        let expires = parse_http_date(expires).unwrap_or(SystemTime::UNIX_EPOCH);
        Some(
            expires
                .duration_since(date())
                .map(|d| d.as_secs())
                .unwrap_or(0),
        )
    };
    let lifetime = explicit.or_else(from_expires);
    let heuristic = || {
        if !(heuristically_cacheable(status) || cc.public) {
            return None;
        }
        let lm = headers.get(header::LAST_MODIFIED)?.to_str().ok()?;
        let since = date().duration_since(parse_http_date(lm)?).ok()?;
        Some((since.as_secs() / 10).min(HEURISTIC_MAX))
    };
    let lifetime = match lifetime {
        Some(l) if cacheable_with_explicit_freshness(status) => l,
        Some(_) => return s,
        None => {
            let default = cacheable_by_default(status).then_some(defaults.ttl.as_secs());
            match (heuristic(), default) {
                // default_ttl stays the floor: Last-Modified only lengthens it.
                (Some(h), d) => h.max(d.unwrap_or(0)),
                (None, Some(d)) => d,
                (None, None) => return s,
            }
        }
    };
    let vary_star = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == "*");
    let no_store = if cc.must_understand {
        !understood(status)
    } else {
        cc.no_store
    };
    // Surrogate-Control speaks to us directly: its max-age overrides private / no-cache.
    let forbidden = sc.no_store
        || (sc.max_age.is_none() && (no_store || cc.private || cc.no_cache))
        || headers.contains_key(header::SET_COOKIE)
        || vary_star;
    if forbidden {
        return s;
    }
    s.ttl = Duration::from_secs(lifetime.saturating_sub(age(headers)));
    s.cacheable = true;
    if let Some(swr) = sc.stale.or(cc.stale_while_revalidate) {
        s.grace = Duration::from_secs(swr);
    }
    if forbids_stale_with(&cc, &sc) {
        s.grace = Duration::ZERO;
    }
    if let Some(sie) = cc.stale_if_error {
        s.keep = s.keep.max(Duration::from_secs(sie));
    }
    s
}

/// Whether a response's headers forbid serving it stale, in grace or when
/// the backend fails: `must-revalidate`, `proxy-revalidate` and `s-maxage`
/// (which implies `proxy-revalidate` for a shared cache, RFC 9111 section
/// 5.2.2.10), unless `Surrogate-Control` grants stale time itself. The
/// object is still kept for revalidation.
pub fn forbids_stale(headers: &HeaderMap) -> bool {
    let cc = CacheControl::targeted(headers).unwrap_or_else(|| CacheControl::parse(headers));
    forbids_stale_with(&cc, &SurrogateControl::parse(headers))
}

fn forbids_stale_with(cc: &CacheControl, sc: &SurrogateControl) -> bool {
    (cc.must_revalidate || cc.s_maxage.is_some()) && sc.stale.is_none()
}

/// The `Age` a response arrived with, in seconds (RFC 9111 section 5.1):
/// the first value of the first field; a value that is not a non-negative
/// integer is ignored (0), one too large is capped at 2^31.
pub fn age(headers: &HeaderMap) -> u64 {
    let Some(first) = headers.get(header::AGE).and_then(|a| a.to_str().ok()) else {
        return 0;
    };
    let first = first.split(',').next().unwrap_or_default();
    // A parameter (`7200;foo=bar`) does not hide the number.
    let first = first.split(';').next().unwrap_or_default();
    seconds(first.to_owned()).unwrap_or(0)
}

/// Parse an HTTP date: the three formats of RFC 9110 section 5.6.7, then
/// leniently (as RFC 9111 section 4.2 asks of Expires): any case, a wrong
/// weekday, one-digit days, two-digit years.
pub fn parse_http_date(s: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(s)
        .ok()
        .or_else(|| lenient_date(s))
}

/// IMF-fixdate, RFC 850 or asctime in their exact layout, but with letters
/// in any case and the weekday unchecked: RFC 9111 section 4.2 asks caches
/// to be lenient with Expires, and these are the slips the public suite
/// expects tolerated (not other zones, two-digit years or odd spacing).
fn lenient_date(s: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let s = s.trim().to_ascii_lowercase();
    if !s.is_ascii() {
        return None;
    }
    let num = |t: &str| -> Option<u64> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let month = |t: &str| MONTHS.iter().position(|m| *m == t).map(|m| m as u64 + 1);
    let time = |t: &str| -> Option<u64> {
        let b = t.as_bytes();
        if b.len() != 8 || b[2] != b':' || b[5] != b':' {
            return None;
        }
        let (h, m, sec) = (num(&t[0..2])?, num(&t[3..5])?, num(&t[6..8])?);
        (h < 24 && m < 60 && sec < 61).then_some(h * 3600 + m * 60 + sec)
    };
    let weekday = |t: &str| (3..=9).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_lowercase());
    let (day, mon, year, secs) = if let Some((wk, rest)) = s.split_once(", ") {
        if !weekday(wk) {
            return None;
        }
        let b = rest.as_bytes();
        match rest.len() {
            // 18 aug 2050 02:01:18 gmt
            24 if b[2] == b' ' && b[6] == b' ' && b[11] == b' ' && rest.ends_with(" gmt") => (
                num(&rest[0..2])?,
                month(&rest[3..6])?,
                num(&rest[7..11])?,
                time(&rest[12..20])?,
            ),
            // 18-aug-50 02:01:18 gmt
            22 if b[2] == b'-' && b[6] == b'-' && b[9] == b' ' && rest.ends_with(" gmt") => {
                let yy = num(&rest[7..9])?;
                (
                    num(&rest[0..2])?,
                    month(&rest[3..6])?,
                    if yy < 70 { 2000 + yy } else { 1900 + yy },
                    time(&rest[10..18])?,
                )
            }
            _ => return None,
        }
    } else {
        // thu aug  8 02:01:18 2050
        let b = s.as_bytes();
        if s.len() != 24 || b[3] != b' ' || b[7] != b' ' || b[10] != b' ' || b[19] != b' ' {
            return None;
        }
        if !weekday(&s[0..3]) {
            return None;
        }
        (
            num(s[8..10].trim_start())?,
            month(&s[4..7])?,
            num(&s[20..24])?,
            time(&s[11..19])?,
        )
    };
    if !(1..=31).contains(&day) || year < 1970 {
        return None;
    }
    // Days from 1970-01-01 to the date (the inverse of civil-from-days).
    let (y, m) = if mon <= 2 {
        (year - 1, mon + 9)
    } else {
        (year, mon - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(days * 86_400 + secs))
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

    #[test]
    fn age_counts_first_value_only_and_ignores_garbage() {
        let age_of = |vals: &[&str]| age(&h(&vals.iter().map(|v| ("age", *v)).collect::<Vec<_>>()));
        assert_eq!(age_of(&["7200, 0"]), 7200, "`old, 0` is old");
        assert_eq!(age_of(&["0, 7200"]), 0);
        assert_eq!(age_of(&["7200", "0"]), 7200);
        assert_eq!(age_of(&["7200;foo=bar"]), 7200);
        for garbage in ["abc", "-7200", "7200.0", ""] {
            assert_eq!(age_of(&[garbage]), 0, "{garbage:?}");
        }
        assert_eq!(age_of(&["99999999999"]), 2_147_483_648);
        let s = decide_ok(&[("cache-control", "max-age=3600"), ("age", "7200, 0")]);
        assert!(
            s.ttl.is_zero(),
            "a response older than its max-age is stale"
        );
    }

    #[test]
    fn revalidation_directives_forbid_stale_serving() {
        for cc in [
            "max-age=10, must-revalidate",
            "max-age=10, proxy-revalidate",
            "s-maxage=10",
            "max-age=10, stale-while-revalidate=60, must-revalidate",
        ] {
            let headers = h(&[("cache-control", cc)]);
            let s = decide(StatusCode::OK, &headers, &D, SystemTime::now());
            assert!(s.cacheable && s.grace.is_zero(), "{cc}: no grace");
            assert!(forbids_stale(&headers), "{cc}: no stale-if-error");
        }
        // Without them the defaults stand.
        let headers = h(&[("cache-control", "max-age=10")]);
        assert_eq!(
            decide(StatusCode::OK, &headers, &D, SystemTime::now()).grace,
            D.grace
        );
        assert!(!forbids_stale(&headers));
        // Surrogate-Control's own stale time speaks to us and wins.
        assert!(!forbids_stale(&h(&[
            ("cache-control", "s-maxage=10"),
            ("surrogate-control", "max-age=10+30"),
        ])));
        // immutable changes nothing: a stale immutable response is revalidated.
        let immutable = decide_ok(&[("cache-control", "max-age=10, immutable")]);
        assert_eq!(
            (immutable.ttl, immutable.grace),
            (Duration::from_secs(10), D.grace)
        );
    }

    #[test]
    fn targeted_fields_replace_cache_control_and_expires() {
        let future = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
        // CDN-Cache-Control wins, either way.
        let s = decide_ok(&[
            ("cache-control", "max-age=3600"),
            ("cdn-cache-control", "max-age=5"),
        ]);
        assert_eq!(s.ttl.as_secs(), 5);
        let s = decide_ok(&[
            ("cache-control", "max-age=5"),
            ("cdn-cache-control", "max-age=3600, foo=bar"),
        ]);
        assert_eq!(s.ttl.as_secs(), 3600);
        assert!(
            decide_ok(&[("cdn-cache-control", "max-age=0"), ("expires", &future)])
                .ttl
                .is_zero()
        );
        for d in ["private", "no-cache", "no-store"] {
            let s = decide_ok(&[
                ("cache-control", "max-age=3600"),
                ("expires", &future),
                ("cdn-cache-control", d),
            ]);
            assert!(!s.cacheable, "CDN-Cache-Control: {d}");
        }
        assert!(
            decide_ok(&[
                ("cache-control", "no-store"),
                ("cdn-cache-control", "max-age=60")
            ])
            .cacheable
        );
        // Inlay-Cache-Control is aimed at us alone and comes first.
        let s = decide_ok(&[
            ("cdn-cache-control", "no-store"),
            ("inlay-cache-control", "max-age=7"),
        ]);
        assert_eq!((s.cacheable, s.ttl.as_secs()), (true, 7));
        // An empty or invalid targeted field is not one (RFC 9213 2.1).
        for invalid in [
            "",
            "max-age=10000, &&&&&",
            "max-age=\"10000\"",
            "max-age=-1",
        ] {
            let s = decide_ok(&[
                ("cache-control", "max-age=9"),
                ("cdn-cache-control", invalid),
            ]);
            assert_eq!(s.ttl.as_secs(), 9, "{invalid:?}");
        }
        let s = decide_ok(&[
            ("cache-control", "max-age=9"),
            ("cdn-cache-control", "max-age=99999999999"),
        ]);
        assert_eq!(s.ttl.as_secs(), 2_147_483_648);
    }

    #[test]
    fn expires_is_parsed_leniently() {
        let now = SystemTime::now();
        let date = httpdate::fmt_http_date(now);
        let ttl = |exp: &str| {
            decide(
                StatusCode::OK,
                &h(&[("date", &date), ("expires", exp)]),
                &Defaults {
                    ttl: Duration::ZERO,
                    ..D
                },
                now,
            )
            .ttl
        };
        for exp in [
            "Thu Aug  8 02:01:18 2050",
            "THU, 18 Aug 2050 02:01:18 GMT",
            "Thu, 18 AUG 2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02:01:18 gMT",
            "Thursday, 18-Aug-50 02:01:18 GMT",
        ] {
            assert!(ttl(exp) > Duration::from_secs(3600 * 24 * 365), "{exp}");
        }
        assert_eq!(
            parse_http_date("thu, 01 jan 1970 00:01:00 gmt"),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(60))
        );
        assert_eq!(
            parse_http_date("Mon, 29 Feb 2016 12:00:00 GMT"),
            httpdate::parse_http_date("Mon, 29 Feb 2016 12:00:00 GMT").ok()
        );
        for bad in [
            "0",
            "",
            "soon",
            "Thu, 99 Aug 2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 25:00:00 GMT",
            "Thu, 18 Aug 2050 02:01:18 UTC",
            "Thu, 18 Aug 2050 02:01:18 AEST",
            "Thu, 18 Aug 50 02:01:18 GMT",
            "Thu 18 Aug 2050 02:01:18 GMT",
            "Thu, 18  Aug  2050 02:01:18 GMT",
            "Thu, 18-Aug-2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02.01.18 GMT",
            "Thu, 18 Aug 2050 2:01:18 GMT",
            "Thü, 18 Aug 2050 02:01:18 GMT",
        ] {
            assert!(ttl(bad).is_zero(), "{bad:?} means already expired");
        }
    }

    #[test]
    fn statuses_with_explicit_or_heuristic_freshness() {
        let now = SystemTime::now();
        let no_default = Defaults {
            ttl: Duration::ZERO,
            ..D
        };
        let with = |status: u16, pairs: &[(&str, &str)], d: &Defaults| {
            decide(StatusCode::from_u16(status).unwrap(), &h(pairs), d, now)
        };
        for status in [299, 303, 400, 499, 500, 502, 503, 504, 599] {
            let s = with(status, &[("cache-control", "max-age=60")], &D);
            assert!(s.cacheable && s.ttl.as_secs() == 60, "{status}");
            assert!(
                !with(status, &[], &D).cacheable,
                "{status} without freshness"
            );
        }
        assert!(!with(206, &[("cache-control", "max-age=60")], &D).cacheable);
        // A tenth of the time since Last-Modified, for heuristically cacheable statuses.
        let date = httpdate::fmt_http_date(now);
        let lm = httpdate::fmt_http_date(now - Duration::from_secs(100_000));
        let pairs = [("date", date.as_str()), ("last-modified", lm.as_str())];
        for status in [200, 203, 204, 404, 405, 410, 414, 501] {
            let s = with(status, &pairs, &no_default);
            assert_eq!((s.cacheable, s.ttl.as_secs()), (true, 10_000), "{status}");
        }
        assert!(!with(599, &pairs, &no_default).cacheable);
        let public = [pairs[0], pairs[1], ("cache-control", "public")];
        assert_eq!(with(599, &public, &no_default).ttl.as_secs(), 10_000);
        // default_ttl stays the floor; the heuristic is capped at a day.
        let recent = httpdate::fmt_http_date(now - Duration::from_secs(100));
        assert_eq!(
            with(200, &[("date", &date), ("last-modified", &recent)], &D).ttl,
            D.ttl
        );
        let old = httpdate::fmt_http_date(now - Duration::from_secs(100_000_000));
        assert_eq!(
            with(200, &[("date", &date), ("last-modified", &old)], &D)
                .ttl
                .as_secs(),
            HEURISTIC_MAX
        );
    }

    #[test]
    fn must_understand_lets_understood_statuses_ignore_no_store() {
        let cc = [("cache-control", "max-age=60, no-store, must-understand")];
        assert!(decide_ok(&cc).cacheable);
        assert!(
            !decide(
                StatusCode::from_u16(299).unwrap(),
                &h(&cc),
                &D,
                SystemTime::now()
            )
            .cacheable
        );
        assert!(!decide_ok(&[("cache-control", "max-age=60, no-store")]).cacheable);
    }

    proptest! {
        #[test]
        fn any_header_text_parses_without_panic(cc in ".{0,80}", sc in ".{0,80}") {
            let mut m = HeaderMap::new();
            if let Ok(v) = cc.parse() { m.insert(header::CACHE_CONTROL, v); }
            if let Ok(v) = sc.parse() { m.insert("surrogate-control", v); }
            if let Ok(v) = cc.parse() { m.insert("cdn-cache-control", v); }
            if let Ok(v) = sc.parse() { m.insert(header::EXPIRES, v); }
            if let Ok(v) = cc.parse() { m.insert(header::AGE, v); }
            let _ = decide(StatusCode::OK, &m, &D, SystemTime::now());
        }
    }
}

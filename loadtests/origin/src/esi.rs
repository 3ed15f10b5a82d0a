//! ESI pages and fragments with controllable delays, nesting and
//! cacheability, for the ESI processor's tests and benchmarks.

use std::fmt::Write;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{HeaderMap, Response};

use crate::body::OriginBody;
use crate::query::{BadRequest, Params};

/// Most includes one page may ask for.
pub const MAX_FRAGMENTS: u64 = 10_000;
/// Deepest fragment nesting one page may ask for.
pub const MAX_NESTED: u64 = 16;

/// The knobs a page hands down to its fragments.
struct FragmentKnobs {
    delay_ms: u64,
    nested: u64,
    cacheable: bool,
    jitter_ms: u64,
    n: u64,
}

impl FragmentKnobs {
    fn from_params(p: &Params<'_>, default_n: u64) -> Result<Self, BadRequest> {
        Ok(Self {
            delay_ms: p.millis("delay_ms")?.map_or(0, |d| d.as_millis() as u64),
            nested: p.u64("nested", MAX_NESTED)?.unwrap_or(0),
            cacheable: p.flag("cacheable")?.unwrap_or(true),
            jitter_ms: p.millis("jitter_ms")?.map_or(0, |d| d.as_millis() as u64),
            n: p.u64("n", MAX_FRAGMENTS)?.unwrap_or(default_n),
        })
    }

    /// Writes `<esi:include src="/esi/fragment/{id}?..."/>`.
    fn write_include(&self, out: &mut String, id: &str, delay_ms: u64, fail: bool) {
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "<esi:include src=\"/esi/fragment/{id}?delay_ms={delay_ms}&nested={}&cacheable={}",
            self.nested,
            u8::from(self.cacheable)
        );
        if self.jitter_ms > 0 {
            let _ = write!(out, "&jitter_ms={}&n={}", self.jitter_ms, self.n);
        }
        if fail {
            out.push_str("&status=500");
        }
        out.push_str("\"/>");
    }
}

fn html_headers(headers: &mut HeaderMap, cacheable: bool, esi: bool) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if cacheable {
            "max-age=60"
        } else {
            "no-store, private"
        }),
    );
    if esi {
        headers.insert(
            "surrogate-control",
            HeaderValue::from_static("content=\"ESI/1.0\""),
        );
    }
}

/// `GET /esi/page`: `n` includes of `/esi/fragment/{i}` between text.
///
/// Knobs: `n` (default 3), `delay_ms` (each fragment's delay), `delays`
/// (per-fragment delays, overriding `delay_ms` for the first ones),
/// `jitter_ms`, `nested`, `cacheable` (page and fragments), `fail` (indexes
/// of fragments that answer 500).
pub fn page(p: &Params<'_>) -> Result<Response<OriginBody>, BadRequest> {
    let n = p.u64("n", MAX_FRAGMENTS)?.unwrap_or(3);
    let knobs = FragmentKnobs::from_params(p, n)?;
    let knobs = FragmentKnobs { n, ..knobs };
    let delays = p.millis_list("delays")?;
    let fail = parse_indexes(p.get("fail"))?;

    let mut html = String::with_capacity(256 + n as usize * 160);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html><head><title>ESI test page</title></head><body>\n\
         <h1>ESI test page with {n} fragments</h1>\n"
    );
    for i in 0..n {
        let _ = writeln!(html, "<p class=\"text\">text before fragment {i}</p>");
        let delay = delays.get(i as usize).copied().unwrap_or(knobs.delay_ms);
        knobs.write_include(&mut html, &i.to_string(), delay, fail.contains(&i));
        html.push('\n');
    }
    html.push_str("<p class=\"text\">end of page</p>\n</body></html>\n");

    let mut resp = Response::new(OriginBody::full(html));
    html_headers(resp.headers_mut(), knobs.cacheable, true);
    Ok(resp)
}

fn parse_indexes(raw: Option<&str>) -> Result<Vec<u64>, BadRequest> {
    raw.unwrap_or("")
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| BadRequest(format!("fail: {s:?} is not a fragment index")))
        })
        .collect()
}

/// Fragment ids are path segments such as `3` or `3.1.0` (nested).
pub fn check_fragment_id(id: &str) -> Result<(), BadRequest> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(BadRequest(format!(
            "fragment id {id:?}: use letters, digits, '.', '-', '_'"
        )))
    }
}

/// How long fragment `id` waits before answering: `delay_ms` plus the
/// deterministic jitter `(i mod n) * jitter_ms / n`, `i` being the id's
/// leading number.
pub fn fragment_delay(id: &str, p: &Params<'_>) -> Result<Duration, BadRequest> {
    let knobs = FragmentKnobs::from_params(p, 1)?;
    let index: u64 = id
        .split('.')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // n=0 means no page context: no jitter.
    let jitter = (index.checked_rem(knobs.n).unwrap_or(0) * knobs.jitter_ms)
        .checked_div(knobs.n)
        .unwrap_or(0);
    Ok(Duration::from_millis(knobs.delay_ms + jitter))
}

/// `GET /esi/fragment/{id}`: a small HTML fragment naming `id`; with
/// `nested=K>0` it is itself ESI and includes `/esi/fragment/{id}.{K-1}`.
pub fn fragment(id: &str, p: &Params<'_>) -> Result<Response<OriginBody>, BadRequest> {
    check_fragment_id(id)?;
    let knobs = FragmentKnobs::from_params(p, 1)?;
    let mut html = String::with_capacity(192);
    let _ = write!(
        html,
        "<div class=\"fragment\" data-id=\"{id}\">fragment {id}"
    );
    if knobs.nested > 0 {
        let child = FragmentKnobs {
            nested: knobs.nested - 1,
            ..knobs
        };
        html.push(' ');
        child.write_include(
            &mut html,
            &format!("{id}.{}", child.nested),
            child.delay_ms,
            false,
        );
    }
    html.push_str("</div>\n");

    let mut resp = Response::new(OriginBody::full(html));
    html_headers(resp.headers_mut(), knobs.cacheable, knobs.nested > 0);
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn text(resp: Response<OriginBody>) -> String {
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn page_lists_includes_with_per_fragment_delays_and_failures() {
        let p = Params::parse(Some("n=3&delay_ms=10&delays=300,5&fail=1&cacheable=0"));
        let resp = page(&p).expect("page");
        assert_eq!(resp.headers()["surrogate-control"], "content=\"ESI/1.0\"");
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store, private");
        let html = text(resp).await;
        assert!(html.contains("src=\"/esi/fragment/0?delay_ms=300&nested=0&cacheable=0\""));
        assert!(
            html.contains("src=\"/esi/fragment/1?delay_ms=5&nested=0&cacheable=0&status=500\"")
        );
        assert!(html.contains("src=\"/esi/fragment/2?delay_ms=10&nested=0&cacheable=0\""));
        assert_eq!(html.matches("<esi:include").count(), 3);
    }

    #[tokio::test]
    async fn nested_fragment_includes_its_child() {
        let p = Params::parse(Some("nested=2&delay_ms=7"));
        let resp = fragment("4", &p).expect("fragment");
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "max-age=60");
        assert!(resp.headers().contains_key("surrogate-control"));
        let html = text(resp).await;
        assert!(html.starts_with("<div class=\"fragment\" data-id=\"4\">fragment 4 "));
        assert!(html.contains("src=\"/esi/fragment/4.1?delay_ms=7&nested=1&cacheable=1\""));
    }

    #[test]
    fn leaf_fragment_is_not_esi_and_ids_are_checked() {
        let resp = fragment("4.1.0", &Params::default()).expect("fragment");
        assert!(!resp.headers().contains_key("surrogate-control"));
        assert!(fragment("a/b", &Params::default()).is_err());
        assert!(fragment("", &Params::default()).is_err());
        assert!(page(&Params::parse(Some("fail=x"))).is_err());
    }

    #[test]
    fn jitter_is_deterministic_and_bounded() {
        let p = Params::parse(Some("delay_ms=100&jitter_ms=40&n=4"));
        let delays: Vec<u128> = ["0", "1", "3", "3.0", "5"]
            .iter()
            .map(|id| fragment_delay(id, &p).expect("delay").as_millis())
            .collect();
        assert_eq!(delays, [100, 110, 130, 130, 110]);
    }
}

//! Compression at the edge: which responses Inlay compresses, the codings
//! it makes (gzip, br, zstd), and the body of several codings a fill
//! stores once, so that a hit costs no compression.
//!
//! Which coding a client gets is chosen in one place, by
//! [`ContentCodings`](crate::ContentCodings) (`cache.accept_encoding`):
//! Inlay makes the codings of that list it knows ([`Coding`]), in its order.

mod codec;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode, header};

pub use codec::{DECODE_OUT, DECODE_STEP, decode_stream, encode, encode_stream};

use crate::ContentCodings;

/// A content coding Inlay can make and read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coding {
    /// `gzip` (RFC 9110 section 8.4.1.3).
    Gzip,
    /// `br`, Brotli (RFC 7932).
    Br,
    /// `zstd`, Zstandard (RFC 8878, RFC 9659).
    Zstd,
}

impl Coding {
    /// Every coding, in no particular order.
    pub const ALL: [Coding; 3] = [Coding::Gzip, Coding::Br, Coding::Zstd];

    /// The coding's name, as `Content-Encoding` and `Accept-Encoding` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }

    /// The coding a name stands for, without case (`x-gzip` is gzip);
    /// `None` for `identity` and codings Inlay does not know.
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim();
        [("gzip", Coding::Gzip), ("x-gzip", Coding::Gzip)]
            .into_iter()
            .chain([("br", Coding::Br), ("zstd", Coding::Zstd)])
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, c)| c)
    }

    /// The coding of a response's body as its `Content-Encoding` says:
    /// `Ok(None)` for none (or `identity`), `Err` for one Inlay cannot
    /// read (an unknown coding, or several).
    pub fn of_response(headers: &HeaderMap) -> Result<Option<Self>, UnreadableCoding> {
        let mut codings = headers
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .flat_map(|v| v.to_str().map(|s| s.split(',')).into_iter().flatten())
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"));
        let Some(first) = codings.next() else {
            return Ok(None);
        };
        match (Self::from_name(first), codings.next()) {
            (Some(c), None) => Ok(Some(c)),
            _ => Err(UnreadableCoding),
        }
    }
}

/// A `Content-Encoding` Inlay cannot decode: a coding it does not know, or
/// several applied one over another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a Content-Encoding Inlay cannot decode")]
pub struct UnreadableCoding;

/// A compression level for each coding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    /// gzip, 1 to 9.
    pub gzip: i32,
    /// br, 0 to 11.
    pub br: i32,
    /// zstd, 1 to 19.
    pub zstd: i32,
}

impl Levels {
    /// The level of `coding`.
    pub fn of(&self, coding: Coding) -> i32 {
        match coding {
            Coding::Gzip => self.gzip,
            Coding::Br => self.br,
            Coding::Zstd => self.zstd,
        }
    }
}

/// One entry of the compressible media types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MediaPattern {
    /// `type/subtype`.
    Exact(String),
    /// `type/*`.
    AnySubtype(String),
    /// `+suffix`: a structured syntax suffix on any type (`+json`, `+xml`).
    Suffix(String),
}

impl MediaPattern {
    /// Parses `type/subtype`, `type/*` or `+suffix` (lower-cased); an
    /// error says what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        let token = |t: &str| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
        };
        if let Some(suffix) = s.strip_prefix('+') {
            return match token(suffix) {
                true => Ok(MediaPattern::Suffix(format!("+{suffix}"))),
                false => Err(format!("{s:?} is not a +suffix")),
            };
        }
        match s.split_once('/') {
            Some((t, "*")) if token(t) => Ok(MediaPattern::AnySubtype(format!("{t}/"))),
            Some((t, sub)) if token(t) && token(sub) => Ok(MediaPattern::Exact(s)),
            _ => Err(format!(
                "{s:?} is not a media type (type/subtype, type/* or +suffix)"
            )),
        }
    }

    /// Whether `essence` (in any case; patterns are lower case) matches.
    fn matches(&self, essence: &str) -> bool {
        let e = essence.as_bytes();
        match self {
            MediaPattern::Exact(t) => e.eq_ignore_ascii_case(t.as_bytes()),
            MediaPattern::AnySubtype(prefix) => e
                .get(..prefix.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(prefix.as_bytes())),
            MediaPattern::Suffix(s) => e
                .len()
                .checked_sub(s.len())
                .is_some_and(|at| e[at..].eq_ignore_ascii_case(s.as_bytes())),
        }
    }
}

/// The media types compressed by default (`compression.types`): text,
/// scripts, JSON, XML (SVG and the `+json`/`+xml` types), wasm and the
/// uncompressed font formats. Images, video, archives and woff2 are
/// compressed already and are not listed.
pub const DEFAULT_TYPES: [&str; 12] = [
    "text/*",
    "application/javascript",
    "application/x-javascript",
    "application/json",
    "application/xml",
    "application/wasm",
    "+json",
    "+xml",
    "font/ttf",
    "font/otf",
    "application/vnd.ms-fontobject",
    "image/x-icon",
];

/// What the cache compresses and how (`[compression]`).
#[derive(Clone, Debug)]
pub struct CompressionRules {
    /// The media types compressed.
    pub types: Arc<[MediaPattern]>,
    /// Bodies shorter than this are left alone.
    pub min_size: u64,
    /// Levels of the codings a fill stores, made once per object.
    pub store_levels: Levels,
    /// Levels of the codings made as a response streams (pass, misses,
    /// ESI pages), once per response.
    pub stream_levels: Levels,
}

impl CompressionRules {
    /// Whether a response with `status` and `headers` is one Inlay
    /// compresses: a body of a listed type, not encoded already, not
    /// forbidden (`Cache-Control: no-transform`, RFC 9110 section 7.7),
    /// not a part (206 or `Content-Range`), and not declared shorter than
    /// `min_size`. An event stream is never compressed.
    pub fn applies(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        if status.is_informational()
            || matches!(status.as_u16(), 204 | 205 | 206 | 304)
            || !matches!(Coding::of_response(headers), Ok(None))
            || headers.contains_key(header::CONTENT_RANGE)
            || no_transform(headers)
        {
            return false;
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n < self.min_size) {
            return false;
        }
        let Some(essence) = media_type(headers) else {
            return false;
        };
        !essence.eq_ignore_ascii_case("text/event-stream")
            && self.types.iter().any(|t| t.matches(essence))
    }
}

/// Whether `Cache-Control` has `no-transform` (RFC 9111 section 5.2: a
/// response's, or a request's, which asks for it as it is).
pub fn no_transform(headers: &HeaderMap) -> bool {
    const DIRECTIVE: &[u8] = b"no-transform";
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .map(|v| v.as_bytes())
        // Asked of every response: most values lack the word, which a
        // byte scan tells before any split.
        .filter(|v| {
            v.windows(DIRECTIVE.len())
                .any(|w| w.eq_ignore_ascii_case(DIRECTIVE))
        })
        .flat_map(|v| v.split(|&b| b == b','))
        .any(|d| d.trim_ascii().eq_ignore_ascii_case(DIRECTIVE))
}

/// The `type/subtype` of `Content-Type`, without parameters (in the case
/// it came in: media types compare without case).
fn media_type(headers: &HeaderMap) -> Option<&str> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = ct.split(';').next()?.trim_ascii();
    (!essence.is_empty()).then_some(essence)
}

/// The codings of `preferred` that Inlay makes, in its order.
pub fn made_codings(preferred: &ContentCodings) -> Vec<Coding> {
    let mut out: Vec<Coding> = Vec::new();
    for c in preferred
        .preferred()
        .iter()
        .filter_map(|c| Coding::from_name(c))
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// The name under which the identity body is stored beside its codings.
pub const IDENTITY: &str = "identity";

/// The body a fill stores for `identity`: the identity body followed by
/// each coding of `codings` made at `levels`, and the
/// [`ObjectMeta::codings`](inlay_storage::ObjectMeta::codings) that say
/// where each lies. A coding whose encoding fails, or that would make the
/// whole longer than `max_len`, is left out; with none made, the identity
/// body alone and no codings. CPU-bound: run it on a blocking thread.
pub fn store_codings(
    identity: &Bytes,
    codings: &[Coding],
    levels: &Levels,
    max_len: u64,
) -> (Bytes, Vec<(String, u64)>) {
    let mut made: Vec<(Coding, Vec<u8>)> = Vec::new();
    let mut total = identity.len() as u64;
    for &c in codings {
        match encode(c, levels.of(c), identity) {
            // Not worth keeping when it saves nothing.
            Ok(out) if out.len() >= identity.len() => {}
            Ok(out) if total + out.len() as u64 <= max_len => {
                total += out.len() as u64;
                made.push((c, out));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(coding = c.name(), error = %e, "could not encode a body"),
        }
    }
    if made.is_empty() {
        return (identity.clone(), Vec::new());
    }
    let mut body = BytesMut::with_capacity(usize::try_from(total).unwrap_or(0));
    body.extend_from_slice(identity);
    let mut index = vec![(IDENTITY.to_owned(), identity.len() as u64)];
    for (c, out) in made {
        body.extend_from_slice(&out);
        index.push((c.name().to_owned(), out.len() as u64));
    }
    (body.freeze(), index)
}

/// The identity body of a stored object: the part stored as `identity`
/// when it holds several codings, else the whole body.
pub fn identity_body(obj: &inlay_storage::StoredObject) -> Bytes {
    obj.coding(IDENTITY).unwrap_or_else(|| obj.body.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> CompressionRules {
        CompressionRules {
            types: DEFAULT_TYPES
                .iter()
                .map(|t| MediaPattern::parse(t).unwrap())
                .collect(),
            min_size: 1024,
            store_levels: Levels {
                gzip: 6,
                br: 9,
                zstd: 9,
            },
            stream_levels: Levels {
                gzip: 3,
                br: 4,
                zstd: 3,
            },
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn compressible_types_and_the_responses_left_alone() {
        let r = rules();
        let ok = StatusCode::OK;
        for ct in [
            "text/html; charset=utf-8",
            "TEXT/CSS",
            "application/javascript",
            "application/json",
            "application/ld+json",
            "image/svg+xml",
            "application/wasm",
        ] {
            assert!(r.applies(ok, &headers(&[("content-type", ct)])), "{ct}");
        }
        for ct in [
            "image/png",
            "image/jpeg",
            "video/mp4",
            "application/zip",
            "font/woff2",
            "application/octet-stream",
            "text/event-stream",
        ] {
            assert!(!r.applies(ok, &headers(&[("content-type", ct)])), "{ct}");
        }
        let html = ("content-type", "text/html");
        assert!(!r.applies(ok, &headers(&[])), "no type");
        assert!(!r.applies(ok, &headers(&[html, ("content-encoding", "gzip")])));
        assert!(r.applies(ok, &headers(&[html, ("content-encoding", "identity")])));
        assert!(!r.applies(
            ok,
            &headers(&[html, ("cache-control", "public, no-transform")])
        ));
        for cc in [
            "NO-TRANSFORM",
            " no-transform ,max-age=1",
            "max-age=1,no-transform",
        ] {
            assert!(
                !r.applies(ok, &headers(&[html, ("cache-control", cc)])),
                "{cc}"
            );
        }
        for cc in [
            "no-transformx",
            "x-no-transform",
            "max-age=60",
            "\"no-transform\"",
        ] {
            assert!(
                r.applies(ok, &headers(&[html, ("cache-control", cc)])),
                "{cc}"
            );
        }
        assert!(r.applies(
            ok,
            &headers(&[("content-type", " text/html ; charset=utf-8")])
        ));
        assert!(!r.applies(ok, &headers(&[html, ("content-length", "1023")])));
        assert!(r.applies(ok, &headers(&[html, ("content-length", "1024")])));
        assert!(!r.applies(StatusCode::PARTIAL_CONTENT, &headers(&[html])));
        assert!(!r.applies(StatusCode::NO_CONTENT, &headers(&[html])));
        assert!(r.applies(StatusCode::NOT_FOUND, &headers(&[html])));
        assert!(!r.applies(ok, &headers(&[html, ("content-range", "bytes 0-1/2")])));
    }

    #[test]
    fn media_patterns_parse_or_say_why_not() {
        assert_eq!(
            MediaPattern::parse("Text/*"),
            Ok(MediaPattern::AnySubtype("text/".into()))
        );
        assert_eq!(
            MediaPattern::parse("+json"),
            Ok(MediaPattern::Suffix("+json".into()))
        );
        for bad in ["", "text", "*/*", "text/ html", "+", "/json"] {
            assert!(MediaPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn response_codings_are_read_or_refused() {
        let of = |v: &str| Coding::of_response(&headers(&[("content-encoding", v)]));
        assert_eq!(Coding::of_response(&HeaderMap::new()), Ok(None));
        assert_eq!(of("identity"), Ok(None));
        assert_eq!(of("X-Gzip"), Ok(Some(Coding::Gzip)));
        assert_eq!(of("br"), Ok(Some(Coding::Br)));
        assert_eq!(of("deflate"), Err(UnreadableCoding));
        assert_eq!(of("gzip, br"), Err(UnreadableCoding));
    }

    #[test]
    fn a_stored_body_holds_identity_then_each_coding_that_saves_bytes() {
        let text = Bytes::from("<p>hello edge</p>\n".repeat(500));
        let levels = rules().store_levels;
        let (body, index) = store_codings(&text, &[Coding::Br, Coding::Gzip], &levels, u64::MAX);
        let names: Vec<&str> = index.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["identity", "br", "gzip"]);
        assert_eq!(index.iter().map(|(_, n)| n).sum::<u64>(), body.len() as u64);
        assert_eq!(&body[..text.len()], &text[..]);
        // Past the bound, the codings that do not fit are left out.
        let (body, index) = store_codings(&text, &[Coding::Br], &levels, text.len() as u64 + 10);
        assert!(index.is_empty());
        assert_eq!(body, text);
        // Random bytes do not shrink: nothing but identity is kept.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let (_, index) = store_codings(&Bytes::from(noise), &[Coding::Gzip], &levels, u64::MAX);
        assert!(index.is_empty());
    }
}

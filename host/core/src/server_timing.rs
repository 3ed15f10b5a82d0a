//! `Server-Timing` (W3C Server Timing): where a request's time went, for
//! the requests where `server.server_timing` or the policy turned it on.
//!
//! The response head carries the phases (`recv`, `lookup`, `fetch`,
//! `deliver`, each `name;dur=ms`) and `cache;desc="hit"`. An ESI page's
//! head goes out before its includes finish, so each include's entry
//! (`esi-inc;dur=ms;desc="/src hit"`, `esi-err`, `esi-omit`) goes in an
//! HTTP trailer, where the client can take trailers: HTTP/2, or HTTP/1.1
//! when the request said `TE: trailers`. At most [`MAX_INCLUDE_ENTRIES`]
//! include entries are kept (then `esi-more;desc="N more"`); every
//! description is a quoted string of at most [`MAX_DESC_LEN`] bytes.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::body::{self, BoxError, ProxyBody};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Version, header};
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;

/// The response field.
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// The request field a policy sets (to `1`) in `on-request` to turn
/// Server-Timing on for that request. A client's is removed before the
/// policy runs, and it never reaches a backend.
pub const REQUEST_FLAG: HeaderName = HeaderName::from_static("inlay-server-timing");

/// Include entries kept per page; the rest are counted in `esi-more`.
pub const MAX_INCLUDE_ENTRIES: usize = 64;

/// Longest description, in bytes (longer ones are cut).
pub const MAX_DESC_LEN: usize = 100;

/// Whether the policy turned Server-Timing on for this request (its
/// `on-request` set [`REQUEST_FLAG`] to `1`). The field is removed either
/// way, so that it never reaches a backend.
pub fn take_request_flag(headers: &mut HeaderMap) -> bool {
    // One removal, which gives the (first) value.
    headers
        .remove(REQUEST_FLAG)
        .is_some_and(|v| v.as_bytes().trim_ascii() == b"1")
}

/// Whether the response to a request of this version and (client) fields
/// can carry trailers: HTTP/2 always; HTTP/1.1 when the client sent
/// `TE: trailers` (hyper sends none otherwise, and the response must be
/// chunked).
pub fn trailers_allowed(version: Version, headers: &HeaderMap) -> bool {
    match version {
        Version::HTTP_2 | Version::HTTP_3 => true,
        Version::HTTP_11 => headers
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
            }),
        _ => false,
    }
}

/// Milliseconds with a tenth, as `dur` takes them.
fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// `s` as a quoted-string (RFC 9110 5.6.4): `"` and `\` escaped, bytes
/// that are not visible ASCII or space replaced by `?`, cut to
/// [`MAX_DESC_LEN`] bytes.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_DESC_LEN) + 2);
    out.push('"');
    for c in s.chars().take(MAX_DESC_LEN) {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// An include's src as shown: without its query (which may carry tokens)
/// or fragment.
fn shown_src(src: &str) -> &str {
    src.split(['?', '#']).next().unwrap_or("")
}

/// The head entries of one request.
#[derive(Debug, Default)]
pub struct Timing {
    entries: Vec<String>,
}

impl Timing {
    /// A phase that took `dur`.
    pub fn phase(&mut self, name: &str, dur: Duration) {
        self.entries.push(format!("{name};dur={}", ms(dur)));
    }

    /// How the cache served it (the access log's `cache` value).
    pub fn cache(&mut self, status: &str) {
        self.entries.push(format!("cache;desc={}", quoted(status)));
    }

    /// The `Server-Timing` value, if there is an entry.
    pub fn header_value(&self) -> Option<HeaderValue> {
        if self.entries.is_empty() {
            return None;
        }
        HeaderValue::from_str(&self.entries.join(", ")).ok()
    }
}

/// An ESI page's include entries, written while it is assembled and read
/// when its body ends.
#[derive(Debug, Default)]
pub struct IncludeTimings {
    entries: Mutex<Vec<String>>,
    more: AtomicUsize,
}

impl IncludeTimings {
    /// An include answered (`status` is how the cache served it, with the
    /// HTTP status when it is not 2xx) after `dur`.
    pub fn fetched(&self, src: &str, dur: Duration, status: &str) {
        self.push(|| {
            format!(
                "esi-inc;dur={};desc={}",
                ms(dur),
                quoted(&format!("{} {status}", shown_src(src)))
            )
        });
    }

    /// An include's fetch failed after `dur` (its `alt` may still be tried).
    pub fn failed(&self, src: &str, dur: Duration, reason: &str) {
        self.push(|| {
            format!(
                "esi-err;dur={};desc={}",
                ms(dur),
                quoted(&format!("{} {reason}", shown_src(src)))
            )
        });
    }

    /// An include left out of the page, and why.
    pub fn omitted(&self, src: &str, reason: &str) {
        self.push(|| {
            format!(
                "esi-omit;desc={}",
                quoted(&format!("{} {reason}", shown_src(src)))
            )
        });
    }

    fn push(&self, entry: impl FnOnce() -> String) {
        let mut entries = self.entries.lock();
        if entries.len() < MAX_INCLUDE_ENTRIES {
            entries.push(entry());
        } else {
            self.more.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The trailer's `Server-Timing` value, if there is an entry.
    pub fn trailer_value(&self) -> Option<HeaderValue> {
        let mut entries = self.entries.lock().clone();
        let more = self.more.load(Ordering::Relaxed);
        if more > 0 {
            entries.push(format!("esi-more;desc=\"{more} more\""));
        }
        if entries.is_empty() {
            return None;
        }
        HeaderValue::from_str(&entries.join(", ")).ok()
    }
}

/// `resp_body` followed by a trailer with the include entries (none when
/// there are no entries).
pub fn with_trailer(resp_body: ProxyBody, includes: Arc<IncludeTimings>) -> ProxyBody {
    body::boxed(WithTrailer {
        inner: resp_body,
        includes: Some(includes),
    })
}

pin_project_lite::pin_project! {
    struct WithTrailer {
        #[pin]
        inner: ProxyBody,
        // Taken when the trailer is sent.
        includes: Option<Arc<IncludeTimings>>,
    }
}

impl Body for WithTrailer {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if this.includes.is_none() {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(None) => {
                let value = this.includes.take().and_then(|t| t.trailer_value());
                Poll::Ready(value.map(|v| {
                    let mut trailers = HeaderMap::new();
                    trailers.insert(SERVER_TIMING, v);
                    Ok(Frame::trailers(trailers))
                }))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.includes.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[test]
    fn descriptions_are_quoted_strings_and_bounded() {
        assert_eq!(quoted("a \"b\" \\c"), r#""a \"b\" \\c""#);
        assert_eq!(quoted("caf\u{e9}\r\n"), "\"caf???\"");
        assert_eq!(quoted(&"x".repeat(500)).len(), MAX_DESC_LEN + 2);
        let t = IncludeTimings::default();
        t.fetched("/frag?token=secret", Duration::from_micros(1500), "hit");
        t.omitted("/bad\"\r\n", "status 404");
        let v = t.trailer_value().unwrap();
        assert_eq!(
            v.to_str().unwrap(),
            r#"esi-inc;dur=1.5;desc="/frag hit", esi-omit;desc="/bad\"?? status 404""#
        );
    }

    #[test]
    fn include_entries_are_capped_and_the_rest_counted() {
        let t = IncludeTimings::default();
        for i in 0..MAX_INCLUDE_ENTRIES + 10 {
            t.fetched(&format!("/f{i}"), Duration::ZERO, "miss");
        }
        let v = t.trailer_value().unwrap();
        let v = v.to_str().unwrap();
        assert_eq!(v.matches("esi-inc").count(), MAX_INCLUDE_ENTRIES);
        assert!(v.ends_with("esi-more;desc=\"10 more\""), "{v}");
    }

    #[test]
    fn the_request_flag_is_taken_only_when_it_says_1() {
        let mut h = HeaderMap::new();
        assert!(!take_request_flag(&mut h));
        h.insert(REQUEST_FLAG, HeaderValue::from_static("0"));
        assert!(!take_request_flag(&mut h));
        assert!(h.is_empty(), "removed either way");
        h.insert(REQUEST_FLAG, HeaderValue::from_static(" 1"));
        assert!(take_request_flag(&mut h));
        assert!(h.is_empty());
    }

    #[test]
    fn trailers_only_where_the_client_takes_them() {
        let mut te = HeaderMap::new();
        assert!(trailers_allowed(Version::HTTP_2, &te));
        assert!(!trailers_allowed(Version::HTTP_11, &te));
        te.insert(header::TE, HeaderValue::from_static("gzip, Trailers;q=1"));
        assert!(trailers_allowed(Version::HTTP_11, &te));
        assert!(!trailers_allowed(Version::HTTP_10, &te));
    }

    #[tokio::test]
    async fn the_trailer_follows_the_body() {
        let t = Arc::new(IncludeTimings::default());
        let b = with_trailer(body::full("page"), t.clone());
        t.fetched("/f", Duration::ZERO, "hit");
        let collected = b.collect().await.unwrap();
        assert_eq!(
            collected.trailers().unwrap()[SERVER_TIMING],
            "esi-inc;dur=0.0;desc=\"/f hit\""
        );
        assert_eq!(collected.to_bytes(), "page");
        let empty = with_trailer(body::full("page"), Arc::default());
        assert!(empty.collect().await.unwrap().trailers().is_none());
    }
}

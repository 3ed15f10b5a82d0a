//! The ESI engine through its public API only, as the host uses it: a
//! fetcher implemented outside the crate, a streamed page, request variables.
//!
//! Run: `cargo test -p inlay-esi --test public_api`

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::{HeaderMap, HeaderValue};
use inlay_esi::{
    BoxError, EsiError, EsiLimits, EsiVars, FailureReason, Fetch, Fragment, FragmentError,
    FragmentFetcher, OnIncludeError, assemble,
};

/// Serves fixed fragments; `esi` marks the ones whose body is ESI too.
/// Records the includes left out.
struct MapFetcher(
    HashMap<&'static str, (u16, &'static str, bool)>,
    Mutex<Vec<String>>,
);

impl FragmentFetcher for MapFetcher {
    fn fetch(&self, src: &str) -> Fetch {
        let found = self.0.get(src).copied();
        let src = src.to_owned();
        Fetch::Pending(Box::pin(async move {
            let (status, body, esi) = found.ok_or(FragmentError::NotAllowed(src))?;
            // Two chunks, so bodies are really streamed.
            let (a, b) = body.split_at(body.len() / 2);
            let chunks: Vec<Result<Bytes, BoxError>> = vec![
                Ok(Bytes::from_static(a.as_bytes())),
                Ok(Bytes::from_static(b.as_bytes())),
            ];
            Ok(Fragment {
                status,
                body: stream::iter(chunks).boxed(),
                esi,
            })
        }))
    }

    fn omitted(&self, src: &str, reason: &FailureReason) {
        self.1
            .lock()
            .expect("lock")
            .push(format!("{src}: {reason}"));
    }
}

/// What assembling a page gave.
struct Page {
    text: String,
    error: Option<EsiError>,
    /// `src: reason` of each include left out.
    omitted: Vec<String>,
}

async fn assemble_page(page: &'static str, headers: HeaderMap) -> (String, Option<EsiError>) {
    let p = assemble_with(page, headers, OnIncludeError::Omit).await;
    (p.text, p.error)
}

async fn assemble_with(page: &'static str, headers: HeaderMap, on_error: OnIncludeError) -> Page {
    let fetcher = Arc::new(MapFetcher(
        HashMap::from([
            ("/header", (200, "<header>H</header>", false)),
            ("/user/alice", (200, "<b>alice</b>", false)),
            (
                "/menu",
                (200, r#"<nav><esi:include src="/item"/></nav>"#, true),
            ),
            ("/item", (200, "<li>item</li>", false)),
            ("/gone", (410, "gone", false)),
        ]),
        Mutex::default(),
    ));
    let vars = Arc::new(EsiVars::from_request("shop.example", "/?lang=en", &headers));
    // The page arrives in small pieces, splitting tags.
    let pieces: Vec<Result<Bytes, BoxError>> = page
        .as_bytes()
        .chunks(7)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let limits = EsiLimits {
        include_timeout: Duration::from_secs(5),
        page_deadline: Duration::from_secs(10),
        on_include_error: on_error,
        ..EsiLimits::default()
    };
    let mut out = assemble(
        stream::iter(pieces).boxed(),
        vars,
        Arc::clone(&fetcher) as Arc<dyn FragmentFetcher>,
        limits,
    );
    let mut text = String::new();
    let mut error = None;
    while let Some(item) = out.next().await {
        match item {
            Ok(b) => text.push_str(std::str::from_utf8(&b).expect("utf-8")),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let omitted = fetcher.1.lock().expect("lock").clone();
    Page {
        text,
        error,
        omitted,
    }
}

#[tokio::test]
async fn assembles_a_page_with_variables_choose_and_nested_fragments() {
    let mut headers = HeaderMap::new();
    headers.insert("cookie", HeaderValue::from_static("user=alice"));
    let page = r#"<html><esi:include src="/header"/>
<esi:choose><esi:when test="$(HTTP_COOKIE{user}) != ''"><esi:include src="/user/$(HTTP_COOKIE{user})"/></esi:when><esi:otherwise>guest</esi:otherwise></esi:choose>
<esi:remove><a href="/login">log in</a></esi:remove><!--esi <esi:include src="/menu"/> -->
<esi:vars>$(HTTP_HOST) $(QUERY_STRING{lang})</esi:vars>
<esi:try><esi:attempt><esi:include src="/gone"/></esi:attempt><esi:except>fallback</esi:except></esi:try>
<esi:include src="/gone" onerror="continue"/></html>"#;
    let (text, err) = assemble_page(page, headers).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        text,
        "<html><header>H</header>\n<b>alice</b>\n <nav><li>item</li></nav> \nshop.example en\nfallback\n</html>"
    );
}

#[tokio::test]
async fn a_failed_include_without_fallback_is_left_out_by_default() {
    let p = assemble_with(
        r#"<p>start</p><esi:include src="/gone"/><p>end</p>"#,
        HeaderMap::new(),
        OnIncludeError::default(),
    )
    .await;
    assert_eq!(p.text, "<p>start</p><p>end</p>", "the page is whole");
    assert!(p.error.is_none(), "{:?}", p.error);
    assert_eq!(p.omitted, vec!["/gone: status 410".to_owned()]);
}

#[tokio::test]
async fn with_fail_a_failed_include_without_fallback_ends_the_page() {
    let p = assemble_with(
        r#"<p>start</p><esi:include src="/gone"/><p>end</p>"#,
        HeaderMap::new(),
        OnIncludeError::Fail,
    )
    .await;
    assert_eq!(p.text, "<p>start</p>");
    assert!(p.omitted.is_empty());
    match p.error {
        Some(EsiError::Include {
            src,
            reason: FailureReason::Status(410),
        }) => assert_eq!(src, "/gone"),
        other => panic!("unexpected {other:?}"),
    }
}

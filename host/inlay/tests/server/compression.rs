//! Compression at the edge, in process against the test origin (which never
//! compresses `/html/N`): each coding decodes to the origin's bytes, one
//! origin fetch serves every coding from the store, Vary and weak ETags,
//! Range and conditional requests on a compressed object, ESI pages
//! compressed as they stream, pass responses compressed as they stream,
//! and what is left alone.

use crate::common;

use std::io::Read;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Harness, Origin, Reply, get, request};

/// The page the tests serve: 64 KiB of HTML that compresses as pages do.
const PAGE: &str = "/html/65536";

/// Every coding Inlay makes, preferred in this order.
const ALL_CODINGS: &str = "[cache]\naccept_encoding = [\"zstd\", \"br\", \"gzip\"]";

/// `body` decoded from `coding` by the codings' own crates (not Inlay's
/// stream decoder).
fn decode(coding: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        None => out.extend_from_slice(body),
        Some("gzip") => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
        }
        Some("br") => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        Some("zstd") => out = zstd::decode_all(body).unwrap(),
        Some(other) => panic!("unexpected coding {other}"),
    }
    out
}

async fn get_with(url: &str, headers: &[(&str, &str)]) -> Reply {
    request("GET", url, headers, Bytes::new()).await
}

/// Asks in coding `ae` until the response is a hit on the stored object
/// in that coding (the store is written once the body is compressed, a
/// moment after the miss's response; until then requests join the fill
/// and are compressed as they stream, without a length).
async fn until_hit(url: &str, ae: &str) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get_with(url, &[("accept-encoding", ae)]).await;
        if r.header("cache-status").is_some_and(|s| s.contains("hit"))
            && r.headers.contains_key("content-length")
            && r.header("content-encoding") == Some(ae)
        {
            return r;
        }
        assert!(Instant::now() < deadline, "never a hit: {:?}", r.headers);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn varies_on_accept_encoding(r: &Reply) -> bool {
    r.headers.get_all("vary").iter().any(|v| {
        v.to_str()
            .unwrap()
            .to_ascii_lowercase()
            .contains("accept-encoding")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_coding_decodes_to_the_origins_bytes_and_one_fetch_serves_them_all() {
    let origin = Origin::start();
    let inlay = Harness::builder()
        .backend(&origin)
        .toml(ALL_CODINGS)
        .start_in_process()
        .await;
    let want = get(&format!("{}{PAGE}", origin.url())).await.body;
    assert_eq!(want.len(), 65_536);
    let asked = origin.count(PAGE).await;
    let url = inlay.url(PAGE);
    // The miss is compressed as it streams (no length).
    let miss = get_with(&url, &[("accept-encoding", "gzip, deflate, br, zstd")]).await;
    assert!(miss.header("cache-status").unwrap().contains("miss"));
    assert_eq!(miss.header("content-encoding"), Some("zstd"));
    assert_eq!(decode(Some("zstd"), &miss.body), want);
    until_hit(&url, "br").await;
    // Hits: each coding from the store, with its length, decoding to the
    // origin's bytes.
    // (the client's Accept-Encoding, if any; the coding it gets)
    let cases = [
        (Some("gzip, deflate, br, zstd"), Some("zstd")),
        (Some("gzip, deflate, br"), Some("br")),
        (Some("gzip"), Some("gzip")),
        (Some("br;q=0, zstd;q=0, *"), Some("gzip")),
        (Some("deflate"), None),
        (Some("identity"), None),
        (None, None),
    ];
    let mut sizes = Vec::new();
    for (ae, coding) in cases {
        let headers: Vec<(&str, &str)> = ae.map(|v| ("accept-encoding", v)).into_iter().collect();
        let headers = headers.as_slice();
        let r = get_with(&url, headers).await;
        assert_eq!(r.status, 200);
        assert!(
            r.header("cache-status").unwrap().contains("hit"),
            "{headers:?}"
        );
        assert_eq!(r.header("content-encoding"), coding, "{headers:?}");
        assert_eq!(decode(coding, &r.body), want, "{headers:?}");
        assert_eq!(
            r.header("content-length"),
            Some(r.body.len().to_string().as_str()),
            "{headers:?}: served as stored, not compressed again"
        );
        assert!(varies_on_accept_encoding(&r), "{headers:?}");
        let etag = r.header("etag").unwrap();
        match coding {
            Some(_) => assert_eq!(etag, "W/\"html-65536\"", "{headers:?}"),
            None => assert_eq!(etag, "\"html-65536\"", "{headers:?}"),
        }
        sizes.push((coding, r.body.len()));
    }
    assert_eq!(
        origin.count(PAGE).await,
        asked + 1,
        "one fetch serves every coding"
    );
    // Stored at the store's levels: br and zstd a fifth of the page or less.
    for (coding, len) in sizes {
        if coding.is_some() {
            assert!(len < 65_536 / 4, "{coding:?}: {len} bytes");
        }
    }
    // A hostile Accept-Encoding (64 KiB of codings) costs only its scan.
    let long = format!("{}gzip", "x-nonsense;q=0.5, ".repeat(3_000));
    let r = get_with(&url, &[("accept-encoding", &long)]).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(decode(Some("gzip"), &r.body), want);
    assert_eq!(origin.count(PAGE).await, asked + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_varies_on_accept_encoding_but_sends_identity_is_fetched_once() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let path = "/html/65536?vary=Accept-Encoding";
    let want = get(&format!("{}{path}", origin.url())).await.body;
    let url = inlay.url(path);
    until_hit(&url, "br").await;
    for (ae, coding) in [
        ("gzip", Some("gzip")),
        ("identity", None),
        ("br", Some("br")),
    ] {
        let r = get_with(&url, &[("accept-encoding", ae)]).await;
        assert!(r.header("cache-status").unwrap().contains("hit"), "{ae}");
        assert_eq!(r.header("content-encoding"), coding, "{ae}");
        assert_eq!(decode(coding, &r.body), want, "{ae}");
        let vary: Vec<_> = r.headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept-Encoding"], "{ae}: said once");
    }
    assert_eq!(
        origin.count("/html/65536").await,
        2,
        "Inlay's one fetch, and the test's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_of_a_compressed_object_are_of_the_bytes_sent() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url(PAGE);
    let whole = until_hit(&url, "br").await;
    assert_eq!(whole.header("content-encoding"), Some("br"));
    let len = whole.body.len();
    let br = [("accept-encoding", "br")];
    let part = get_with(&url, &[br[0], ("range", "bytes=100-199")]).await;
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-encoding"), Some("br"));
    assert_eq!(
        part.header("content-range"),
        Some(format!("bytes 100-199/{len}").as_str())
    );
    assert_eq!(part.body, whole.body.slice(100..200));
    // The tail, by suffix, ends the same stream.
    let tail = get_with(&url, &[br[0], ("range", "bytes=-50")]).await;
    assert_eq!(tail.status, 206);
    assert_eq!(tail.body, whole.body.slice(len - 50..));
    // Identity ranges are of the page itself.
    let want = get(&format!("{}{PAGE}", origin.url())).await.body;
    let plain = get_with(&url, &[("range", "bytes=0-99")]).await;
    assert_eq!(plain.status, 206);
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.body, want.slice(0..100));
    // If-Range needs a strong validator: the weak one of a coded
    // representation never matches, and the whole is sent.
    let weak = get_with(
        &url,
        &[
            br[0],
            ("range", "bytes=0-9"),
            ("if-range", "W/\"html-65536\""),
        ],
    )
    .await;
    assert_eq!(weak.status, 200);
    assert_eq!(weak.body, whole.body);
    let strong = get_with(
        &url,
        &[("range", "bytes=0-9"), ("if-range", "\"html-65536\"")],
    )
    .await;
    assert_eq!(strong.status, 206);
    assert_eq!(strong.body, want.slice(0..10));
    // Beyond the coded length: 416 with that length.
    let past = get_with(&url, &[br[0], ("range", &format!("bytes={len}-"))]).await;
    assert_eq!(past.status, 416);
    assert_eq!(
        past.header("content-range"),
        Some(format!("bytes */{len}").as_str())
    );
    assert_eq!(
        origin.count(PAGE).await,
        2,
        "Inlay's one fetch, and the test's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_requests_compare_weakly_on_a_compressed_object() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url(PAGE);
    until_hit(&url, "gzip").await;
    for (ae, inm) in [
        ("gzip", "W/\"html-65536\""),
        ("gzip", "\"html-65536\""),
        ("br, gzip", "\"other\", W/\"html-65536\""),
        ("identity", "W/\"html-65536\""),
    ] {
        let r = get_with(&url, &[("accept-encoding", ae), ("if-none-match", inm)]).await;
        assert_eq!(r.status, 304, "{ae} {inm}");
        assert!(r.body.is_empty());
        assert!(varies_on_accept_encoding(&r), "{ae} {inm}");
        assert_eq!(r.header("content-encoding"), None, "{ae} {inm}");
        let weak = ae != "identity";
        let etag = r.header("etag").unwrap();
        assert_eq!(etag.starts_with("W/"), weak, "{ae} {inm}: {etag}");
    }
    let r = get_with(
        &url,
        &[("accept-encoding", "br"), ("if-none-match", "\"other\"")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("br"));
    // A client that asks for the content untransformed gets it as it is.
    let r = get_with(
        &url,
        &[("accept-encoding", "br"), ("cache-control", "no-transform")],
    )
    .await;
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body.len(), 65_536);
    assert_eq!(origin.count(PAGE).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn esi_pages_are_compressed_as_they_stream_in_document_order() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let url = inlay.url("/esi/page?n=4&delays=700,50,300,100&cacheable=0");
    let plain = get(&url).await;
    assert_eq!(plain.header("content-encoding"), None);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let started = Instant::now();
    let req = http::Request::get(&url)
        .header("accept-encoding", "br")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-encoding"], "br");
    assert!(resp.headers().get("content-length").is_none());
    // The first frame comes before the slowest include, and decodes alone
    // to the page's start: flushed, not held for the rest.
    let first = http_body_util::BodyExt::frame(resp.body_mut())
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    let mut head = Vec::new();
    let mut dec = brotli::DecompressorWriter::new(&mut head, 4096);
    std::io::Write::write_all(&mut dec, &first).unwrap();
    std::io::Write::flush(&mut dec).unwrap();
    drop(dec);
    assert!(
        !head.is_empty() && plain.body.starts_with(&head),
        "{head:?}"
    );
    let rest = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let page = decode(Some("br"), &[first.as_ref(), rest.as_ref()].concat());
    let text = String::from_utf8(page).unwrap();
    let pos: Vec<usize> = (0..4)
        .map(|i| {
            text.find(&format!("data-id=\"{i}\""))
                .expect("every fragment")
        })
        .collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "out of order: {text}");
    assert_eq!(text, plain.text());
    // A gzip template (the origin's) is decoded, assembled and sent in
    // the client's coding.
    let gz = inlay.url("/gzip/esi/page?n=2&cacheable=0");
    let r = get_with(&gz, &[("accept-encoding", "br")]).await;
    assert_eq!(r.header("content-encoding"), Some("br"));
    let text = String::from_utf8(decode(Some("br"), &r.body)).unwrap();
    assert!(
        text.contains("data-id=\"1\"") && !text.contains("<esi:"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_responses_are_compressed_as_they_stream() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let want = get(&format!("{}{PAGE}", origin.url())).await.body;
    // A request with a cookie is passed.
    let r = get_with(
        &inlay.url(PAGE),
        &[("accept-encoding", "gzip"), ("cookie", "session=1")],
    )
    .await;
    assert!(
        r.header("cache-status").unwrap().contains("pass"),
        "{:?}",
        r.headers
    );
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(decode(Some("gzip"), &r.body), want);
    // An uncacheable text body arriving in pieces is sent in pieces: the
    // first one long before the last is read from the origin.
    let slow = "/bytes/40000?chunk=10000&chunk_delay_ms=400&ct=text/plain&cc=no-store";
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let started = Instant::now();
    let req = http::Request::get(inlay.url(slow))
        .header("accept-encoding", "br")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-encoding"], "br");
    let first = http_body_util::BodyExt::frame(resp.body_mut())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_data());
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    let rest = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1000),
        "{took:?}: the origin's pauses"
    );
    let first = first.into_data().unwrap();
    let all = decode(Some("br"), &[first.as_ref(), rest.as_ref()].concat());
    assert_eq!(all, get(&format!("{}{slow}", origin.url())).await.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_encoded_and_incompressible_bodies_are_left_alone() {
    let origin = Origin::start();
    let inlay = Harness::builder().backend(&origin).start_in_process().await;
    let br = [("accept-encoding", "br, gzip")];
    // Below compression.min_size (1 KiB by default).
    let small = get_with(&inlay.url("/resp?body=short&cc=max-age%3D60"), &br).await;
    assert_eq!(small.header("content-encoding"), None);
    assert_eq!(small.text(), "short");
    assert!(!varies_on_accept_encoding(&small));
    // Types that are compressed already, or not text.
    for path in [
        "/static/65536",
        "/static/65536?ct=image/png",
        "/static/65536?ct=font/woff2",
        "/static/65536?ct=application/zip",
        "/html/65536?cc=public,max-age%3D60,no-transform",
    ] {
        let want = get(&format!("{}{path}", origin.url())).await.body;
        for _ in 0..2 {
            let r = get_with(&inlay.url(path), &br).await;
            assert_eq!(r.header("content-encoding"), None, "{path}");
            assert_eq!(r.body, want, "{path}");
        }
    }
    // Encoded by the origin: sent as it came, never twice.
    let r = get_with(&inlay.url("/gzip/html/65536?x=1"), &br).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(
        decode(Some("gzip"), &r.body),
        get(&format!("{}{PAGE}", origin.url())).await.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_can_be_turned_off_and_streams_are_bounded() {
    let origin = Origin::start();
    let off = Harness::builder()
        .backend(&origin)
        .toml("[compression]\nenabled = false")
        .start_in_process()
        .await;
    let br = [("accept-encoding", "br, gzip")];
    for _ in 0..2 {
        let r = get_with(&off.url(PAGE), &br).await;
        assert_eq!(r.header("content-encoding"), None);
        assert!(!varies_on_accept_encoding(&r));
        assert_eq!(r.body.len(), 65_536);
    }
    // No slot for a stream: passed responses go uncompressed (with Vary),
    // and stored objects are still served compressed.
    let no_streams = Harness::builder()
        .backend(&origin)
        .toml("[compression]\nmax_streams = 0")
        .start_in_process()
        .await;
    let r = get_with(&no_streams.url(PAGE), &[br[0], ("cookie", "a=1")]).await;
    assert!(r.header("cache-status").unwrap().contains("pass"));
    assert_eq!(r.header("content-encoding"), None);
    assert!(varies_on_accept_encoding(&r));
    let miss = get_with(&no_streams.url(PAGE), &br).await;
    assert_eq!(miss.header("content-encoding"), None);
    let hit = until_hit(&no_streams.url(PAGE), "br").await;
    assert_eq!(
        hit.header("content-encoding"),
        Some("br"),
        "{:?}",
        hit.headers
    );
}

//! What bans cost a cache hit: a fresh memory hit through
//! `HttpCache::lookup` with no bans, with 1,000 bans all older than the
//! object (one atomic load), and with 100 non-matching regex bans newer
//! than the object (each hit tests all of them, until the lurker drops
//! them).
//!
//! Run: `cargo bench -p inlay-cache --bench ban_hit`

// `criterion_group!` generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use inlay_cache::{
    BanLurker, CacheRules, CacheStore, Defaults, HttpCache, Lookup, PrimaryKey, object_meta,
};
use inlay_core::CacheSettings;
use inlay_storage::MemoryStore;

fn cache() -> HttpCache {
    let store = Arc::new(MemoryStore::new(64 << 20, 1 << 20));
    let rules = CacheRules {
        defaults: Defaults {
            ttl: Duration::from_secs(120),
            grace: Duration::ZERO,
            keep: Duration::ZERO,
        },
        max_object_size: 1 << 20,
        accept_encoding: Default::default(),
        ban_memory: inlay_cache::DEFAULT_BAN_MEMORY,
        compression: None,
    };
    let cache = HttpCache::new(CacheStore::from_store(store), rules);
    cache.set_ban_lurker(BanLurker {
        enabled: false,
        ..BanLurker::default()
    });
    cache
}

async fn put(cache: &HttpCache, primary: &PrimaryKey) {
    let settings = CacheSettings {
        cacheable: true,
        ttl: Duration::from_secs(3600),
        grace: Duration::ZERO,
        keep: Duration::ZERO,
        surrogate_keys: Vec::new(),
        esi: false,
    };
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "text/html".parse().unwrap());
    let meta = object_meta(200, &headers, &settings);
    cache
        .insert(
            primary,
            &HeaderMap::new(),
            meta,
            Bytes::from(vec![b'x'; 177]),
        )
        .await
        .unwrap();
}

async fn bans(cache: &HttpCache, n: usize) {
    for i in 0..n {
        cache
            .ban(&format!(
                "req.url ~ ^/nomatch/{i}/ && obj.http.content-type ~ json"
            ))
            .await
            .unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let primary = PrimaryKey::new("example.com", "/static/177", &[]);
    let none = cache();
    let older = cache();
    let newer = cache();
    rt.block_on(async {
        put(&none, &primary).await;
        bans(&older, 1000).await;
        put(&older, &primary).await;
        put(&newer, &primary).await;
        bans(&newer, 100).await;
    });
    let headers = HeaderMap::new();
    for (name, cache) in [
        ("hit_no_bans", &none),
        ("hit_1000_older_bans", &older),
        ("hit_100_newer_bans_tested", &newer),
    ] {
        c.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                match cache.lookup(black_box(&primary), &headers).await {
                    Lookup::Fresh(obj) => black_box(obj),
                    _ => panic!("expected a hit"),
                };
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

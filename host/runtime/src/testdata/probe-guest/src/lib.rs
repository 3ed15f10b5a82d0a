//! A probe policy for the host runtime's tests. `on-request` picks a
//! behaviour from the request path so that one component covers every
//! host import and every failure mode (loop, out of memory, trap, caps).

wit_bindgen::generate!({
    path: "../../../../../guest-sdk/wit",
    world: "policy",
});

use exports::inlay::policy::handler::Guest;
use inlay::policy::types::{
    CacheSettings, Request, RequestAction, Response, SyntheticResponse,
};
use inlay::policy::{cache, clock, config, esi, fetch, kv, log};

struct Probe;

thread_local! {
    /// Hooks this instance ran, and what `on-request` saw: lets tests see
    /// that an instance brought up mid-request ran each hook exactly once.
    static HOOKS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn ran(what: String) -> String {
    HOOKS.with(|h| {
        let mut h = h.borrow_mut();
        h.push(what);
        h.join(",")
    })
}

fn synth(status: u16, headers: Vec<(String, String)>, body: impl Into<Vec<u8>>) -> RequestAction {
    RequestAction::Synthetic(SyntheticResponse {
        status,
        headers,
        body: body.into(),
    })
}

fn get(url: &str) -> fetch::FetchRequest {
    fetch::FetchRequest {
        backend: None,
        method: String::new(),
        url: url.to_string(),
        headers: vec![("x-sub".to_string(), "1".to_string())],
        body: Vec::new(),
    }
}

fn describe(r: &Result<fetch::FetchResponse, fetch::FetchError>) -> String {
    match r {
        Ok(resp) => format!("{}:{}", resp.status, String::from_utf8_lossy(&resp.body)),
        Err(fetch::FetchError::LimitExceeded) => "limit".to_string(),
        Err(fetch::FetchError::UnknownBackend(b)) => format!("unknown-backend:{b}"),
        Err(e) => format!("err:{e:?}"),
    }
}

impl Guest for Probe {
    fn on_request(req: &Request) -> RequestAction {
        let url = req.url();
        let _ = req.set_header("x-hooks", &ran(format!("request {url}")));
        let path = url.split('?').next().unwrap_or("").to_string();
        match path.as_str() {
            "/loop" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "/oom" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    // Touch every page so the memory is really used.
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "/trap" => panic!("probe asked to trap"),
            "/synth" => synth(
                418,
                vec![("x-synth".into(), "1".into())],
                "short and stout",
            ),
            "/pass" => RequestAction::Pass,
            "/bad-synth-status" => synth(42, vec![], ""),
            "/bad-synth-header" => synth(200, vec![("bad name".into(), "v".into())], ""),
            "/kv-big" => {
                let big_value = kv::set("v", &vec![0u8; (1 << 20) + 1]);
                let big_key = kv::get(&"k".repeat(2000));
                synth(
                    200,
                    vec![
                        ("x-big-value".into(), format!("{big_value:?}")),
                        ("x-big-key".into(), format!("{big_key:?}")),
                    ],
                    "",
                )
            }
            "/config" => {
                let all = config::all()
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(";");
                let greeting = config::get("greeting").unwrap_or_else(|| "none".into());
                let missing = config::get("missing").is_none();
                synth(
                    200,
                    vec![
                        ("x-greeting".into(), greeting),
                        ("x-missing-is-none".into(), missing.to_string()),
                    ],
                    all,
                )
            }
            "/kv" => {
                let n = match kv::get("count") {
                    Ok(Some(v)) => String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0),
                    Ok(None) => 0,
                    Err(e) => return synth(500, vec![], format!("{e:?}")),
                };
                let next = (n + 1).to_string();
                if let Err(e) = kv::set("count", next.as_bytes()) {
                    return synth(500, vec![], format!("{e:?}"));
                }
                let deleted_missing = kv::delete("never-set");
                synth(
                    200,
                    vec![("x-deleted-missing".into(), format!("{deleted_missing:?}"))],
                    next,
                )
            }
            "/kv-cap" => {
                let mut ok = 0u32;
                loop {
                    match kv::get("count") {
                        Ok(_) => ok += 1,
                        Err(kv::KvError::LimitExceeded) => break,
                        Err(e) => return synth(500, vec![], format!("{e:?}")),
                    }
                }
                synth(200, vec![], ok.to_string())
            }
            "/hostcall-cap" => {
                // Resource methods have no error variant: over the cap they trap.
                loop {
                    std::hint::black_box(req.method());
                }
            }
            "/fetch" => {
                let r = fetch::send(&get("/sub/one"));
                let mut other = get("/sub/two");
                other.backend = Some("nope".into());
                let unknown = fetch::send(&other);
                synth(
                    200,
                    vec![("x-unknown".into(), describe(&unknown))],
                    describe(&r),
                )
            }
            "/fetch-many" => {
                let n: usize = url
                    .split("n=")
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(3);
                let reqs: Vec<_> = (0..n).map(|i| get(&format!("/sub/{i}"))).collect();
                let out = fetch::send_many(&reqs);
                let body = out.iter().map(describe).collect::<Vec<_>>().join(",");
                synth(200, vec![], body)
            }
            "/cache" => {
                let obj = cache::NewObject {
                    status: 203,
                    headers: vec![("x-stored".into(), "yes".into())],
                    body: b"cached body".to_vec(),
                    ttl: 60,
                    grace: 5,
                    surrogate_keys: vec!["k1".into()],
                };
                let ins = cache::insert("example.com", "/c", &obj);
                let hit = cache::lookup("example.com", "/c");
                let miss = cache::lookup("example.com", "/absent");
                let purged_url = cache::purge_url("example.com", "/c", true);
                let purged_key = cache::purge_key("k1", false);
                let bad = cache::insert("", "/c", &obj);
                let hit_desc = match hit {
                    Ok(Some(o)) => format!("{}:{}", o.status, String::from_utf8_lossy(&o.body)),
                    other => format!("{other:?}"),
                };
                synth(
                    200,
                    vec![
                        ("x-insert".into(), format!("{ins:?}")),
                        ("x-miss".into(), format!("{}", matches!(miss, Ok(None)))),
                        ("x-purge-url".into(), format!("{purged_url:?}")),
                        ("x-purge-key".into(), format!("{purged_key:?}")),
                        ("x-bad".into(), format!("{}", matches!(bad, Err(cache::CacheError::Invalid(_))))),
                    ],
                    hit_desc,
                )
            }
            "/bad-input" => {
                let a = req.set_header("bad name", "v");
                let b = req.set_header("x-ok", "bad\nvalue");
                let c = req.set_url("no-slash");
                let d = req.append_header("", "v");
                let e = req.set_backend("nope");
                let f = req.set_backend("second");
                let all = [a, b, c, d, e]
                    .iter()
                    .map(|r| if r.is_err() { "err" } else { "ok" })
                    .collect::<Vec<_>>()
                    .join(",");
                synth(
                    200,
                    vec![
                        ("x-results".into(), all),
                        ("x-second".into(), format!("{f:?}")),
                        ("x-backend".into(), req.backend()),
                    ],
                    "",
                )
            }
            "/clock" => synth(200, vec![], clock::now_unix_ms().to_string()),
            "/log" => {
                log::write(log::Level::Info, "hello from the probe");
                log::write(log::Level::Error, "an error line");
                RequestAction::Lookup
            }
            "/esi" => {
                esi::set_enabled(true);
                esi::set_var("region", "eu");
                esi::set_var("lang", "fr");
                RequestAction::Lookup
            }
            _ => {
                // The default: a request rewrite that touches every accessor.
                let seen = format!(
                    "{} {} {} {}",
                    req.method(),
                    req.url(),
                    req.client_ip(),
                    req.backend()
                );
                let _ = req.set_header("x-seen", &seen);
                let _ = req.append_header("x-multi", "a");
                let _ = req.append_header("x-multi", "b");
                let multi = req.header_all("x-multi").join("|");
                let _ = req.set_header("x-multi-read", &multi);
                req.remove_header("cookie");
                let count = req.headers().len();
                let _ = req.set_header("x-count", &count.to_string());
                if let Some(lang) = req.header("accept-language") {
                    req.add_to_cache_key(&lang);
                }
                if let Some(m) = req.header("x-set-method") {
                    req.set_method(&m);
                }
                if let Some(u) = req.header("x-set-url") {
                    let _ = req.set_url(&u);
                }
                RequestAction::Lookup
            }
        }
    }

    fn on_backend_response(
        req: &Request,
        resp: &Response,
        settings: CacheSettings,
    ) -> CacheSettings {
        let mut settings = settings;
        let _ = resp.set_header("x-hooks", &ran(format!("backend-response {}", settings.ttl)));
        let _ = resp.set_header("x-bres-url", &req.url());
        let _ = resp.append_header("x-bres-status", &resp.status().to_string());
        if resp.status() >= 500 {
            settings.cacheable = false;
        }
        if let Some(s) = resp.header("x-set-status").and_then(|s| s.parse().ok()) {
            let _ = resp.set_status(s);
        }
        let bad_status = resp.set_status(42).is_err();
        let _ = resp.set_header("x-bad-status-refused", &bad_status.to_string());
        settings.ttl = settings.ttl.saturating_mul(2);
        settings.grace = 7;
        settings.keep = 11;
        settings.surrogate_keys.push("probe".into());
        settings.esi = req.header("x-want-esi").is_some();
        settings
    }

    fn on_deliver(req: &Request, resp: &Response) {
        let _ = resp.set_header("x-hooks", &ran("deliver".to_string()));
        let _ = resp.set_header("x-deliver", &req.method());
        resp.remove_header("server");
        let names = resp
            .headers()
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
            .join(",");
        let _ = resp.set_header("x-names", &names);
        let late = if req.set_backend("second").is_err() { "refused" } else { "accepted" };
        let _ = resp.set_header("x-late-backend", late);
        let _ = resp.append_header("via", "probe");
        let vias = resp.header_all("via").len();
        let _ = resp.set_header("x-via-count", &vias.to_string());
    }
}

export!(Probe);

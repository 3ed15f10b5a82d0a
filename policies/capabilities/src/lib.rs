//! Test fixture: one route per host capability, so the host's tests can
//! check `kv`, `cache`, `fetch` and `esi` end to end. Other requests follow
//! the built-in rules. `/cap/timing` turns Server-Timing on for itself.
//! `/cap/backend/NAME` sends the request (as `/echo`) to the backend or
//! director `NAME`, or answers 500 when the host refuses the name.
//!
//! `/cap/state` answers with every URL this instance has seen before, one
//! per line: the host's tests use it to prove that with one request per
//! instance no request can see another's (each gets a fresh instance of
//! the load-time snapshot, which has seen only the synthetic warm-up
//! request), and what a request sees when instances are reused.

use inlay_policy::{Action, Policy, Request, builtin, cache, esi, fetch, kv};

/// The fixture.
#[derive(Default)]
pub struct Capabilities;

fn text(status: u16, body: String) -> Action {
    Action::synthetic(status)
        .header("content-type", "text/plain")
        .body(body.into_bytes())
        .into()
}

/// The URLs of the requests this instance has handled, oldest first.
static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

impl Policy for Capabilities {
    fn on_request(&self, req: &Request) -> Action {
        let path = req.path();
        let earlier = {
            let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
            let earlier = seen.join("\n");
            seen.push(req.url());
            earlier
        };
        match path.as_str() {
            "/cap/state" => text(200, earlier),
            // A counter that survives restarts (kv is persistent with --cache-dir).
            "/cap/kv" => {
                let n = match kv::get("hits") {
                    Ok(Some(v)) => String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0),
                    Ok(None) => 0,
                    Err(e) => return text(500, format!("kv get: {e}")),
                } + 1;
                if let Err(e) = kv::set("hits", n.to_string().as_bytes()) {
                    return text(500, format!("kv set: {e}"));
                }
                text(200, n.to_string())
            }
            // Put an object in the HTTP cache, then read it back.
            "/cap/cache-put" => {
                let obj = cache::NewObject::new(200, b"from the policy".to_vec())
                    .header("content-type", "text/plain")
                    .ttl(60)
                    .surrogate_key("cap");
                match cache::insert("cap.example", "/stored", &obj) {
                    Ok(()) => text(201, "stored".into()),
                    Err(e) => text(500, format!("cache insert: {e}")),
                }
            }
            "/cap/cache-get" => match cache::lookup("cap.example", "/stored") {
                Ok(Some(o)) => text(200, String::from_utf8_lossy(&o.body).into_owned()),
                Ok(None) => text(404, "none".into()),
                Err(e) => text(500, format!("cache lookup: {e}")),
            },
            // Compose a response from two subrequests sent in parallel.
            "/cap/compose" => {
                let reqs = [
                    fetch::FetchRequest::get("/bytes/3?delay_ms=300"),
                    fetch::FetchRequest::get("/bytes/5?delay_ms=300"),
                ];
                let mut out = String::new();
                for r in fetch::send_many(&reqs) {
                    match r {
                        Ok(resp) => out.push_str(&String::from_utf8_lossy(&resp.body)),
                        Err(e) => return text(502, format!("fetch: {e}")),
                    }
                }
                text(200, out)
            }
            // What a subrequest carries: the origin's /echo, answered as is.
            "/cap/fetch-echo" => match fetch::send(&fetch::FetchRequest::get("/echo")) {
                Ok(resp) => text(resp.status, String::from_utf8_lossy(&resp.body).into_owned()),
                Err(e) => text(502, format!("fetch: {e}")),
            },
            // Turn ESI on for a response that did not opt in, with a variable.
            // The page itself comes from the origin's /resp with the same query.
            "/cap/esi" => {
                esi::set_enabled(true);
                esi::set_var("WHO", "policy");
                let url = match req.query() {
                    Some(q) => format!("/resp?{q}"),
                    None => "/resp".to_string(),
                };
                match req.set_url(&url) {
                    Ok(()) => Action::Pass,
                    Err(e) => text(500, format!("set_url: {e}")),
                }
            }
            // Server-Timing for this one request (the host's request flag);
            // the request goes on to the origin's /echo under the built-in rules.
            "/cap/timing" => match req
                .set_header("inlay-server-timing", "1")
                .and_then(|()| req.set_url("/echo"))
            {
                Ok(()) => builtin::recv(req),
                Err(e) => text(500, format!("set_header: {e}")),
            },
            // Purge through the policy's cache calls: the URL (path and
            // query) is this request's query, on its own Host...
            "/cap/purge-url" => {
                let host = req.header("host").unwrap_or_default();
                let url = req.query().unwrap_or_else(|| "/".into());
                match cache::purge_url(&host, &url, false) {
                    Ok(n) => text(200, n.to_string()),
                    Err(e) => text(500, format!("cache purge-url: {e}")),
                }
            }
            // ... or the surrogate key is.
            "/cap/purge-key" => match cache::purge_key(&req.query().unwrap_or_default(), false) {
                Ok(n) => text(200, n.to_string()),
                Err(e) => text(500, format!("cache purge-key: {e}")),
            },
            p if p.starts_with("/cap/backend/") => {
                let name = &p["/cap/backend/".len()..];
                match req.set_backend(name).and_then(|()| req.set_url("/echo")) {
                    Ok(()) => Action::Pass,
                    Err(e) => text(500, format!("set_backend: {e}")),
                }
            }
            _ => builtin::recv(req),
        }
    }
}

inlay_policy::export!(Capabilities);

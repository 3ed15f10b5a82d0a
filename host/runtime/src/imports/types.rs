//! `inlay:policy/types`: the request and response handles.
//!
//! For one hook call the host moves its `RequestHead` (and
//! `ResponseHead`, from `inlay-core`) into the store state and lends the
//! guest a borrow handle; header accessors work on the `HeaderMap` in place and the
//! heads are moved back out when the hook returns. Nothing is copied per
//! access except the strings the guest asks for.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use inlay_core::{RequestHead, ResponseHead, path_and_query};
use wasmtime::component::Resource;

use crate::bindings::inlay::policy::types::{Headers, Host, HostRequest, HostResponse};
use crate::convert::{headers_to_list, lossy, parse_name, parse_path_and_query, parse_value};
use crate::errors::Hook;
use crate::policy::state::StoreState;

// The helpers below take names and fields parsed once, when the guest
// makes the call: a replayed call (see `runtime::memo`) then clones them
// instead of parsing and allocating again on every request.

/// A guest-supplied header name for a lookup or removal; `None` when it is
/// not a valid name (then no such header can be present).
fn lookup_name(name: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(name.as_bytes()).ok()
}

/// A guest-supplied header field, or why it is refused.
type Field = Result<(HeaderName, HeaderValue), String>;

fn parse_field(name: &str, value: &str) -> Field {
    let value = parse_value(name, value)?;
    Ok((parse_name(name)?, value))
}

fn header_first(map: &HeaderMap, name: Option<&HeaderName>) -> Option<String> {
    map.get(name?).map(lossy)
}

fn header_all(map: &HeaderMap, name: Option<&HeaderName>) -> Vec<String> {
    match name {
        Some(name) => map.get_all(name).iter().map(lossy).collect(),
        None => Vec::new(),
    }
}

fn set_header(map: &mut HeaderMap, field: &Field) -> Result<(), String> {
    let (name, value) = field.as_ref().map_err(Clone::clone)?;
    map.insert(name.clone(), value.clone());
    Ok(())
}

fn append_header(map: &mut HeaderMap, field: &Field) -> Result<(), String> {
    let (name, value) = field.as_ref().map_err(Clone::clone)?;
    map.append(name.clone(), value.clone());
    Ok(())
}

fn remove_header(map: &mut HeaderMap, name: Option<&HeaderName>) {
    if let Some(name) = name {
        map.remove(name);
    }
}

impl Host for StoreState {}

impl HostRequest for StoreState {
    fn method(&mut self, this: Resource<RequestHead>) -> wasmtime::Result<String> {
        let rep = this.rep();
        self.call("request.method", move |s| {
            Ok(s.request(rep)?.method.as_str().to_string())
        })
    }

    fn set_method(&mut self, this: Resource<RequestHead>, method: String) -> wasmtime::Result<()> {
        let rep = this.rep();
        self.call("request.set-method", move |s| {
            // No error variant in the WIT: an invalid token is a guest bug.
            let method = Method::from_bytes(method.as_bytes())
                .map_err(|_| wasmtime::format_err!("set-method: invalid method {method:?}"))?;
            s.request(rep)?.method = method;
            Ok(())
        })
    }

    fn url(&mut self, this: Resource<RequestHead>) -> wasmtime::Result<String> {
        let rep = this.rep();
        self.call("request.url", move |s| {
            Ok(path_and_query(&s.request(rep)?.uri).to_string())
        })
    }

    fn set_url(
        &mut self,
        this: Resource<RequestHead>,
        url: String,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        self.call("request.set-url", move |s| {
            let uri = match parse_path_and_query(&url) {
                Ok(uri) => uri,
                Err(e) => return Ok(Err(e)),
            };
            s.request(rep)?.uri = uri;
            Ok(Ok(()))
        })
    }

    fn header(
        &mut self,
        this: Resource<RequestHead>,
        name: String,
    ) -> wasmtime::Result<Option<String>> {
        let rep = this.rep();
        let name = lookup_name(&name);
        self.call("request.header", move |s| {
            Ok(header_first(&s.request(rep)?.headers, name.as_ref()))
        })
    }

    fn header_all(
        &mut self,
        this: Resource<RequestHead>,
        name: String,
    ) -> wasmtime::Result<Vec<String>> {
        let rep = this.rep();
        let name = lookup_name(&name);
        self.call("request.header-all", move |s| {
            Ok(header_all(&s.request(rep)?.headers, name.as_ref()))
        })
    }

    fn headers(&mut self, this: Resource<RequestHead>) -> wasmtime::Result<Headers> {
        let rep = this.rep();
        self.call("request.headers", move |s| {
            Ok(headers_to_list(&s.request(rep)?.headers))
        })
    }

    fn set_header(
        &mut self,
        this: Resource<RequestHead>,
        name: String,
        value: String,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        let field = parse_field(&name, &value);
        self.call("request.set-header", move |s| {
            Ok(set_header(&mut s.request(rep)?.headers, &field))
        })
    }

    fn append_header(
        &mut self,
        this: Resource<RequestHead>,
        name: String,
        value: String,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        let field = parse_field(&name, &value);
        self.call("request.append-header", move |s| {
            Ok(append_header(&mut s.request(rep)?.headers, &field))
        })
    }

    fn remove_header(&mut self, this: Resource<RequestHead>, name: String) -> wasmtime::Result<()> {
        let rep = this.rep();
        let name = lookup_name(&name);
        self.call("request.remove-header", move |s| {
            remove_header(&mut s.request(rep)?.headers, name.as_ref());
            Ok(())
        })
    }

    fn client_ip(&mut self, this: Resource<RequestHead>) -> wasmtime::Result<String> {
        let rep = this.rep();
        self.call("request.client-ip", move |s| {
            Ok(s.request(rep)?.client_ip.to_string())
        })
    }

    fn backend(&mut self, this: Resource<RequestHead>) -> wasmtime::Result<String> {
        let rep = this.rep();
        self.call("request.backend", move |s| {
            Ok(s.request(rep)?.backend.clone())
        })
    }

    fn set_backend(
        &mut self,
        this: Resource<RequestHead>,
        name: String,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        self.call("request.set-backend", move |s| {
            // Later hooks run after the backend was contacted (or the
            // response came from the cache): a change would silently do
            // nothing.
            if s.hook != Hook::OnRequest {
                return Ok(Err(format!(
                    "set-backend is only possible in on-request, not in {}",
                    s.hook
                )));
            }
            // Backends are fixed for a policy generation's lifetime (a
            // config reload makes a new generation), so this reply repeats.
            if !s.services().backend_exists(&name) {
                return Ok(Err(format!("unknown backend {name:?}")));
            }
            s.request(rep)?.backend = name.clone();
            Ok(Ok(()))
        })
    }

    fn add_to_cache_key(
        &mut self,
        this: Resource<RequestHead>,
        data: String,
    ) -> wasmtime::Result<()> {
        let rep = this.rep();
        self.call("request.add-to-cache-key", move |s| {
            s.request(rep)?.cache_key_extra.push(data.clone());
            Ok(())
        })
    }

    fn drop(&mut self, _rep: Resource<RequestHead>) -> wasmtime::Result<()> {
        // The guest only ever gets borrows; the host takes the head back
        // out of the table itself when the hook returns.
        Ok(())
    }
}

impl HostResponse for StoreState {
    fn status(&mut self, this: Resource<ResponseHead>) -> wasmtime::Result<u16> {
        let rep = this.rep();
        self.call("response.status", move |s| {
            Ok(s.response(rep)?.status.as_u16())
        })
    }

    fn set_status(
        &mut self,
        this: Resource<ResponseHead>,
        status: u16,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        self.call("response.set-status", move |s| {
            match StatusCode::from_u16(status) {
                Ok(status) => {
                    s.response(rep)?.status = status;
                    Ok(Ok(()))
                }
                Err(_) => Ok(Err(format!("invalid status {status}: must be 100-999"))),
            }
        })
    }

    fn header(
        &mut self,
        this: Resource<ResponseHead>,
        name: String,
    ) -> wasmtime::Result<Option<String>> {
        let rep = this.rep();
        let name = lookup_name(&name);
        self.call("response.header", move |s| {
            Ok(header_first(&s.response(rep)?.headers, name.as_ref()))
        })
    }

    fn header_all(
        &mut self,
        this: Resource<ResponseHead>,
        name: String,
    ) -> wasmtime::Result<Vec<String>> {
        let rep = this.rep();
        let name = lookup_name(&name);
        self.call("response.header-all", move |s| {
            Ok(header_all(&s.response(rep)?.headers, name.as_ref()))
        })
    }

    fn headers(&mut self, this: Resource<ResponseHead>) -> wasmtime::Result<Headers> {
        let rep = this.rep();
        self.call("response.headers", move |s| {
            Ok(headers_to_list(&s.response(rep)?.headers))
        })
    }

    fn set_header(
        &mut self,
        this: Resource<ResponseHead>,
        name: String,
        value: String,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        let field = parse_field(&name, &value);
        self.call("response.set-header", move |s| {
            Ok(set_header(&mut s.response(rep)?.headers, &field))
        })
    }

    fn append_header(
        &mut self,
        this: Resource<ResponseHead>,
        name: String,
        value: String,
    ) -> wasmtime::Result<Result<(), String>> {
        let rep = this.rep();
        let field = parse_field(&name, &value);
        self.call("response.append-header", move |s| {
            Ok(append_header(&mut s.response(rep)?.headers, &field))
        })
    }

    fn remove_header(
        &mut self,
        this: Resource<ResponseHead>,
        name: String,
    ) -> wasmtime::Result<()> {
        let rep = this.rep();
        let name = lookup_name(&name);
        self.call("response.remove-header", move |s| {
            remove_header(&mut s.response(rep)?.headers, name.as_ref());
            Ok(())
        })
    }

    fn drop(&mut self, _rep: Resource<ResponseHead>) -> wasmtime::Result<()> {
        // As for requests: the guest never owns a response handle.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::headers_from_list;
    use http::Uri;

    #[test]
    fn header_helpers_validate_and_keep_order() {
        let mut map = HeaderMap::new();
        let name = |n: &str| lookup_name(n);
        assert!(set_header(&mut map, &parse_field("X-A", "1")).is_ok());
        assert!(append_header(&mut map, &parse_field("x-a", "2")).is_ok());
        assert_eq!(header_all(&map, name("X-A").as_ref()), vec!["1", "2"]);
        assert_eq!(
            header_first(&map, name("x-a").as_ref()).as_deref(),
            Some("1")
        );
        assert!(set_header(&mut map, &parse_field("bad name", "v")).is_err());
        assert!(set_header(&mut map, &parse_field("x-b", "line\nbreak")).is_err());
        assert_eq!(header_first(&map, name("bad name").as_ref()), None);
        remove_header(&mut map, name("x-a").as_ref());
        assert!(map.is_empty());
        let list = vec![("b".to_string(), "1".to_string()), ("a".into(), "2".into())];
        let map = headers_from_list(list).expect("valid");
        assert_eq!(headers_to_list(&map).len(), 2);
        assert!(headers_from_list(vec![("".into(), "x".into())]).is_err());
    }

    #[test]
    fn urls_must_be_path_and_query() {
        assert_eq!(
            parse_path_and_query("/a?b=c").map(|u| path_and_query(&u).to_string()),
            Ok("/a?b=c".to_string())
        );
        assert!(parse_path_and_query("a").is_err());
        assert!(parse_path_and_query("/a b").is_err());
        assert!(parse_path_and_query("").is_err());
        let absolute: Uri = "http://example.com/x?y".parse().expect("valid");
        assert_eq!(path_and_query(&absolute), "/x?y");
    }
}

//! [`Request`] and [`Response`]: the host's handles during a hook, or local
//! values in native unit tests.

use std::cell::RefCell;
use std::fmt;
use std::mem::ManuallyDrop;

use crate::Error;
use crate::bindings::inlay::policy::types as wit;

/// HTTP header fields in order, as `(name, value)` pairs; names are
/// lower-case.
pub type Headers = Vec<(String, String)>;

/// The client's request.
///
/// During a hook it is the host's request: every call goes to the host, and
/// edits made in [`on_request`](crate::Policy::on_request) are what the cache
/// key and the backend request use. In native unit tests, build a local one
/// with [`Request::new_local`] or [`Request::builder`]; it checks edits the
/// way the host does.
///
/// ```
/// use inlay_policy::Request;
///
/// let req = Request::builder()
///     .method("GET")
///     .url("/shop?id=7")
///     .header("Cookie", "session=abc; theme=dark")
///     .client_ip("192.0.2.1")
///     .build();
/// assert_eq!(req.path(), "/shop");
/// assert_eq!(req.query().as_deref(), Some("id=7"));
/// assert_eq!(req.cookie("theme").as_deref(), Some("dark"));
/// req.set_header("x-shop", "1").unwrap();
/// assert_eq!(req.header("X-Shop").as_deref(), Some("1"));
/// ```
pub struct Request {
    inner: RequestInner,
    /// What this handle added to the cache key, for tests and logging.
    cache_key_data: RefCell<Vec<String>>,
}

enum RequestInner {
    /// An alias of the host's borrowed handle; never dropped, because the
    /// generated glue drops the borrow itself when the hook returns.
    Host(ManuallyDrop<wit::Request>),
    /// An in-memory request for tests.
    Local(RefCell<LocalRequest>),
}

struct LocalRequest {
    method: String,
    url: String,
    headers: Headers,
    client_ip: String,
    backend: String,
    known_backends: Option<Vec<String>>,
}

impl Request {
    /// Wrap the host's borrowed request for the duration of one hook call.
    #[allow(unsafe_code)]
    pub(crate) fn from_host(request: &wit::Request) -> Request {
        // SAFETY: the alias is kept in a `ManuallyDrop`, so it never drops
        // the handle (the generated glue owns and drops the borrow), and the
        // wrapper is created and dropped inside the hook call that lends
        // `request` (see `glue`); policies only ever see `&Request`, so it
        // cannot outlive the borrow.
        let alias = unsafe { wit::Request::from_handle(request.handle()) };
        Request {
            inner: RequestInner::Host(ManuallyDrop::new(alias)),
            cache_key_data: RefCell::new(Vec::new()),
        }
    }

    /// A local request for unit tests, with no headers, client IP
    /// `127.0.0.1` and backend `default`.
    pub fn new_local(method: &str, url: &str) -> Request {
        Request::builder().method(method).url(url).build()
    }

    /// Build a local request for unit tests.
    pub fn builder() -> RequestBuilder {
        RequestBuilder {
            local: LocalRequest {
                method: "GET".to_owned(),
                url: "/".to_owned(),
                headers: Vec::new(),
                client_ip: "127.0.0.1".to_owned(),
                backend: "default".to_owned(),
                known_backends: None,
            },
        }
    }

    /// The method, for example `GET`.
    pub fn method(&self) -> String {
        match &self.inner {
            RequestInner::Host(h) => h.method(),
            RequestInner::Local(l) => l.borrow().method.clone(),
        }
    }

    /// Replace the method.
    pub fn set_method(&self, method: &str) {
        match &self.inner {
            RequestInner::Host(h) => h.set_method(method),
            RequestInner::Local(l) => l.borrow_mut().method = method.to_owned(),
        }
    }

    /// The path and query, for example `/a/b?c=d`.
    pub fn url(&self) -> String {
        match &self.inner {
            RequestInner::Host(h) => h.url(),
            RequestInner::Local(l) => l.borrow().url.clone(),
        }
    }

    /// Replace the path and query; it must start with `/`.
    pub fn set_url(&self, url: &str) -> Result<(), Error> {
        match &self.inner {
            RequestInner::Host(h) => h.set_url(url).map_err(Error::InvalidUrl),
            RequestInner::Local(l) => {
                check_url(url)?;
                l.borrow_mut().url = url.to_owned();
                Ok(())
            }
        }
    }

    /// The path: the URL up to `?`.
    pub fn path(&self) -> String {
        let url = self.url();
        match url.split_once('?') {
            Some((path, _)) => path.to_owned(),
            None => url,
        }
    }

    /// The query: the URL after the first `?`, if there is one.
    pub fn query(&self) -> Option<String> {
        self.url()
            .split_once('?')
            .map(|(_, query)| query.to_owned())
    }

    /// The built-in recv's decision (see [`crate::builtin::recv`]): the
    /// host's answer in one call, rather than the method and two headers.
    pub(crate) fn builtin_lookup(&self) -> bool {
        match &self.inner {
            RequestInner::Host(h) => crate::bindings::inlay::policy::sdk::builtin_recv_lookup(h),
            RequestInner::Local(_) => {
                crate::builtin::is_lookup_method(&self.method())
                    && !crate::builtin::has_credentials(self)
            }
        }
    }

    /// The first value of a header, if present (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<String> {
        match &self.inner {
            RequestInner::Host(h) => h.header(name),
            RequestInner::Local(l) => first(&l.borrow().headers, name).map(str::to_owned),
        }
    }

    /// Every value of a header, in order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        match &self.inner {
            RequestInner::Host(h) => h.header_all(name),
            RequestInner::Local(l) => all(&l.borrow().headers, name),
        }
    }

    /// All header fields, in order.
    pub fn headers(&self) -> Headers {
        match &self.inner {
            RequestInner::Host(h) => h.headers(),
            RequestInner::Local(l) => l.borrow().headers.clone(),
        }
    }

    /// Set a header, replacing any existing values.
    pub fn set_header(&self, name: &str, value: &str) -> Result<(), Error> {
        match &self.inner {
            RequestInner::Host(h) => h.set_header(name, value).map_err(Error::InvalidHeader),
            RequestInner::Local(l) => set(&mut l.borrow_mut().headers, name, value),
        }
    }

    /// Add a header value, keeping existing ones.
    pub fn append_header(&self, name: &str, value: &str) -> Result<(), Error> {
        match &self.inner {
            RequestInner::Host(h) => h.append_header(name, value).map_err(Error::InvalidHeader),
            RequestInner::Local(l) => append(&mut l.borrow_mut().headers, name, value),
        }
    }

    /// Remove every value of a header.
    pub fn remove_header(&self, name: &str) {
        match &self.inner {
            RequestInner::Host(h) => h.remove_header(name),
            RequestInner::Local(l) => remove(&mut l.borrow_mut().headers, name),
        }
    }

    /// The value of a cookie from the `Cookie` header(s), if present.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.header_all("cookie").iter().find_map(|line| {
            cookie_pairs(line)
                .find(|pair| cookie_name(pair) == name)
                .map(|pair| {
                    pair.split_once('=')
                        .map_or("", |(_, v)| v.trim())
                        .to_owned()
                })
        })
    }

    /// Remove a cookie from the `Cookie` header, keeping the others in
    /// order; the header goes away when no cookie is left. Returns whether
    /// the cookie was there.
    pub fn remove_cookie(&self, name: &str) -> bool {
        let lines = self.header_all("cookie");
        let mut found = false;
        let mut kept = Vec::new();
        for pair in lines.iter().flat_map(|line| cookie_pairs(line)) {
            if cookie_name(pair) == name {
                found = true;
            } else {
                kept.push(pair);
            }
        }
        if found {
            if kept.is_empty() {
                self.remove_header("cookie");
            } else if self.set_header("cookie", &kept.join("; ")).is_err() {
                // The pieces came from a valid header, so the host cannot
                // refuse them; drop the header rather than keep the cookie.
                self.remove_header("cookie");
            }
        }
        found
    }

    /// The client's IP address as text.
    pub fn client_ip(&self) -> String {
        match &self.inner {
            RequestInner::Host(h) => h.client_ip(),
            RequestInner::Local(l) => l.borrow().client_ip.clone(),
        }
    }

    /// The backend this request will go to.
    pub fn backend(&self) -> String {
        match &self.inner {
            RequestInner::Host(h) => h.backend(),
            RequestInner::Local(l) => l.borrow().backend.clone(),
        }
    }

    /// Choose a configured backend by name; unknown names are refused.
    pub fn set_backend(&self, name: &str) -> Result<(), Error> {
        match &self.inner {
            RequestInner::Host(h) => h.set_backend(name).map_err(Error::UnknownBackend),
            RequestInner::Local(l) => {
                let mut local = l.borrow_mut();
                let known = match &local.known_backends {
                    Some(known) => known.iter().any(|b| b == name),
                    None => !name.is_empty(),
                };
                if !known {
                    return Err(Error::UnknownBackend(format!("no backend named {name:?}")));
                }
                local.backend = name.to_owned();
                Ok(())
            }
        }
    }

    /// Add data to the cache key (Varnish's `hash_data`): requests that
    /// differ in it are cached apart.
    pub fn add_to_cache_key(&self, data: &str) {
        if let RequestInner::Host(h) = &self.inner {
            h.add_to_cache_key(data);
        }
        self.cache_key_data.borrow_mut().push(data.to_owned());
    }

    /// What was added with [`add_to_cache_key`](Self::add_to_cache_key)
    /// through this value (for a host request: during this hook call).
    pub fn cache_key_data(&self) -> Vec<String> {
        self.cache_key_data.borrow().clone()
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method())
            .field("url", &self.url())
            .field("headers", &self.headers())
            .finish_non_exhaustive()
    }
}

/// Builds a local [`Request`] for unit tests; see [`Request::builder`].
#[derive(Debug)]
pub struct RequestBuilder {
    local: LocalRequest,
}

impl fmt::Debug for LocalRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl RequestBuilder {
    /// The method (default `GET`).
    pub fn method(mut self, method: &str) -> Self {
        method.clone_into(&mut self.local.method);
        self
    }

    /// The path and query (default `/`).
    pub fn url(mut self, url: &str) -> Self {
        url.clone_into(&mut self.local.url);
        self
    }

    /// Add a header field (the name is lower-cased, as the host does).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.local
            .headers
            .push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }

    /// The client IP (default `127.0.0.1`).
    pub fn client_ip(mut self, ip: &str) -> Self {
        ip.clone_into(&mut self.local.client_ip);
        self
    }

    /// The current backend (default `default`).
    pub fn backend(mut self, name: &str) -> Self {
        name.clone_into(&mut self.local.backend);
        self
    }

    /// The configured backend names [`Request::set_backend`] accepts
    /// (default: any non-empty name).
    pub fn known_backends<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Self {
        self.local.known_backends = Some(names.into_iter().map(str::to_owned).collect());
        self
    }

    /// The request.
    pub fn build(self) -> Request {
        Request {
            inner: RequestInner::Local(RefCell::new(self.local)),
            cache_key_data: RefCell::new(Vec::new()),
        }
    }
}

/// A response: from the backend in
/// [`on_backend_response`](crate::Policy::on_backend_response), or the one
/// about to be delivered in [`on_deliver`](crate::Policy::on_deliver).
///
/// ```
/// use inlay_policy::Response;
///
/// let resp = Response::builder().status(200).header("Server", "nginx").build();
/// resp.remove_header("server");
/// resp.set_status(404).unwrap();
/// assert_eq!((resp.status(), resp.header("server")), (404, None));
/// assert!(resp.set_status(42).is_err());
/// ```
pub struct Response {
    inner: ResponseInner,
}

enum ResponseInner {
    /// An alias of the host's borrowed handle; see [`RequestInner::Host`].
    Host(ManuallyDrop<wit::Response>),
    /// An in-memory response for tests.
    Local(RefCell<LocalResponse>),
}

struct LocalResponse {
    status: u16,
    headers: Headers,
}

impl Response {
    /// Wrap the host's borrowed response for the duration of one hook call.
    #[allow(unsafe_code)]
    pub(crate) fn from_host(response: &wit::Response) -> Response {
        // SAFETY: as in `Request::from_host`: never dropped, and confined to
        // the hook call that lends `response`.
        let alias = unsafe { wit::Response::from_handle(response.handle()) };
        Response {
            inner: ResponseInner::Host(ManuallyDrop::new(alias)),
        }
    }

    /// A local response for unit tests, with no headers.
    pub fn new_local(status: u16) -> Response {
        Response::builder().status(status).build()
    }

    /// Build a local response for unit tests.
    pub fn builder() -> ResponseBuilder {
        ResponseBuilder {
            status: 200,
            headers: Vec::new(),
        }
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        match &self.inner {
            ResponseInner::Host(h) => h.status(),
            ResponseInner::Local(l) => l.borrow().status,
        }
    }

    /// Replace the status code (100-999).
    pub fn set_status(&self, status: u16) -> Result<(), Error> {
        match &self.inner {
            ResponseInner::Host(h) => h.set_status(status).map_err(Error::InvalidStatus),
            ResponseInner::Local(l) => {
                if !(100..=999).contains(&status) {
                    return Err(Error::InvalidStatus(format!("{status} is outside 100-999")));
                }
                l.borrow_mut().status = status;
                Ok(())
            }
        }
    }

    /// The first value of a header, if present (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<String> {
        match &self.inner {
            ResponseInner::Host(h) => h.header(name),
            ResponseInner::Local(l) => first(&l.borrow().headers, name).map(str::to_owned),
        }
    }

    /// Every value of a header, in order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        match &self.inner {
            ResponseInner::Host(h) => h.header_all(name),
            ResponseInner::Local(l) => all(&l.borrow().headers, name),
        }
    }

    /// All header fields, in order.
    pub fn headers(&self) -> Headers {
        match &self.inner {
            ResponseInner::Host(h) => h.headers(),
            ResponseInner::Local(l) => l.borrow().headers.clone(),
        }
    }

    /// Set a header, replacing any existing values.
    pub fn set_header(&self, name: &str, value: &str) -> Result<(), Error> {
        match &self.inner {
            ResponseInner::Host(h) => h.set_header(name, value).map_err(Error::InvalidHeader),
            ResponseInner::Local(l) => set(&mut l.borrow_mut().headers, name, value),
        }
    }

    /// Add a header value, keeping existing ones (for example `Set-Cookie`).
    pub fn append_header(&self, name: &str, value: &str) -> Result<(), Error> {
        match &self.inner {
            ResponseInner::Host(h) => h.append_header(name, value).map_err(Error::InvalidHeader),
            ResponseInner::Local(l) => append(&mut l.borrow_mut().headers, name, value),
        }
    }

    /// Remove every value of a header.
    pub fn remove_header(&self, name: &str) {
        match &self.inner {
            ResponseInner::Host(h) => h.remove_header(name),
            ResponseInner::Local(l) => remove(&mut l.borrow_mut().headers, name),
        }
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status())
            .field("headers", &self.headers())
            .finish()
    }
}

/// Builds a local [`Response`] for unit tests; see [`Response::builder`].
#[derive(Debug)]
pub struct ResponseBuilder {
    status: u16,
    headers: Headers,
}

impl ResponseBuilder {
    /// The status code (default 200).
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Add a header field (the name is lower-cased, as the host does).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }

    /// The response.
    pub fn build(self) -> Response {
        Response {
            inner: ResponseInner::Local(RefCell::new(LocalResponse {
                status: self.status,
                headers: self.headers,
            })),
        }
    }
}

/// The first value of header `name` (case-insensitive).
pub(crate) fn first<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn all(headers: &[(String, String)], name: &str) -> Vec<String> {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
        .collect()
}

fn set(headers: &mut Headers, name: &str, value: &str) -> Result<(), Error> {
    check_header(name, value)?;
    remove(headers, name);
    headers.push((name.to_ascii_lowercase(), value.to_owned()));
    Ok(())
}

fn append(headers: &mut Headers, name: &str, value: &str) -> Result<(), Error> {
    check_header(name, value)?;
    headers.push((name.to_ascii_lowercase(), value.to_owned()));
    Ok(())
}

fn remove(headers: &mut Headers, name: &str) {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
}

/// The checks the host makes (RFC 9110 token names; no CR, LF or NUL in
/// values), so tests catch what the host would refuse.
fn check_header(name: &str, value: &str) -> Result<(), Error> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(Error::InvalidHeader(format!("bad header name {name:?}")));
    }
    if value.contains(['\r', '\n', '\0']) {
        return Err(Error::InvalidHeader(format!(
            "bad value for header {name:?}"
        )));
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), Error> {
    if !url.starts_with('/')
        || url
            .chars()
            .any(|c| c.is_ascii_whitespace() || c.is_control())
    {
        return Err(Error::InvalidUrl(format!(
            "{url:?} is not a path and query starting with '/'"
        )));
    }
    Ok(())
}

/// The trimmed `name=value` pieces of one `Cookie` header line (RFC 6265
/// `; ` list).
fn cookie_pairs(line: &str) -> impl Iterator<Item = &str> {
    line.split(';')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
}

/// The name of one `name=value` piece (the whole piece if it has no `=`).
fn cookie_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_case_insensitive_and_ordered() {
        let req = Request::builder()
            .header("Accept", "a")
            .header("X-Y", "1")
            .header("x-y", "2")
            .build();
        assert_eq!(req.header_all("X-y"), ["1", "2"]);
        req.set_header("X-Y", "3").unwrap();
        assert_eq!(
            req.headers(),
            [("accept".into(), "a".into()), ("x-y".into(), "3".into())]
        );
        req.append_header("accept", "b").unwrap();
        assert_eq!(req.header_all("accept"), ["a", "b"]);
        req.remove_header("ACCEPT");
        assert_eq!(req.header("accept"), None);
    }

    #[test]
    fn invalid_edits_are_refused_like_the_host() {
        let req = Request::new_local("GET", "/");
        assert!(matches!(
            req.set_header("bad name", "v"),
            Err(Error::InvalidHeader(_))
        ));
        assert!(matches!(
            req.set_header("x", "a\r\nb: c"),
            Err(Error::InvalidHeader(_))
        ));
        assert!(matches!(req.set_url("no-slash"), Err(Error::InvalidUrl(_))));
        assert_eq!(req.url(), "/");
        let req = Request::builder().known_backends(["a", "b"]).build();
        assert!(matches!(
            req.set_backend("c"),
            Err(Error::UnknownBackend(_))
        ));
        req.set_backend("b").unwrap();
        assert_eq!(req.backend(), "b");
    }

    #[test]
    fn cookies_are_read_and_removed() {
        let req = Request::builder()
            .header("cookie", "a=1; inlay_ab=b")
            .header("cookie", "c=3")
            .build();
        assert_eq!(req.cookie("inlay_ab").as_deref(), Some("b"));
        assert_eq!(req.cookie("c").as_deref(), Some("3"));
        assert_eq!(req.cookie("zz"), None);
        assert!(req.remove_cookie("inlay_ab"));
        assert_eq!(req.header_all("cookie"), ["a=1; c=3"]);
        assert!(!req.remove_cookie("inlay_ab"));
        assert!(req.remove_cookie("a"));
        assert!(req.remove_cookie("c"));
        assert_eq!(req.header("cookie"), None);
    }

    #[test]
    fn cache_key_data_is_recorded() {
        let req = Request::new_local("GET", "/");
        req.add_to_cache_key("a");
        req.add_to_cache_key("b");
        assert_eq!(req.cache_key_data(), ["a", "b"]);
    }

    #[test]
    fn path_and_query_split_at_first_question_mark() {
        let req = Request::new_local("GET", "/p?a=1?b");
        assert_eq!(req.path(), "/p");
        assert_eq!(req.query().as_deref(), Some("a=1?b"));
        assert_eq!(Request::new_local("GET", "/p").query(), None);
    }
}

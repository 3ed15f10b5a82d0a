package policy

import "strings"

// Request is the client's request, borrowed for the duration of a hook.
// Changes made in OnRequest are what the cache key and the backend
// request use. Header names are case-insensitive; edits the host refuses
// (a bad name or value) return an error.
type Request struct {
	h RequestHost
}

// NewRequest wraps a Host's request (package policytest makes them).
func NewRequest(h RequestHost) *Request { return &Request{h: h} }

// Method returns the method, for example "GET".
func (r *Request) Method() string { return r.h.Method() }

// SetMethod replaces the method.
func (r *Request) SetMethod(method string) { r.h.SetMethod(method) }

// URL returns the path and query, for example "/a/b?c=d".
func (r *Request) URL() string { return r.h.URL() }

// SetURL replaces the path and query; it must start with "/".
func (r *Request) SetURL(url string) error { return r.h.SetURL(url) }

// Path returns the URL's path (before the first "?").
func (r *Request) Path() string {
	path, _, _ := strings.Cut(r.h.URL(), "?")
	return path
}

// Query returns the URL's query (after the first "?"), if it has one.
func (r *Request) Query() (string, bool) {
	_, query, found := strings.Cut(r.h.URL(), "?")
	return query, found
}

// Header returns the first value of a header.
func (r *Request) Header(name string) (string, bool) { return r.h.Header(name) }

// HeaderAll returns every value of a header, in order.
func (r *Request) HeaderAll(name string) []string { return r.h.HeaderAll(name) }

// Headers returns every header field, names in lower case.
func (r *Request) Headers() []Header { return r.h.Headers() }

// SetHeader sets a header, replacing its values.
func (r *Request) SetHeader(name, value string) error { return r.h.SetHeader(name, value) }

// AppendHeader adds a header value, keeping the others.
func (r *Request) AppendHeader(name, value string) error { return r.h.AppendHeader(name, value) }

// RemoveHeader removes every value of a header.
func (r *Request) RemoveHeader(name string) { r.h.RemoveHeader(name) }

// ClientIP returns the client's IP address as text.
func (r *Request) ClientIP() string { return r.h.ClientIP() }

// Backend returns the backend this request will go to.
func (r *Request) Backend() string { return r.h.Backend() }

// SetBackend chooses a configured backend by name.
func (r *Request) SetBackend(name string) error { return r.h.SetBackend(name) }

// AddToCacheKey adds data to the cache key (Varnish's hash_data).
func (r *Request) AddToCacheKey(data string) { r.h.AddToCacheKey(data) }

// Cookie returns the value of the first cookie called name.
func (r *Request) Cookie(name string) (string, bool) {
	for _, line := range r.h.HeaderAll("cookie") {
		for _, pair := range cookiePairs(line) {
			if cookieName(pair) == name {
				_, value, _ := strings.Cut(pair, "=")
				return trimSpace(value), true
			}
		}
	}
	return "", false
}

// RemoveCookie removes every cookie called name, keeping the others in
// order in one Cookie line (the header goes when none is left), and
// reports whether there was one.
func (r *Request) RemoveCookie(name string) bool {
	var kept []string
	found := false
	for _, line := range r.h.HeaderAll("cookie") {
		for _, pair := range cookiePairs(line) {
			if cookieName(pair) == name {
				found = true
			} else {
				kept = append(kept, pair)
			}
		}
	}
	if found {
		// The pieces came from a valid header; if the host refuses the new
		// line anyway, drop the header rather than keep the cookie.
		if len(kept) == 0 || r.h.SetHeader("cookie", strings.Join(kept, "; ")) != nil {
			r.h.RemoveHeader("cookie")
		}
	}
	return found
}

// trimSpace trims Unicode White_Space, as Rust's str::trim does, so that
// cookies parse the same in every SDK.
func trimSpace(s string) string {
	return strings.TrimFunc(s, isWhiteSpace)
}

func isWhiteSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

// cookiePairs splits a Cookie line into its trimmed, non-empty pieces.
func cookiePairs(line string) []string {
	var pairs []string
	for _, piece := range strings.Split(line, ";") {
		if piece = trimSpace(piece); piece != "" {
			pairs = append(pairs, piece)
		}
	}
	return pairs
}

// cookieName is a piece's name: before "=", trimmed; or the whole piece.
func cookieName(pair string) string {
	name, _, found := strings.Cut(pair, "=")
	if !found {
		return pair
	}
	return trimSpace(name)
}

// Response is a response, borrowed for the duration of a hook: from the
// backend in OnBackendResponse, the one about to be delivered in
// OnDeliver.
type Response struct {
	h ResponseHost
}

// NewResponse wraps a Host's response (package policytest makes them).
func NewResponse(h ResponseHost) *Response { return &Response{h: h} }

// Status returns the status code.
func (r *Response) Status() uint16 { return r.h.Status() }

// SetStatus replaces the status code (100-999).
func (r *Response) SetStatus(status uint16) error { return r.h.SetStatus(status) }

// Header returns the first value of a header.
func (r *Response) Header(name string) (string, bool) { return r.h.Header(name) }

// HeaderAll returns every value of a header, in order.
func (r *Response) HeaderAll(name string) []string { return r.h.HeaderAll(name) }

// Headers returns every header field, names in lower case.
func (r *Response) Headers() []Header { return r.h.Headers() }

// SetHeader sets a header, replacing its values.
func (r *Response) SetHeader(name, value string) error { return r.h.SetHeader(name, value) }

// AppendHeader adds a header value, keeping the others.
func (r *Response) AppendHeader(name, value string) error { return r.h.AppendHeader(name, value) }

// RemoveHeader removes every value of a header.
func (r *Response) RemoveHeader(name string) { r.h.RemoveHeader(name) }

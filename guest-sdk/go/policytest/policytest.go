// Package policytest is an in-memory Inlay host for testing policies
// natively, with go test and no build to WebAssembly: requests and
// responses with the host's rules for header names, values, URLs and
// statuses, and the capabilities (log, config, clock, kv, cache, ESI,
// fetch) recorded in a Host.
//
//	func TestStripsTracking(t *testing.T) {
//		policytest.Install(t)
//		req := policytest.NewRequest("GET", "/?utm_source=x")
//		policy.RunOnRequest(req.Policy())
//		if got := req.URL(); got != "/" {
//			t.Fatalf("url %q", got)
//		}
//	}
//
// policy.RunOnRequest, RunOnBackendResponse and RunOnDeliver run the
// policy registered with policy.Export, as the component does.
package policytest

import (
	"fmt"
	"strings"
	"testing"

	"example.invalid/inlay/guest-sdk/go/policy"
)

// Line is one log line the policy wrote.
type Line struct {
	Level   policy.Level
	Message string
}

// Host is what the capabilities see and record. Set its fields before a
// hook runs; read them after.
type Host struct {
	// Logs holds the log lines, in order.
	Logs []Line
	// Settings is the policy's [policy.config].
	Settings map[string]string
	// NowMS is the wall clock's reading.
	NowMS uint64
	// KV is the policy's key-value store.
	KV map[string][]byte
	// Cache holds objects by host + url.
	Cache map[string]policy.CachedObject
	// Fetcher answers subrequests; nil fails them with connect-failed.
	Fetcher func(req policy.FetchRequest) (*policy.FetchResponse, error)
	// ESI is whether the policy turned ESI on (nil: it did not say).
	ESI *bool
	// ESIVars holds the variables the policy set.
	ESIVars map[string]string
	// DefaultHooks lists the hooks whose SDK default ran, each once.
	DefaultHooks []policy.Hook
}

// Install makes a fresh Host the one the policy package calls, until the
// test ends.
func Install(t testing.TB) *Host {
	h := &Host{
		Settings: map[string]string{},
		NowMS:    1_700_000_000_000,
		KV:       map[string][]byte{},
		Cache:    map[string]policy.CachedObject{},
		ESIVars:  map[string]string{},
	}
	previous := policy.SetHost(h)
	t.Cleanup(func() { policy.SetHost(previous) })
	return h
}

// Log records a line.
func (h *Host) Log(level policy.Level, message string) {
	h.Logs = append(h.Logs, Line{Level: level, Message: message})
}

// Config reads Settings.
func (h *Host) Config(key string) (string, bool) {
	v, ok := h.Settings[key]
	return v, ok
}

// ConfigAll returns Settings.
func (h *Host) ConfigAll() []policy.Header {
	out := make([]policy.Header, 0, len(h.Settings))
	for k, v := range h.Settings {
		out = append(out, policy.Header{Name: k, Value: v})
	}
	return out
}

// NowUnixMS returns NowMS.
func (h *Host) NowUnixMS() uint64 { return h.NowMS }

// SetESI records the choice in ESI.
func (h *Host) SetESI(enabled bool) { h.ESI = &enabled }

// SetESIVar records a variable in ESIVars.
func (h *Host) SetESIVar(name, value string) { h.ESIVars[name] = value }

// KVGet reads KV.
func (h *Host) KVGet(key string) ([]byte, bool, error) {
	v, ok := h.KV[key]
	return v, ok, nil
}

// KVSet writes KV.
func (h *Host) KVSet(key string, value []byte) error {
	h.KV[key] = append([]byte(nil), value...)
	return nil
}

// KVDelete deletes from KV.
func (h *Host) KVDelete(key string) (bool, error) {
	_, ok := h.KV[key]
	delete(h.KV, key)
	return ok, nil
}

// CacheLookup reads Cache.
func (h *Host) CacheLookup(host, url string) (*policy.CachedObject, error) {
	if o, ok := h.Cache[host+url]; ok {
		return &o, nil
	}
	return nil, nil
}

// CacheInsert writes Cache.
func (h *Host) CacheInsert(host, url string, obj policy.NewObject) error {
	if host == "" || !strings.HasPrefix(url, "/") {
		return &policy.Error{Code: policy.ErrInvalid.Code, Message: "host and a url starting with / are needed"}
	}
	h.Cache[host+url] = policy.CachedObject{Status: obj.Status, Headers: obj.Headers, Body: obj.Body, TTLLeft: obj.TTL}
	return nil
}

// PurgeURL removes one object from Cache.
func (h *Host) PurgeURL(host, url string, _ bool) (uint32, error) {
	if _, ok := h.Cache[host+url]; ok {
		delete(h.Cache, host+url)
		return 1, nil
	}
	return 0, nil
}

// PurgeKey purges nothing: Cache keeps no surrogate keys.
func (h *Host) PurgeKey(string, bool) (uint32, error) { return 0, nil }

// Fetch asks Fetcher.
func (h *Host) Fetch(req policy.FetchRequest) (*policy.FetchResponse, error) {
	if h.Fetcher == nil {
		return nil, &policy.Error{Code: policy.ErrConnectFailed.Code, Message: "policytest: no Fetcher"}
	}
	return h.Fetcher(req)
}

// FetchMany asks Fetcher for each request in turn.
func (h *Host) FetchMany(reqs []policy.FetchRequest) []policy.FetchResult {
	out := make([]policy.FetchResult, len(reqs))
	for i, req := range reqs {
		out[i].Response, out[i].Err = h.Fetch(req)
	}
	return out
}

// DefaultHook records the hook once.
func (h *Host) DefaultHook(hook policy.Hook) {
	for _, seen := range h.DefaultHooks {
		if seen == hook {
			return
		}
	}
	h.DefaultHooks = append(h.DefaultHooks, hook)
}

// --- header fields, with the host's rules -------------------------------------

// fields is a header list as the host keeps it: names lower-cased, in order.
type fields []policy.Header

func isToken(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func checkField(name, value string) error {
	if !isToken(name) {
		return policy.Refused(fmt.Sprintf("invalid header name %q", name))
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return policy.Refused(fmt.Sprintf("invalid value for header %q", name))
		}
	}
	return nil
}

func newFields(pairs []string) fields {
	if len(pairs)%2 != 0 {
		panic("policytest: headers come as name, value pairs")
	}
	var f fields
	for i := 0; i < len(pairs); i += 2 {
		if err := f.AppendHeader(pairs[i], pairs[i+1]); err != nil {
			panic("policytest: " + err.Error())
		}
	}
	return f
}

func (f *fields) Header(name string) (string, bool) {
	lower := strings.ToLower(name)
	for _, h := range *f {
		if h.Name == lower {
			return h.Value, true
		}
	}
	return "", false
}

func (f *fields) HeaderAll(name string) []string {
	lower := strings.ToLower(name)
	var out []string
	for _, h := range *f {
		if h.Name == lower {
			out = append(out, h.Value)
		}
	}
	return out
}

func (f *fields) Headers() []policy.Header { return append([]policy.Header(nil), *f...) }

// SetHeader replaces the values, at the place of the first one.
func (f *fields) SetHeader(name, value string) error {
	if err := checkField(name, value); err != nil {
		return err
	}
	lower := strings.ToLower(name)
	out := make(fields, 0, len(*f)+1)
	placed := false
	for _, h := range *f {
		if h.Name != lower {
			out = append(out, h)
		} else if !placed {
			out = append(out, policy.Header{Name: lower, Value: value})
			placed = true
		}
	}
	if !placed {
		out = append(out, policy.Header{Name: lower, Value: value})
	}
	*f = out
	return nil
}

func (f *fields) AppendHeader(name, value string) error {
	if err := checkField(name, value); err != nil {
		return err
	}
	*f = append(*f, policy.Header{Name: strings.ToLower(name), Value: value})
	return nil
}

func (f *fields) RemoveHeader(name string) {
	lower := strings.ToLower(name)
	out := (*f)[:0]
	for _, h := range *f {
		if h.Name != lower {
			out = append(out, h)
		}
	}
	*f = out
}

// --- the request and the response ------------------------------------------------

// Request is a client's request as the host keeps it; it implements
// policy.RequestHost, and Policy gives hooks their view of it.
type Request struct {
	fields
	method   string
	url      string
	clientIP string
	backend  string
	// Backends are the backends SetBackend accepts.
	Backends []string
	cacheKey []string
}

// NewRequest makes a request from 127.0.0.1 to the backend "default";
// headers come as name, value pairs.
func NewRequest(method, url string, headers ...string) *Request {
	return &Request{
		fields:   newFields(headers),
		method:   method,
		url:      url,
		clientIP: "127.0.0.1",
		backend:  "default",
		Backends: []string{"default"},
	}
}

// FromClient sets the client's IP address.
func (r *Request) FromClient(ip string) *Request {
	r.clientIP = ip
	return r
}

// Policy is the request as hooks see it.
func (r *Request) Policy() *policy.Request { return policy.NewRequest(r) }

// CacheKeyData is what the policy added to the cache key, in order.
func (r *Request) CacheKeyData() []string { return r.cacheKey }

// Method returns the method.
func (r *Request) Method() string { return r.method }

// SetMethod replaces the method.
func (r *Request) SetMethod(method string) { r.method = method }

// URL returns the path and query.
func (r *Request) URL() string { return r.url }

// SetURL replaces the path and query, as the host checks it.
func (r *Request) SetURL(url string) error {
	if !strings.HasPrefix(url, "/") {
		return policy.Refused(fmt.Sprintf("url must start with `/`: %q", url))
	}
	if strings.ContainsAny(url, "\"<>\\^`{|} \x7f") || strings.IndexFunc(url, func(r rune) bool { return r < 0x20 }) >= 0 {
		return policy.Refused(fmt.Sprintf("invalid url %q", url))
	}
	r.url = url
	return nil
}

// ClientIP returns the client's address.
func (r *Request) ClientIP() string { return r.clientIP }

// Backend returns the backend.
func (r *Request) Backend() string { return r.backend }

// SetBackend chooses one of Backends.
func (r *Request) SetBackend(name string) error {
	for _, b := range r.Backends {
		if b == name {
			r.backend = name
			return nil
		}
	}
	return policy.Refused(fmt.Sprintf("unknown backend %q", name))
}

// AddToCacheKey records data in CacheKeyData.
func (r *Request) AddToCacheKey(data string) { r.cacheKey = append(r.cacheKey, data) }

// Response is a response as the host keeps it; it implements
// policy.ResponseHost, and Policy gives hooks their view of it.
type Response struct {
	fields
	status uint16
}

// NewResponse makes a response; headers come as name, value pairs.
func NewResponse(status uint16, headers ...string) *Response {
	return &Response{fields: newFields(headers), status: status}
}

// Policy is the response as hooks see it.
func (r *Response) Policy() *policy.Response { return policy.NewResponse(r) }

// Status returns the status code.
func (r *Response) Status() uint16 { return r.status }

// SetStatus replaces the status code (100-999).
func (r *Response) SetStatus(status uint16) error {
	if status < 100 || status > 999 {
		return policy.Refused(fmt.Sprintf("invalid status %d: must be 100-999", status))
	}
	r.status = status
	return nil
}

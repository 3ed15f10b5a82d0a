package policy

import "strings"

// RequestHook is a policy's recv: inspect or rewrite the request, choose a
// backend, and decide lookup, pass or a synthetic answer.
type RequestHook interface {
	OnRequest(req *Request) Action
}

// BackendResponseHook sees the backend's answer before it is stored:
// edit its headers and status, and return how it is cached (settings
// holds the host's defaults).
type BackendResponseHook interface {
	OnBackendResponse(req *Request, resp *Response, settings CacheSettings) CacheSettings
}

// DeliverHook edits the response about to be delivered, from the cache
// or the backend.
type DeliverHook interface {
	OnDeliver(req *Request, resp *Response)
}

// Action is what OnRequest decides: Lookup, Pass or a synthetic response.
type Action struct {
	kind      actionKind
	synthetic *SyntheticResponse
}

type actionKind uint8

const (
	lookup actionKind = iota
	pass
	synthetic
)

// SyntheticResponse is a complete response made by the policy (Varnish's
// synth).
type SyntheticResponse struct {
	Status  uint16
	Headers []Header
	Body    []byte
}

// Lookup looks the request up in the cache.
func Lookup() Action { return Action{kind: lookup} }

// Pass goes to the backend without using or filling the cache.
func Pass() Action { return Action{kind: pass} }

// Synthetic answers at once with this response; the backend is not
// contacted. Header names are lower-cased.
func Synthetic(status uint16, body []byte, headers ...Header) Action {
	fields := make([]Header, len(headers))
	for i, h := range headers {
		fields[i] = Header{Name: strings.ToLower(h.Name), Value: h.Value}
	}
	return Action{kind: synthetic, synthetic: &SyntheticResponse{Status: status, Headers: fields, Body: body}}
}

// Redirect answers with a redirect at the edge (Location, empty body).
func Redirect(status uint16, location string) Action {
	return Synthetic(status, nil, Header{Name: "location", Value: location})
}

// IsLookup reports whether the action is Lookup.
func (a Action) IsLookup() bool { return a.kind == lookup }

// IsPass reports whether the action is Pass.
func (a Action) IsPass() bool { return a.kind == pass }

// Synthetic returns the synthetic response, or nil for Lookup and Pass.
func (a Action) Synthetic() *SyntheticResponse { return a.synthetic }

func (a Action) String() string {
	switch a.kind {
	case lookup:
		return "lookup"
	case pass:
		return "pass"
	}
	return "synthetic"
}

// CacheSettings is how the host will store a backend response; the host
// fills it from the response (RFC 9111, Surrogate-Control) and
// OnBackendResponse may change any field.
type CacheSettings struct {
	// Cacheable stores the response at all.
	Cacheable bool
	// TTL is the seconds the object is fresh.
	TTL uint32
	// Grace is the seconds after expiry it may be served stale while one
	// background fetch refreshes it.
	Grace uint32
	// Keep is the seconds after TTL+Grace it is kept for revalidation and
	// stale-if-error.
	Keep uint32
	// SurrogateKeys tag the object for purging by key.
	SurrogateKeys []string
	// ESI processes the body as ESI.
	ESI bool
}

// --- the built-in rules --------------------------------------------------------

// IsLookupMethod reports whether requests with this method are looked up
// (GET and HEAD; methods are case-sensitive).
func IsLookupMethod(method string) bool { return method == "GET" || method == "HEAD" }

// HasCredentials reports whether the request has an Authorization or
// Cookie header.
func HasCredentials(req *Request) bool {
	if _, ok := req.Header("authorization"); ok {
		return true
	}
	_, ok := req.Header("cookie")
	return ok
}

// BuiltinRecv is Varnish's built-in recv: Pass for methods other than GET
// and HEAD and for requests with credentials, else Lookup.
func BuiltinRecv(req *Request) Action {
	if h, ok := req.h.(builtinRecvHost); ok {
		if h.BuiltinRecvLookup() {
			return Lookup()
		}
		return Pass()
	}
	if !IsLookupMethod(req.Method()) || HasCredentials(req) {
		return Pass()
	}
	return Lookup()
}

// builtinRecvHost is a RequestHost that decides the built-in recv itself
// (the component's: one host call rather than the method and two headers).
type builtinRecvHost interface {
	// BuiltinRecvLookup reports whether the built-in recv looks the
	// request up.
	BuiltinRecvLookup() bool
}

// BuiltinBackendResponse keeps the host's settings (it applied RFC 9111).
func BuiltinBackendResponse(_ *Request, _ *Response, settings CacheSettings) CacheSettings {
	return settings
}

// BuiltinDeliver changes nothing.
func BuiltinDeliver(*Request, *Response) {}

// --- the exported hooks ------------------------------------------------------------

// exported is the policy Export registered; nil runs the built-in rules.
var exported any

// Export makes p the policy: the hooks it implements (RequestHook,
// BackendResponseHook, DeliverHook) run for every request; the others
// follow the built-in rules. Call it from an init function of package
// main: the host snapshots the policy after initialisation.
func Export(p any) {
	exported = p
}

// RunOnRequest runs the exported policy's OnRequest, or the built-in
// rules when it has none (telling the host, which then runs them itself).
// The component's export calls it; tests may too.
func RunOnRequest(req *Request) Action {
	if h, ok := exported.(RequestHook); ok {
		return h.OnRequest(req)
	}
	current().DefaultHook(HookOnRequest)
	return BuiltinRecv(req)
}

// RunOnBackendResponse runs the exported policy's OnBackendResponse, or
// the built-in rules.
func RunOnBackendResponse(req *Request, resp *Response, settings CacheSettings) CacheSettings {
	if h, ok := exported.(BackendResponseHook); ok {
		return h.OnBackendResponse(req, resp, settings)
	}
	current().DefaultHook(HookOnBackendResponse)
	return BuiltinBackendResponse(req, resp, settings)
}

// RunOnDeliver runs the exported policy's OnDeliver, or the built-in rules.
func RunOnDeliver(req *Request, resp *Response) {
	if h, ok := exported.(DeliverHook); ok {
		h.OnDeliver(req, resp)
		return
	}
	current().DefaultHook(HookOnDeliver)
	BuiltinDeliver(req, resp)
}

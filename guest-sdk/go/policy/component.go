//go:build wasip1

package policy

// The component's side: the Host on the generated bindings, and the
// handler exports wired to the Run functions.

import (
	"fmt"
	"os"
	"runtime/debug"

	witRuntime "go.bytecodealliance.org/pkg/wit/runtime"
	witTypes "go.bytecodealliance.org/pkg/wit/types"

	handler "example.invalid/inlay/guest-sdk/go/wit/exports/export_inlay_policy_handler"
	_ "example.invalid/inlay/guest-sdk/go/wit/exports/wit_exports" // the //go:wasmexport functions
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_cache"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_clock"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_config"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_esi"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_fetch"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_kv"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_log"
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_sdk"
	types "example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_types"
)

func init() {
	host = componentHost{}
	handler.Request = exportOnRequest
	handler.BackendResponse = exportOnBackendResponse
	handler.Deliver = exportOnDeliver
}

// done ends an export: the borrowed handles go back to the host (the
// canonical ABI traps a call that returns still holding them), and what
// the host's replies were allocated in is no longer pinned (the bindings'
// cabi_realloc pins every allocation until told; the Go values made from
// them keep what is still in use alive).
func done(req *types.Request, resp *types.Response) {
	req.Drop()
	if resp != nil {
		resp.Drop()
	}
	witRuntime.Unpin()
}

// recovered turns a panic in a hook into one log line (the panic and the
// stack), then traps: the host fails this request alone. Go's own report
// of an unrecovered panic would reach the log a piece at a time (the
// runtime writes each part of it separately to standard error).
func recovered(hook Hook) {
	if r := recover(); r != nil {
		host.Log(ErrorLevel, fmt.Sprintf("policy %s panicked: %v\n%s", hook, r, debug.Stack()))
		os.Exit(2) // proc_exit: a trap in the adapter
	}
}

func exportOnRequest(r *types.Request) types.RequestAction {
	defer done(r, nil)
	defer recovered(HookOnRequest)
	action := RunOnRequest(NewRequest(componentRequest{r}))
	switch action.kind {
	case lookup:
		return types.MakeRequestActionLookup()
	case pass:
		return types.MakeRequestActionPass()
	}
	s := action.synthetic
	return types.MakeRequestActionSynthetic(types.SyntheticResponse{
		Status:  s.Status,
		Headers: witHeaders(s.Headers),
		Body:    s.Body,
	})
}

func exportOnBackendResponse(r *types.Request, p *types.Response, settings types.CacheSettings) types.CacheSettings {
	defer done(r, p)
	defer recovered(HookOnBackendResponse)
	out := RunOnBackendResponse(NewRequest(componentRequest{r}), NewResponse(componentResponse{p}), CacheSettings{
		Cacheable:     settings.Cacheable,
		TTL:           settings.Ttl,
		Grace:         settings.Grace,
		Keep:          settings.Keep,
		SurrogateKeys: settings.SurrogateKeys,
		ESI:           settings.Esi,
	})
	return types.CacheSettings{
		Cacheable:     out.Cacheable,
		Ttl:           out.TTL,
		Grace:         out.Grace,
		Keep:          out.Keep,
		SurrogateKeys: out.SurrogateKeys,
		Esi:           out.ESI,
	}
}

func exportOnDeliver(r *types.Request, p *types.Response) {
	defer done(r, p)
	defer recovered(HookOnDeliver)
	RunOnDeliver(NewRequest(componentRequest{r}), NewResponse(componentResponse{p}))
}

// --- conversions ---------------------------------------------------------------

func witHeaders(headers []Header) []witTypes.Tuple2[string, string] {
	out := make([]witTypes.Tuple2[string, string], len(headers))
	for i, h := range headers {
		out[i] = witTypes.Tuple2[string, string]{F0: h.Name, F1: h.Value}
	}
	return out
}

func goHeaders(fields []witTypes.Tuple2[string, string]) []Header {
	out := make([]Header, len(fields))
	for i, f := range fields {
		out[i] = Header{Name: f.F0, Value: f.F1}
	}
	return out
}

func option(o witTypes.Option[string]) (string, bool) {
	if o.IsSome() {
		return o.Some(), true
	}
	return "", false
}

func refused(r witTypes.Result[witTypes.Unit, string]) error {
	if r.IsErr() {
		return Refused(r.Err())
	}
	return nil
}

// --- the request and the response --------------------------------------------------

type componentRequest struct{ r *types.Request }

// BuiltinRecvLookup asks the host for the built-in recv's decision.
func (c componentRequest) BuiltinRecvLookup() bool {
	return inlay_policy_sdk.BuiltinRecvLookup(c.r)
}

func (c componentRequest) Method() string                    { return c.r.Method() }
func (c componentRequest) SetMethod(method string)           { c.r.SetMethod(method) }
func (c componentRequest) URL() string                       { return c.r.Url() }
func (c componentRequest) SetURL(url string) error           { return refused(c.r.SetUrl(url)) }
func (c componentRequest) Header(name string) (string, bool) { return option(c.r.Header(name)) }
func (c componentRequest) HeaderAll(name string) []string    { return c.r.HeaderAll(name) }
func (c componentRequest) Headers() []Header                 { return goHeaders(c.r.Headers()) }
func (c componentRequest) SetHeader(name, value string) error {
	return refused(c.r.SetHeader(name, value))
}
func (c componentRequest) AppendHeader(name, value string) error {
	return refused(c.r.AppendHeader(name, value))
}
func (c componentRequest) RemoveHeader(name string)     { c.r.RemoveHeader(name) }
func (c componentRequest) ClientIP() string             { return c.r.ClientIp() }
func (c componentRequest) Backend() string              { return c.r.Backend() }
func (c componentRequest) SetBackend(name string) error { return refused(c.r.SetBackend(name)) }
func (c componentRequest) AddToCacheKey(data string)    { c.r.AddToCacheKey(data) }

type componentResponse struct{ r *types.Response }

func (c componentResponse) Status() uint16 { return c.r.Status() }
func (c componentResponse) SetStatus(status uint16) error {
	return refused(c.r.SetStatus(status))
}
func (c componentResponse) Header(name string) (string, bool) { return option(c.r.Header(name)) }
func (c componentResponse) HeaderAll(name string) []string    { return c.r.HeaderAll(name) }
func (c componentResponse) Headers() []Header                 { return goHeaders(c.r.Headers()) }
func (c componentResponse) SetHeader(name, value string) error {
	return refused(c.r.SetHeader(name, value))
}
func (c componentResponse) AppendHeader(name, value string) error {
	return refused(c.r.AppendHeader(name, value))
}
func (c componentResponse) RemoveHeader(name string) { c.r.RemoveHeader(name) }

// --- the capabilities -----------------------------------------------------------

type componentHost struct{}

func (componentHost) Log(level Level, message string) {
	inlay_policy_log.Write(inlay_policy_log.Level(level), message)
}

func (componentHost) Config(key string) (string, bool) {
	return option(inlay_policy_config.Get(key))
}

func (componentHost) ConfigAll() []Header { return goHeaders(inlay_policy_config.All()) }

func (componentHost) NowUnixMS() uint64 { return inlay_policy_clock.NowUnixMs() }

func (componentHost) SetESI(enabled bool) { inlay_policy_esi.SetEnabled(enabled) }

func (componentHost) SetESIVar(name, value string) { inlay_policy_esi.SetVar(name, value) }

func (componentHost) DefaultHook(hook Hook) {
	inlay_policy_sdk.DefaultHook(inlay_policy_sdk.Hook(hook))
}

func kvError(e inlay_policy_kv.KvError) error {
	switch e.Tag() {
	case inlay_policy_kv.KvError_Storage:
		return &Error{Code: ErrStorage.Code, Message: e.Storage()}
	case inlay_policy_kv.KvError_TooLarge:
		return ErrTooLarge
	}
	return ErrLimitExceeded
}

func (componentHost) KVGet(key string) ([]byte, bool, error) {
	r := inlay_policy_kv.Get(key)
	if r.IsErr() {
		return nil, false, kvError(r.Err())
	}
	value := r.Ok()
	if value.IsNone() {
		return nil, false, nil
	}
	return value.Some(), true, nil
}

func (componentHost) KVSet(key string, value []byte) error {
	if r := inlay_policy_kv.Set(key, value); r.IsErr() {
		return kvError(r.Err())
	}
	return nil
}

func (componentHost) KVDelete(key string) (bool, error) {
	r := inlay_policy_kv.Delete(key)
	if r.IsErr() {
		return false, kvError(r.Err())
	}
	return r.Ok(), nil
}

func cacheError(e inlay_policy_cache.CacheError) error {
	switch e.Tag() {
	case inlay_policy_cache.CacheError_Storage:
		return &Error{Code: ErrStorage.Code, Message: e.Storage()}
	case inlay_policy_cache.CacheError_Invalid:
		return &Error{Code: ErrInvalid.Code, Message: e.Invalid()}
	}
	return ErrLimitExceeded
}

func (componentHost) CacheLookup(host, url string) (*CachedObject, error) {
	r := inlay_policy_cache.Lookup(host, url)
	if r.IsErr() {
		return nil, cacheError(r.Err())
	}
	found := r.Ok()
	if found.IsNone() {
		return nil, nil
	}
	o := found.Some()
	return &CachedObject{
		Status: o.Status, Headers: goHeaders(o.Headers), Body: o.Body, Age: o.Age, TTLLeft: o.TtlLeft,
	}, nil
}

func (componentHost) CacheInsert(host, url string, obj NewObject) error {
	r := inlay_policy_cache.Insert(host, url, inlay_policy_cache.NewObject{
		Status:        obj.Status,
		Headers:       witHeaders(obj.Headers),
		Body:          obj.Body,
		Ttl:           obj.TTL,
		Grace:         obj.Grace,
		SurrogateKeys: obj.SurrogateKeys,
	})
	if r.IsErr() {
		return cacheError(r.Err())
	}
	return nil
}

func (componentHost) PurgeURL(host, url string, soft bool) (uint32, error) {
	r := inlay_policy_cache.PurgeUrl(host, url, soft)
	if r.IsErr() {
		return 0, cacheError(r.Err())
	}
	return r.Ok(), nil
}

func (componentHost) PurgeKey(key string, soft bool) (uint32, error) {
	r := inlay_policy_cache.PurgeKey(key, soft)
	if r.IsErr() {
		return 0, cacheError(r.Err())
	}
	return r.Ok(), nil
}

func witFetchRequest(req FetchRequest) inlay_policy_fetch.FetchRequest {
	backend := witTypes.None[string]()
	if req.Backend != "" {
		backend = witTypes.Some(req.Backend)
	}
	return inlay_policy_fetch.FetchRequest{
		Backend: backend,
		Method:  req.Method,
		Url:     req.URL,
		Headers: witHeaders(req.Headers),
		Body:    req.Body,
	}
}

func fetchResult(r witTypes.Result[inlay_policy_fetch.FetchResponse, inlay_policy_fetch.FetchError]) (*FetchResponse, error) {
	if r.IsErr() {
		e := r.Err()
		switch e.Tag() {
		case inlay_policy_fetch.FetchError_UnknownBackend:
			return nil, &Error{Code: ErrUnknownBackend.Code, Message: e.UnknownBackend()}
		case inlay_policy_fetch.FetchError_InvalidRequest:
			return nil, &Error{Code: ErrInvalidRequest.Code, Message: e.InvalidRequest()}
		case inlay_policy_fetch.FetchError_ConnectFailed:
			return nil, &Error{Code: ErrConnectFailed.Code, Message: e.ConnectFailed()}
		case inlay_policy_fetch.FetchError_Timeout:
			return nil, ErrTimeout
		case inlay_policy_fetch.FetchError_BodyTooLarge:
			return nil, ErrBodyTooLarge
		}
		return nil, ErrLimitExceeded
	}
	resp := r.Ok()
	return &FetchResponse{Status: resp.Status, Headers: goHeaders(resp.Headers), Body: resp.Body}, nil
}

func (componentHost) Fetch(req FetchRequest) (*FetchResponse, error) {
	return fetchResult(inlay_policy_fetch.Send(witFetchRequest(req)))
}

func (componentHost) FetchMany(reqs []FetchRequest) []FetchResult {
	wit := make([]inlay_policy_fetch.FetchRequest, len(reqs))
	for i, req := range reqs {
		wit[i] = witFetchRequest(req)
	}
	results := inlay_policy_fetch.SendMany(wit)
	out := make([]FetchResult, len(results))
	for i, r := range results {
		out[i].Response, out[i].Err = fetchResult(r)
	}
	return out
}

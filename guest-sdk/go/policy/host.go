package policy

import "fmt"

// Host is what the SDK runs on: the component's imports in WebAssembly,
// the in-memory host of package policytest elsewhere. Policies use the
// functions of this package (Log, Config, Fetch, ...), not a Host.
type Host interface {
	// Log writes one log line.
	Log(level Level, message string)
	// Config returns one setting of [policy.config].
	Config(key string) (string, bool)
	// ConfigAll returns every setting, in the host's order.
	ConfigAll() []Header
	// NowUnixMS reads the host's wall clock.
	NowUnixMS() uint64
	// SetESI turns ESI processing of the current response on or off.
	SetESI(enabled bool)
	// SetESIVar sets an ESI variable.
	SetESIVar(name, value string)
	// KVGet reads a value of the policy's key-value store.
	KVGet(key string) ([]byte, bool, error)
	// KVSet writes a value.
	KVSet(key string, value []byte) error
	// KVDelete deletes a value, reporting whether it existed.
	KVDelete(key string) (bool, error)
	// CacheLookup looks an object up by host and path+query.
	CacheLookup(host, url string) (*CachedObject, error)
	// CacheInsert inserts or replaces an object.
	CacheInsert(host, url string, obj NewObject) error
	// PurgeURL purges one URL's variants.
	PurgeURL(host, url string, soft bool) (uint32, error)
	// PurgeKey purges the objects tagged with a surrogate key.
	PurgeKey(key string, soft bool) (uint32, error)
	// Fetch sends one subrequest.
	Fetch(req FetchRequest) (*FetchResponse, error)
	// FetchMany sends subrequests in parallel.
	FetchMany(reqs []FetchRequest) []FetchResult
	// DefaultHook tells the host that the SDK's default for hook runs.
	DefaultHook(hook Hook)
}

// HeaderHost is a request's or response's header fields as a Host holds
// them.
type HeaderHost interface {
	Header(name string) (string, bool)
	HeaderAll(name string) []string
	Headers() []Header
	SetHeader(name, value string) error
	AppendHeader(name, value string) error
	RemoveHeader(name string)
}

// RequestHost is the client's request as a Host holds it (see Request).
type RequestHost interface {
	HeaderHost
	Method() string
	SetMethod(method string)
	URL() string
	SetURL(url string) error
	ClientIP() string
	Backend() string
	SetBackend(name string) error
	AddToCacheKey(data string)
}

// ResponseHost is a response as a Host holds it (see Response).
type ResponseHost interface {
	HeaderHost
	Status() uint16
	SetStatus(status uint16) error
}

// host is the current Host: the component's imports in WebAssembly.
var host Host

// SetHost replaces the Host the package's functions call (package
// policytest installs its in-memory host this way) and returns the
// previous one.
func SetHost(h Host) Host {
	previous := host
	host = h
	return previous
}

func current() Host {
	if host == nil {
		panic("policy: no host: in tests, install one with policytest.Install")
	}
	return host
}

// Hook names one of the handler interface's hooks.
type Hook uint8

// The hooks, in the order a request meets them.
const (
	HookOnRequest Hook = iota
	HookOnBackendResponse
	HookOnDeliver
)

func (h Hook) String() string {
	switch h {
	case HookOnRequest:
		return "on-request"
	case HookOnBackendResponse:
		return "on-backend-response"
	case HookOnDeliver:
		return "on-deliver"
	}
	return fmt.Sprintf("hook(%d)", uint8(h))
}

// Error is a host call's refusal: Code is the WIT error case
// ("limit-exceeded", "storage", "invalid", "too-large", "unknown-backend",
// "invalid-request", "connect-failed", "timeout", "body-too-large", or
// "refused" for a request or response edit), Message the host's words.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Is matches the Err values by Code, so that errors.Is(err,
// ErrLimitExceeded) holds whatever the message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// The error cases, for errors.Is.
var (
	// ErrLimitExceeded: the request's cap on host calls or subrequests.
	ErrLimitExceeded = &Error{Code: "limit-exceeded"}
	// ErrStorage: the cache or kv storage failed.
	ErrStorage = &Error{Code: "storage"}
	// ErrInvalid: a cache call's arguments were invalid.
	ErrInvalid = &Error{Code: "invalid"}
	// ErrTooLarge: a kv key or value is too large.
	ErrTooLarge = &Error{Code: "too-large"}
	// ErrUnknownBackend: no backend of that name is configured.
	ErrUnknownBackend = &Error{Code: "unknown-backend"}
	// ErrInvalidRequest: a subrequest was malformed.
	ErrInvalidRequest = &Error{Code: "invalid-request"}
	// ErrConnectFailed: connecting to a subrequest's backend failed.
	ErrConnectFailed = &Error{Code: "connect-failed"}
	// ErrTimeout: a subrequest's backend did not answer in time.
	ErrTimeout = &Error{Code: "timeout"}
	// ErrBodyTooLarge: a subrequest's body passed what a policy may buffer.
	ErrBodyTooLarge = &Error{Code: "body-too-large"}
	// ErrRefused: the host refused an edit of the request or response
	// (a bad header name or value, a relative URL, an unknown backend).
	ErrRefused = &Error{Code: "refused"}
)

// Refused is the error of a refused request or response edit.
func Refused(message string) error {
	return &Error{Code: ErrRefused.Code, Message: message}
}

// --- log -------------------------------------------------------------------

// Level is a log line's severity.
type Level uint8

// The levels, least severe first.
const (
	Trace Level = iota
	Debug
	Info
	Warn
	ErrorLevel
)

// Log writes one log line made of args, as fmt.Sprint joins them.
func Log(level Level, args ...any) {
	current().Log(level, fmt.Sprint(args...))
}

// Logf writes one log line formatted as fmt.Sprintf does.
func Logf(level Level, format string, args ...any) {
	current().Log(level, fmt.Sprintf(format, args...))
}

// --- config, clock, ESI ------------------------------------------------------

// Config returns one setting of the policy's [policy.config].
func Config(key string) (string, bool) {
	return current().Config(key)
}

// ConfigAll returns every setting of [policy.config].
func ConfigAll() map[string]string {
	all := current().ConfigAll()
	out := make(map[string]string, len(all))
	for _, kv := range all {
		out[kv.Name] = kv.Value
	}
	return out
}

// NowUnixMS reads the host's wall clock: milliseconds since the Unix
// epoch. time.Now reads the same clock.
func NowUnixMS() uint64 {
	return current().NowUnixMS()
}

// SetESI turns ESI processing of the current response on or off
// (overriding the origin's Surrogate-Control opt-in).
func SetESI(enabled bool) {
	current().SetESI(enabled)
}

// SetESIVar sets an ESI variable, readable as $(name) in the page.
func SetESIVar(name, value string) {
	current().SetESIVar(name, value)
}

// --- kv --------------------------------------------------------------------

// KVGet reads a value of the policy's own persistent key-value store.
func KVGet(key string) (value []byte, found bool, err error) {
	return current().KVGet(key)
}

// KVSet writes a value.
func KVSet(key string, value []byte) error {
	return current().KVSet(key, value)
}

// KVDelete deletes a value and reports whether it existed.
func KVDelete(key string) (bool, error) {
	return current().KVDelete(key)
}

// --- cache -----------------------------------------------------------------

// CachedObject is an object of the host's HTTP cache.
type CachedObject struct {
	Status  uint16
	Headers []Header
	Body    []byte
	// Age is the seconds since it was stored.
	Age uint32
	// TTLLeft is the seconds of freshness left (0 when stale).
	TTLLeft uint32
}

// NewObject is an object to insert into the cache.
type NewObject struct {
	Status        uint16
	Headers       []Header
	Body          []byte
	TTL           uint32
	Grace         uint32
	SurrogateKeys []string
}

// CacheLookup looks an object up by host and path+query; only fresh or
// in-grace objects are found (nil, nil otherwise).
func CacheLookup(host, url string) (*CachedObject, error) {
	return current().CacheLookup(host, url)
}

// CacheInsert inserts or replaces an object under host and path+query.
func CacheInsert(host, url string, obj NewObject) error {
	return current().CacheInsert(host, url, obj)
}

// PurgeURL purges one URL (all its variants); soft marks it stale instead.
// It returns how many objects were affected.
func PurgeURL(host, url string, soft bool) (uint32, error) {
	return current().PurgeURL(host, url, soft)
}

// PurgeKey purges every object tagged with a surrogate key.
func PurgeKey(key string, soft bool) (uint32, error) {
	return current().PurgeKey(key, soft)
}

// --- fetch -----------------------------------------------------------------

// FetchRequest is a subrequest to a configured backend.
type FetchRequest struct {
	// Backend is a backend name from the config; empty means the
	// request's backend.
	Backend string
	// Method is the method; empty means GET.
	Method string
	// URL is the path and query, starting with "/".
	URL     string
	Headers []Header
	Body    []byte
}

// FetchResponse is a subrequest's response.
type FetchResponse struct {
	Status  uint16
	Headers []Header
	Body    []byte
}

// FetchResult is one subrequest's outcome in FetchMany.
type FetchResult struct {
	Response *FetchResponse
	Err      error
}

// Fetch sends one subrequest through the host's fetcher.
func Fetch(req FetchRequest) (*FetchResponse, error) {
	return current().Fetch(req)
}

// FetchMany sends subrequests at once, in parallel; the results are in
// the same order.
func FetchMany(reqs []FetchRequest) []FetchResult {
	return current().FetchMany(reqs)
}

// --- headers -------------------------------------------------------------------

// Header is one header field (or one setting of ConfigAll).
type Header struct {
	Name  string
	Value string
}

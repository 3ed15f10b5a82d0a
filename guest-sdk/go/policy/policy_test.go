package policy_test

import (
	"errors"
	"reflect"
	"testing"

	"example.invalid/inlay/guest-sdk/go/policy"
	"example.invalid/inlay/guest-sdk/go/policytest"
)

func TestBuiltinRecv(t *testing.T) {
	policytest.Install(t)
	cases := []struct {
		req  *policytest.Request
		want string
	}{
		{policytest.NewRequest("GET", "/"), "lookup"},
		{policytest.NewRequest("HEAD", "/"), "lookup"},
		{policytest.NewRequest("get", "/"), "pass"},
		{policytest.NewRequest("POST", "/"), "pass"},
		{policytest.NewRequest("GET", "/", "Cookie", "s=1"), "pass"},
		{policytest.NewRequest("GET", "/", "authorization", "Basic x"), "pass"},
	}
	for _, c := range cases {
		if got := policy.BuiltinRecv(c.req.Policy()).String(); got != c.want {
			t.Errorf("%s %v: %s, want %s", c.req.Method(), c.req.Headers(), got, c.want)
		}
	}
}

// Without an exported policy every hook is the SDK's default, which tells
// the host and follows the built-in rules.
func TestDefaultsTellTheHost(t *testing.T) {
	policy.Export(nil)
	host := policytest.Install(t)
	req := policytest.NewRequest("GET", "/a", "cookie", "x=1")
	if !policy.RunOnRequest(req.Policy()).IsPass() {
		t.Error("a request with a cookie passes")
	}
	settings := policy.CacheSettings{Cacheable: true, TTL: 120, SurrogateKeys: []string{"k"}}
	resp := policytest.NewResponse(200, "server", "x")
	got := policy.RunOnBackendResponse(req.Policy(), resp.Policy(), settings)
	if !reflect.DeepEqual(got, settings) {
		t.Errorf("settings %+v, want the host's %+v", got, settings)
	}
	policy.RunOnDeliver(req.Policy(), resp.Policy())
	policy.RunOnDeliver(req.Policy(), resp.Policy())
	want := []policy.Hook{policy.HookOnRequest, policy.HookOnBackendResponse, policy.HookOnDeliver}
	if !reflect.DeepEqual(host.DefaultHooks, want) {
		t.Errorf("default hooks %v, want %v", host.DefaultHooks, want)
	}
	if len(resp.Headers()) != 1 {
		t.Errorf("deliver changed the response: %v", resp.Headers())
	}
}

type onlyDeliver struct{}

func (onlyDeliver) OnDeliver(_ *policy.Request, resp *policy.Response) {
	resp.RemoveHeader("server")
}

// A hook the policy implements runs and is never reported as a default.
func TestImplementedHooksRun(t *testing.T) {
	policy.Export(onlyDeliver{})
	t.Cleanup(func() { policy.Export(nil) })
	host := policytest.Install(t)
	req := policytest.NewRequest("GET", "/")
	resp := policytest.NewResponse(200, "Server", "x", "content-type", "text/plain")
	policy.RunOnRequest(req.Policy())
	policy.RunOnDeliver(req.Policy(), resp.Policy())
	if _, ok := resp.Header("server"); ok {
		t.Error("OnDeliver did not run")
	}
	if !reflect.DeepEqual(host.DefaultHooks, []policy.Hook{policy.HookOnRequest}) {
		t.Errorf("default hooks %v", host.DefaultHooks)
	}
}

func TestCookies(t *testing.T) {
	policytest.Install(t)
	req := policytest.NewRequest("GET", "/",
		"cookie", " session=xyz; inlay_ab = b ;theme=dark",
		"cookie", "flag; c=3",
		"cookie", "\u00a0lang=en\u3000")
	r := req.Policy()
	for name, want := range map[string]string{"inlay_ab": "b", "session": "xyz", "flag": "", "lang": "en"} {
		if got, ok := r.Cookie(name); !ok || got != want {
			t.Errorf("cookie %s: %q %v, want %q", name, got, ok, want)
		}
	}
	if _, ok := r.Cookie("missing"); ok {
		t.Error("found a missing cookie")
	}
	if !r.RemoveCookie("inlay_ab") {
		t.Error("inlay_ab was there")
	}
	if got := req.HeaderAll("cookie"); !reflect.DeepEqual(got, []string{"session=xyz; theme=dark; flag; c=3; lang=en"}) {
		t.Errorf("cookies kept: %q", got)
	}
	if r.RemoveCookie("inlay_ab") {
		t.Error("inlay_ab was removed already")
	}
	only := policytest.NewRequest("GET", "/", "cookie", "a=1")
	only.Policy().RemoveCookie("a")
	if _, ok := only.Header("cookie"); ok {
		t.Error("a Cookie header with no cookie left")
	}
}

func TestPathAndQuery(t *testing.T) {
	policytest.Install(t)
	r := policytest.NewRequest("GET", "/a/b?c=d?e").Policy()
	if r.Path() != "/a/b" {
		t.Errorf("path %q", r.Path())
	}
	if q, ok := r.Query(); !ok || q != "c=d?e" {
		t.Errorf("query %q %v", q, ok)
	}
	if _, ok := policytest.NewRequest("GET", "/a").Policy().Query(); ok {
		t.Error("a query without ?")
	}
}

func TestActions(t *testing.T) {
	a := policy.Synthetic(403, []byte("no\n"), policy.Header{Name: "Content-Type", Value: "text/plain"})
	s := a.Synthetic()
	if s == nil || s.Status != 403 || string(s.Body) != "no\n" || s.Headers[0].Name != "content-type" {
		t.Errorf("synthetic %+v", s)
	}
	r := policy.Redirect(301, "/new").Synthetic()
	if r.Status != 301 || !reflect.DeepEqual(r.Headers, []policy.Header{{Name: "location", Value: "/new"}}) {
		t.Errorf("redirect %+v", r)
	}
	if policy.Lookup().Synthetic() != nil || !policy.Pass().IsPass() || !policy.Lookup().IsLookup() {
		t.Error("lookup and pass")
	}
}

func TestRefusedEdits(t *testing.T) {
	policytest.Install(t)
	req := policytest.NewRequest("GET", "/").Policy()
	err := req.SetHeader("bad name", "v")
	if !errors.Is(err, policy.ErrRefused) || errors.Is(err, policy.ErrLimitExceeded) {
		t.Errorf("bad header name: %v", err)
	}
	if err := req.SetURL("relative"); !errors.Is(err, policy.ErrRefused) {
		t.Errorf("relative url: %v", err)
	}
	if err := req.SetBackend("nope"); err == nil {
		t.Error("an unknown backend was accepted")
	}
	resp := policytest.NewResponse(200).Policy()
	if err := resp.SetStatus(99); err == nil {
		t.Error("status 99 was accepted")
	}
}

func TestCapabilities(t *testing.T) {
	host := policytest.Install(t)
	host.Settings["k"] = "v"
	policy.Log(policy.Warn, "could not ", 3, " times")
	policy.Logf(policy.Info, "%d%%", 50)
	want := []policytest.Line{{Level: policy.Warn, Message: "could not 3 times"}, {Level: policy.Info, Message: "50%"}}
	if !reflect.DeepEqual(host.Logs, want) {
		t.Errorf("logs %+v", host.Logs)
	}
	if v, ok := policy.Config("k"); !ok || v != "v" || policy.ConfigAll()["k"] != "v" {
		t.Error("config")
	}
	if err := policy.KVSet("a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := policy.KVGet("a"); err != nil || !ok || string(v) != "1" {
		t.Errorf("kv %q %v %v", v, ok, err)
	}
	if _, err := policy.Fetch(policy.FetchRequest{URL: "/"}); !errors.Is(err, policy.ErrConnectFailed) {
		t.Errorf("fetch without a Fetcher: %v", err)
	}
	policy.SetESI(true)
	policy.SetESIVar("user", "ann")
	if host.ESI == nil || !*host.ESI || host.ESIVars["user"] != "ann" {
		t.Error("esi")
	}
}

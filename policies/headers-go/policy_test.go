package main

import (
	"reflect"
	"testing"

	"example.invalid/inlay/guest-sdk/go/policy"
	"example.invalid/inlay/guest-sdk/go/policytest"
)

func TestStripsTrackingParameters(t *testing.T) {
	policytest.Install(t)
	cases := map[string]string{
		"/p?b=2&utm_source=x&a=1&fbclid=y&UTM_Medium=z&gclid=q&c": "/p?b=2&a=1&c",
		"/p?utm_source=x&gclid=1":                                 "/p",
		"/p?a=1&&utm_x=1&&b":                                      "/p?a=1&b",
		"/p?Gclid=1&FBCLID=2&x=%20":                               "/p?x=%20",
		// Unchanged: no tracking parameter.
		"/":                           "/",
		"/p?a=1&&b=2":                 "/p?a=1&&b=2",
		"/p?utm=1&fbclidx=2&xgclid=3": "/p?utm=1&fbclidx=2&xgclid=3",
	}
	for url, want := range cases {
		req := policytest.NewRequest("GET", url)
		if action := policy.RunOnRequest(req.Policy()); !action.IsLookup() {
			t.Errorf("%s: %s", url, action)
		}
		if req.URL() != want {
			t.Errorf("%s became %s, want %s", url, req.URL(), want)
		}
	}
}

func TestDeliverHidesTheServer(t *testing.T) {
	host := policytest.Install(t)
	resp := policytest.NewResponse(200, "Server", "nginx", "X-Powered-By", "PHP", "content-type", "text/html")
	policy.RunOnDeliver(policytest.NewRequest("GET", "/").Policy(), resp.Policy())
	want := []policy.Header{{Name: "content-type", Value: "text/html"}, {Name: "x-inlay-policy", Value: "headers"}}
	if got := resp.Headers(); !reflect.DeepEqual(got, want) {
		t.Errorf("headers %v", got)
	}
	// on-backend-response is left to the built-in rules.
	policy.RunOnBackendResponse(policytest.NewRequest("GET", "/").Policy(), resp.Policy(), policy.CacheSettings{})
	if !reflect.DeepEqual(host.DefaultHooks, []policy.Hook{policy.HookOnBackendResponse}) {
		t.Errorf("default hooks %v", host.DefaultHooks)
	}
	if len(host.Logs) != 0 {
		t.Errorf("log lines %v", host.Logs)
	}
}

package main

import (
	"testing"

	"example.invalid/inlay/guest-sdk/go/policy"
	"example.invalid/inlay/guest-sdk/go/policytest"
)

func body(t *testing.T, url string) string {
	t.Helper()
	s := policy.RunOnRequest(policytest.NewRequest("GET", url).Policy()).Synthetic()
	if s == nil {
		t.Fatalf("%s was not answered", url)
	}
	return string(s.Body)
}

func TestGoroutinesSum(t *testing.T) {
	policytest.Install(t)
	if got := body(t, "/go/goroutines"); got != "5050" {
		t.Errorf("sum %s", got)
	}
}

func TestOthersFollowTheBuiltinRules(t *testing.T) {
	policytest.Install(t)
	if !policy.RunOnRequest(policytest.NewRequest("GET", "/x").Policy()).IsLookup() {
		t.Error("not looked up")
	}
}

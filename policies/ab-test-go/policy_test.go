package main

import (
	"reflect"
	"testing"

	"example.invalid/inlay/guest-sdk/go/policy"
	"example.invalid/inlay/guest-sdk/go/policytest"
)

func TestKeepsTheCookiesBucket(t *testing.T) {
	policytest.Install(t)
	req := policytest.NewRequest("GET", "/", "cookie", "a=1; inlay_ab=b", "user-agent", "ua")
	policy.RunOnRequest(req.Policy())
	if v, _ := req.Header("x-ab-bucket"); v != "b" {
		t.Errorf("bucket %q", v)
	}
	if !reflect.DeepEqual(req.CacheKeyData(), []string{"ab=b"}) {
		t.Errorf("cache key %v", req.CacheKeyData())
	}
	if got := req.HeaderAll("cookie"); !reflect.DeepEqual(got, []string{"a=1"}) {
		t.Errorf("cookies %q", got)
	}
	resp := policytest.NewResponse(200)
	policy.RunOnDeliver(req.Policy(), resp.Policy())
	if _, ok := resp.Header("set-cookie"); ok {
		t.Error("a client with a bucket got a cookie")
	}
}

// referenceBucket is the other ports' hash, written out: FNV-1a 64 of
// IP, a zero byte and UA; even hashes are "a".
func referenceBucket(ip, ua string) string {
	hash := uint64(0xcbf29ce484222325)
	for _, b := range []byte(ip + "\x00" + ua) {
		hash = (hash ^ uint64(b)) * 0x100000001b3
	}
	if hash%2 == 0 {
		return "a"
	}
	return "b"
}

// A new client gets the reference bucket, a marker and a cookie.
func TestNewClientsGetAStableBucket(t *testing.T) {
	policytest.Install(t)
	for _, c := range []struct{ ip, ua, bucket string }{
		{"198.51.100.7", "Firefox", referenceBucket("198.51.100.7", "Firefox")},
		{"192.0.2.1", "ua", referenceBucket("192.0.2.1", "ua")},
		{"192.0.2.2", "", referenceBucket("192.0.2.2", "")},
	} {
		req := policytest.NewRequest("GET", "/", "user-agent", c.ua, "x-ab-new", "forged").FromClient(c.ip)
		if !policy.RunOnRequest(req.Policy()).IsLookup() {
			t.Error("not looked up")
		}
		if v, _ := req.Header("x-ab-bucket"); v != c.bucket {
			t.Errorf("%s: bucket %q, want %q", c.ip, v, c.bucket)
		}
		if v, _ := req.Header("x-ab-new"); v != "1" {
			t.Errorf("marker %q", v)
		}
		resp := policytest.NewResponse(200, "set-cookie", "other=1")
		policy.RunOnDeliver(req.Policy(), resp.Policy())
		want := []string{"other=1", "inlay_ab=" + c.bucket + "; Path=/; Max-Age=2592000; SameSite=Lax"}
		if got := resp.HeaderAll("set-cookie"); !reflect.DeepEqual(got, want) {
			t.Errorf("set-cookie %q", got)
		}
	}
}

// A sticky A/B test that still caches: the Go port of policies/ab-test
// (same cookie, headers and cache key).
//
// The bucket comes from the cookie inlay_ab ("a" or "b"). A client without
// a valid cookie gets a bucket derived from a hash of its IP and
// User-Agent, and the cookie is set on delivery. The origin sees the
// bucket as x-ab-bucket; the bucket is added to the cache key. The
// inlay_ab cookie is removed from the request; other cookies still pass.
package main

import (
	"hash/fnv"

	"example.invalid/inlay/guest-sdk/go/policy"
)

const (
	// cookieName is the cookie holding the bucket.
	cookieName = "inlay_ab"
	// bucketHeader is the request header the origin reads the bucket from.
	bucketHeader = "x-ab-bucket"
	// newBucketHeader marks a bucket assigned by this request, so that
	// OnDeliver sets the cookie.
	newBucketHeader = "x-ab-new"
	// cookieMaxAge is how long the cookie lives: 30 days, in seconds.
	cookieMaxAge = "2592000"
)

// assignBucket hashes IP, a zero byte and user agent with FNV-1a (64-bit);
// even hashes go to "a".
func assignBucket(clientIP, userAgent string) string {
	h := fnv.New64a()
	h.Write([]byte(clientIP))
	h.Write([]byte{0})
	h.Write([]byte(userAgent))
	if h.Sum64()%2 == 0 {
		return "a"
	}
	return "b"
}

// set sets a request header whose value we built; it logs if the host
// refuses it.
func set(req *policy.Request, name, value string) {
	if err := req.SetHeader(name, value); err != nil {
		policy.Log(policy.Warn, "could not set ", name, ": ", err)
	}
}

type abTest struct{}

func (abTest) OnRequest(req *policy.Request) policy.Action {
	// Only this policy may set the marker, never the client.
	req.RemoveHeader(newBucketHeader)
	bucket, _ := req.Cookie(cookieName)
	if bucket != "a" && bucket != "b" {
		ua, _ := req.Header("user-agent")
		bucket = assignBucket(req.ClientIP(), ua)
		set(req, newBucketHeader, "1")
	}
	req.RemoveCookie(cookieName)
	set(req, bucketHeader, bucket)
	req.AddToCacheKey("ab=" + bucket)
	return policy.BuiltinRecv(req)
}

func (abTest) OnDeliver(req *policy.Request, resp *policy.Response) {
	if _, ok := req.Header(newBucketHeader); !ok {
		return
	}
	bucket, ok := req.Header(bucketHeader)
	if !ok {
		return
	}
	value := cookieName + "=" + bucket + "; Path=/; Max-Age=" + cookieMaxAge + "; SameSite=Lax"
	if err := resp.AppendHeader("set-cookie", value); err != nil {
		policy.Log(policy.Warn, "could not set the A/B cookie: ", err)
	}
}

func init() { policy.Export(abTest{}) }

func main() {}

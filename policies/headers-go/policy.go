// Header hygiene, the Go port of policies/headers (same behaviour): strips
// tracking query parameters (utm_*, fbclid, gclid) before the cache
// lookup, so they do not split the cache or reach the origin; on delivery
// removes Server and X-Powered-By and adds x-inlay-policy: headers.
package main

import (
	"strings"

	"example.invalid/inlay/guest-sdk/go/policy"
)

// isTracking reports whether a query parameter is a tracking one, by its
// name (ASCII case ignored, as the Rust policy does).
func isTracking(param string) bool {
	name, _, _ := strings.Cut(param, "=")
	return (len(name) >= 4 && strings.EqualFold(name[:4], "utm_")) ||
		strings.EqualFold(name, "fbclid") || strings.EqualFold(name, "gclid")
}

// stripTrackingParams returns url without tracking query parameters, the
// others kept in order and exact text (the "?" goes when none is left),
// and whether anything was removed.
func stripTrackingParams(url string) (string, bool) {
	path, query, found := strings.Cut(url, "?")
	if !found {
		return url, false
	}
	params := strings.Split(query, "&")
	kept := params[:0:0]
	tracking := false
	for _, p := range params {
		if isTracking(p) {
			tracking = true
		} else if p != "" {
			kept = append(kept, p)
		}
	}
	if !tracking {
		return url, false
	}
	if len(kept) == 0 {
		return path, true
	}
	return path + "?" + strings.Join(kept, "&"), true
}

type headers struct{}

func (headers) OnRequest(req *policy.Request) policy.Action {
	if clean, changed := stripTrackingParams(req.URL()); changed {
		if err := req.SetURL(clean); err != nil {
			// A sub-string of a valid URL: not expected; the original stays.
			policy.Log(policy.Warn, "could not strip tracking parameters: ", err)
		}
	}
	return policy.BuiltinRecv(req)
}

func (headers) OnDeliver(_ *policy.Request, resp *policy.Response) {
	resp.RemoveHeader("server")
	resp.RemoveHeader("x-powered-by")
	if err := resp.SetHeader("x-inlay-policy", "headers"); err != nil {
		policy.Log(policy.Warn, "could not set x-inlay-policy: ", err)
	}
}

func init() { policy.Export(headers{}) }

func main() {}

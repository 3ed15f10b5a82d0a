// Package export_inlay_policy_handler is where wit-bindgen's generated
// exports (package wit_exports) send the host's calls of the `handler`
// interface. It is written by hand, not generated: package policy fills in
// the three functions, so that the bindings need not import it.
package export_inlay_policy_handler

import (
	"example.invalid/inlay/guest-sdk/go/wit/imports/inlay_policy_types"
)

// The hooks package policy installs when it is linked in.
var (
	Request         func(req *inlay_policy_types.Request) inlay_policy_types.RequestAction
	BackendResponse func(req *inlay_policy_types.Request, resp *inlay_policy_types.Response, settings inlay_policy_types.CacheSettings) inlay_policy_types.CacheSettings
	Deliver         func(req *inlay_policy_types.Request, resp *inlay_policy_types.Response)
)

// OnRequest runs the policy's on-request hook.
func OnRequest(req *inlay_policy_types.Request) inlay_policy_types.RequestAction {
	return Request(req)
}

// OnBackendResponse runs the policy's on-backend-response hook.
func OnBackendResponse(req *inlay_policy_types.Request, resp *inlay_policy_types.Response, settings inlay_policy_types.CacheSettings) inlay_policy_types.CacheSettings {
	return BackendResponse(req, resp, settings)
}

// OnDeliver runs the policy's on-deliver hook.
func OnDeliver(req *inlay_policy_types.Request, resp *inlay_policy_types.Response) {
	Deliver(req, resp)
}

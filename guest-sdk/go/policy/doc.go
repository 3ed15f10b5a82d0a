// Package policy is the Go SDK for Inlay policies: idiomatic helpers over
// the bindings wit-bindgen generates for the inlay:policy@0.1.0 world
// (package wit under this module).
//
// A policy is a value with any of the three hook methods; the hooks it
// does not have behave like Varnish's built-in VCL and cost nothing (the
// host runs those rules itself). Register it from an init function:
//
//	package main
//
//	import "example.invalid/inlay/guest-sdk/go/policy"
//
//	type hide struct{}
//
//	func (hide) OnDeliver(req *policy.Request, resp *policy.Response) {
//		resp.RemoveHeader("server")
//	}
//
//	func init() { policy.Export(hide{}) }
//
//	func main() {}
//
// Build it with the standard Go toolchain as a WASI reactor, then make it a
// component (policies/build-lang.sh go does both):
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o policy.core.wasm .
//	inlay-componentize encode --wit guest-sdk/wit policy.core.wasm -o policy.wasm
//
// The component imports nothing but the inlay:policy interfaces:
// inlay-componentize puts Inlay's WASI preview 1 adapter under Go's
// runtime, so standard output and standard error become log lines,
// time.Now reads the host's clock and the runtime's monotonic clock is
// virtual (it never waits). There is no file system, network or randomness
// (crypto/rand fails).
//
// Outside WebAssembly (go test on the build machine) the same code runs on
// the in-memory host of package policytest.
//
// Host calls that the host may refuse return an error, a *Error whose Code
// names the WIT error case; errors.Is(err, ErrLimitExceeded) and the other
// Err values test the case.
package policy

module example.invalid/inlay/guest-sdk/go

go 1.25

require go.bytecodealliance.org/pkg v0.4.0

// The packages wit-bindgen's Go bindings import; go.bytecodealliance.org is
// not reachable from here, so the copy wit-bindgen-go 0.63 ships is used
// (third_party/go-pkg/README.md).
replace go.bytecodealliance.org/pkg => ./third_party/go-pkg

module example.invalid/inlay/policies/headers-go

go 1.25

require example.invalid/inlay/guest-sdk/go v0.0.0

require go.bytecodealliance.org/pkg v0.4.0 // indirect

replace example.invalid/inlay/guest-sdk/go => ../../guest-sdk/go

// The copy wit-bindgen-go ships (guest-sdk/go/third_party/go-pkg).
replace go.bytecodealliance.org/pkg => ../../guest-sdk/go/third_party/go-pkg

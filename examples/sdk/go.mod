module example.com/sluice-sdk-example

go 1.26.8

require github.com/sluicefs/sluice v0.0.0

require (
	github.com/klauspost/cpuid/v2 v2.3.0 // indirect
	github.com/klauspost/reedsolomon v1.14.2 // indirect
	golang.org/x/sys v0.30.0 // indirect
)

// The SDK from this checkout; a real program requires a released version
// instead.
replace github.com/sluicefs/sluice => ../..

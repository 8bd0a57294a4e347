//go:build race

package policy_test

// raceEnabled: built with -race, where each operation costs several times
// more; long stress tests run fewer.
const raceEnabled = true

//go:build race

package main

// raceEnabled: the test binary runs with the race detector, so TestMain
// builds the sluice binary with -race too.
const raceEnabled = true

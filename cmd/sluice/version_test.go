package main

import (
	"os/exec"
	"regexp"
	"runtime"
	"testing"
)

// TestVersion: `sluice version` and `sluice --version` say the release,
// the commit (unknown when the build stamped none) and the Go version.
func TestVersion(t *testing.T) {
	want := regexp.MustCompile(`^sluice \S+\ncommit (unknown|[0-9a-f]{40}(\+modified)?( \(\S+\))?)\n` + regexp.QuoteMeta(runtime.Version()) + `\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(sluiceBin, args...).CombinedOutput()
		if err != nil || !want.Match(out) {
			t.Errorf("sluice %v: %v\n%s", args, err, out)
		}
	}
}

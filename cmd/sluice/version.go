package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is the release; builds from a checkout say "dev" (a release
// build sets it with -ldflags "-X main.version=v1.2.3").
var version = "dev"

// versionString says what this binary is: release, commit (with
// "+modified" for a dirty tree) and its build time, and the Go version,
// from what the Go toolchain stamped into it.
func versionString() string {
	commit, modified, when, goVer := "unknown", false, "", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVer = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			case "vcs.time":
				when = s.Value
			}
		}
	}
	if modified {
		commit += "+modified"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sluice %s\ncommit %s", version, commit)
	if when != "" {
		fmt.Fprintf(&b, " (%s)", when)
	}
	fmt.Fprintf(&b, "\n%s\n", goVer)
	return b.String()
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprint(a.stdout, versionString())
			return err
		},
	}
}

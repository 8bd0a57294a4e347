package main

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/sdk"
)

// parseODAFS parses args as odafsFlags and returns them checked and
// applied to sdk.Options (ODAFS nil: off).
func parseODAFS(t *testing.T, args ...string) (*odafs.Options, error) {
	t.Helper()
	var f odafsFlags
	cmd := &cobra.Command{Use: "x"}
	f.add(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		return nil, err
	}
	if err := f.check(cmd.Flags()); err != nil {
		return nil, err
	}
	var o sdk.Options
	f.tune(&o)
	return o.ODAFS, nil
}

func TestODAFSFlags(t *testing.T) {
	if o, err := parseODAFS(t); err != nil || o != nil {
		t.Fatalf("no flags: %+v, %v; want off", o, err)
	}
	// The defaults are odafs.Options' own.
	def := odafs.New(odafs.Options{}).Options()
	o, err := parseODAFS(t, "--odafs")
	if err != nil || o == nil || odafs.New(*o).Options() != def {
		t.Fatalf("--odafs: %+v, %v; want odafs's defaults %+v", o, err, def)
	}
	o, err = parseODAFS(t, "--odafs", "--odafs-cache", "0", "--odafs-refs", "100", "--odafs-block", "8KiB")
	if err != nil {
		t.Fatal(err)
	}
	if got := odafs.New(*o).Options(); got.CacheBytes != 0 || got.Entries != 100 || got.BlockSize != 8<<10 {
		t.Fatalf("--odafs-cache 0 --odafs-refs 100 --odafs-block 8KiB: %+v, want no cache, 100 references, 8 KiB blocks", got)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--odafs-cache", "1MiB"}, "--odafs-cache goes with --odafs"},
		{[]string{"--odafs-refs", "5"}, "--odafs-refs goes with --odafs"},
		{[]string{"--odafs", "--odafs-refs", "0"}, "at least 1"},
		{[]string{"--odafs", "--odafs-block", "3000"}, "a power of two"},
		{[]string{"--odafs", "--odafs-block", "2MiB"}, "a power of two"},
		{[]string{"--odafs", "--odafs-cache", "-1"}, "not a size"},
	} {
		if _, err := parseODAFS(t, bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want an error saying %q", bad.args, err, bad.want)
		}
	}
}

// TestODAFSFlagsWired checks that the front ends and up have the flags,
// and that up refuses --odafs without a mount before starting anything.
func TestODAFSFlagsWired(t *testing.T) {
	a := &app{stdout: os.Stdout, stderr: os.Stderr}
	for cmd, flags := range map[string][]string{
		"mount": {"odafs", "odafs-cache", "odafs-refs", "odafs-block"},
		"nfs":   {"odafs", "odafs-cache", "odafs-refs", "odafs-block"},
		"up":    {"odafs", "odafs-cache", "export-cache", "export-block"},
		"node":  {"export-cache", "export-block"},
	} {
		c, _, err := a.rootCmd().Find([]string{cmd})
		if err != nil || c.Name() != cmd {
			t.Fatalf("no command %s: %v", cmd, err)
		}
		for _, f := range flags {
			if c.Flags().Lookup(f) == nil {
				t.Errorf("sluice %s has no --%s", cmd, f)
			}
		}
	}
	root := a.rootCmd()
	root.SetArgs([]string{"up", "--data", t.TempDir(), "--odafs"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--odafs goes with --mount") {
		t.Fatalf("up --odafs without --mount: %v", err)
	}
}

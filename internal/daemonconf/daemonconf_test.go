package daemonconf

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// testCmd is a daemon-like command under a root with a persistent flag,
// as sluice's are.
func testCmd() (root, cmd *cobra.Command) {
	root = &cobra.Command{Use: "sluice", SilenceErrors: true, SilenceUsage: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return LoadFor(cmd) }}
	root.PersistentFlags().String("log-level", "info", "")
	cmd = &cobra.Command{Use: "daemon", RunE: func(*cobra.Command, []string) error { return nil }}
	f := cmd.Flags()
	f.String("listen", "127.0.0.1:0", "")
	f.Int("mtu", 8192, "")
	f.Int64("scrub-rate", 1<<20, "")
	f.Int8("small", 0, "")
	f.Bool("allow-other", false, "")
	f.Duration("idle-timeout", 10*time.Second, "")
	f.Float64("min-free-percent", 5, "")
	f.StringSlice("tls-san", nil, "")
	f.String("join", "", "")
	f.SetAnnotation("join", SecretAnnotation, []string{"true"})
	Add(cmd)
	root.AddCommand(cmd)
	return root, cmd
}

// changed lists the flags whose values differ from their defaults.
func changed(fs *pflag.FlagSet) string {
	var out []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Value.String() != f.DefValue {
			out = append(out, f.Name+"="+f.Value.String())
		}
	})
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestConfig runs testdata/*: "run" writes the input as a config file
// (mode=, default 0600) and runs the command with args= (the file's path
// is substituted for FILE), printing the flags that differ from their
// defaults, or the error.
func TestConfig(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "run" {
				t.Fatalf("unknown command %q", d.Cmd)
			}
			mode := os.FileMode(0o600)
			var args []string
			file := filepath.Join(t.TempDir(), "daemon.toml")
			for _, a := range d.CmdArgs {
				switch a.Key {
				case "mode":
					m, err := strconv.ParseUint(a.Vals[0], 8, 32)
					if err != nil {
						t.Fatal(err)
					}
					mode = os.FileMode(m)
				case "args":
					for _, v := range a.Vals {
						args = append(args, strings.ReplaceAll(v, "FILE", file))
					}
				}
			}
			if err := os.WriteFile(file, []byte(d.Input), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, mode); err != nil {
				t.Fatal(err)
			}
			root, cmd := testCmd()
			root.SetArgs(append([]string{"daemon"}, args...))
			if err := root.Execute(); err != nil {
				return "error: " + strings.ReplaceAll(err.Error(), file, "FILE") + "\n"
			}
			return strings.ReplaceAll(changed(cmd.Flags()), file, "FILE") + "\n"
		})
	})
}

// FuzzApply feeds Apply any file: it must not panic, and what it accepts
// sets only flags the command has.
func FuzzApply(f *testing.F) {
	for _, s := range []string{"", "mtu = 9000\n", "tls-san = [\"a\", \"b\"]\nidle-timeout = \"3s\"\n",
		"[t]\nx = 1\n", "listen = 1\n", "a.b = 2", "join = 'x'", "mtu = 1\nmtu = 2\n", "small = 300"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, cmd := testCmd()
		fs := cmd.Flags()
		err := Apply(fs, "fuzz.toml", data, false)
		if err == nil {
			return
		}
		if !strings.HasPrefix(err.Error(), "config file fuzz.toml") {
			t.Fatalf("error does not name the file: %v", err)
		}
		_ = fmt.Sprint(err)
	})
}

// TestGiven: a value from the file counts as given, as one from the
// command line does, so checks of explicit values (a node's --id, a
// positive --op-timeout) cannot be skipped by moving the value to the
// file; a default does not.
func TestGiven(t *testing.T) {
	root, cmd := testCmd()
	path := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(path, []byte("mtu = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root.SetArgs([]string{"daemon", "--config", path, "--listen", "127.0.0.1:1"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"mtu": true, "listen": true, "scrub-rate": false, "nosuch": false} {
		if got := Given(cmd.Flags(), name); got != want {
			t.Errorf("Given(%q) = %v, want %v", name, got, want)
		}
	}
	if cmd.Flags().Changed("mtu") {
		t.Error("a file's value marked as given on the command line")
	}
}

// TestOwnerChecked: a file another (unprivileged) user owns is refused
// whatever its mode: its owner could point the daemon anywhere.
func TestOwnerChecked(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to chown")
	}
	root, _ := testCmd()
	path := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(path, []byte("mtu = 9000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	root.SetArgs([]string{"daemon", "--config", path})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "owned by uid 12345") {
		t.Fatalf("a file of uid 12345: %v, want refused naming the owner", err)
	}
}

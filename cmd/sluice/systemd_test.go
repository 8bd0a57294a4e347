package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSystemdUnits: every command line of the unit files in
// deploy/systemd that runs sluice names a real subcommand, with flags it
// has, values they accept and the arguments it takes, so the files
// cannot rot as the CLI changes; the units put no secret on a command
// line (the join token comes from the environment file).
func TestSystemdUnits(t *testing.T) {
	units, err := filepath.Glob("../../deploy/systemd/*.service")
	if err != nil || len(units) < 4 {
		t.Fatalf("unit files: %v %v", units, err)
	}
	seen := map[string]bool{}
	for _, u := range units {
		f, err := os.Open(u)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for line := 1; sc.Scan(); line++ {
			key, val, ok := strings.Cut(sc.Text(), "=")
			if !ok || !strings.HasPrefix(key, "Exec") {
				continue
			}
			args := strings.Fields(strings.TrimLeft(val, "-@:+!"))
			if len(args) == 0 || filepath.Base(args[0]) != "sluice" {
				continue
			}
			where := fmt.Sprintf("%s:%d", filepath.Base(u), line)
			name := checkCommandLine(t, where, args[1:])
			seen[name] = true
		}
		f.Close()
	}
	for _, want := range []string{"meta", "node", "mount", "nfs"} {
		if !seen[want] {
			t.Errorf("no unit runs sluice %s", want)
		}
	}
}

// unitVar is a ${NAME} or $NAME in a unit's command line.
var unitVar = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

// checkCommandLine parses args as sluice would, systemd's variables
// standing for plausible values, and returns the subcommand's name.
func checkCommandLine(t *testing.T, where string, args []string) string {
	t.Helper()
	for i, a := range args {
		args[i] = unitVar.ReplaceAllStringFunc(a, func(v string) string {
			if strings.Contains(v, "META") {
				return "10.0.0.10:7700"
			}
			return "10.0.0.10"
		})
		if a == "--join" || strings.HasPrefix(a, "--join=") {
			t.Errorf("%s: the join token is on the command line (ps shows it); it belongs in the environment file", where)
		}
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	a := &app{stdout: null, stderr: null}
	cmd, rest, err := a.rootCmd().Find(args)
	if err != nil || cmd.Name() == "sluice" {
		t.Errorf("%s: sluice %s: no such command (%v)", where, strings.Join(args, " "), err)
		return ""
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Errorf("%s: sluice %s: %v", where, strings.Join(args, " "), err)
		return cmd.Name()
	}
	if cmd.Args != nil {
		if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
			t.Errorf("%s: sluice %s: %v", where, strings.Join(args, " "), err)
		}
	}
	return cmd.Name()
}

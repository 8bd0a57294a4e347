package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// goList runs `go list -deps -json` on pkgs and returns every package in
// their closure by import path. The test is skipped where there is no go
// tool (a test binary copied elsewhere).
func goList(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool: %v", err)
	}
	cmd := exec.Command(gotool, append([]string{"list", "-deps", "-json=ImportPath,Imports"}, pkgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	imports := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list: %v", err)
		}
		imports[p.ImportPath] = p.Imports
	}
	return imports
}

// chain is the shortest import path from root to dep in imports, for
// the failure message: the fix is to cut one of its links.
func chain(imports map[string][]string, root, dep string) []string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == dep {
			var out []string
			for ; p != ""; p = prev[p] {
				out = append([]string{p}, out...)
			}
			return out
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// TestNoServerDeps: the SDK, and the NFS client `sluice nfs-get` uses,
// link none of the servers' packages nor their index (pebble). They are
// what others build on; a server dependency would drag in a key-value
// store and its start-up cost for one constant, as it once did.
func TestNoServerDeps(t *testing.T) {
	const mod = "github.com/sluicefs/sluice/"
	roots := []string{mod + "client", mod + "internal/nfsclient"}
	imports := goList(t, roots...)
	if _, ok := imports[mod+"client"]; !ok {
		t.Fatalf("go list did not list %sclient", mod)
	}
	forbidden := func(p string) bool {
		if strings.HasPrefix(p, "github.com/cockroachdb/pebble") {
			return true
		}
		for _, s := range []string{"store", "node", "meta", "policy"} {
			if p == mod+"internal/"+s || strings.HasPrefix(p, mod+"internal/"+s+"/") {
				return true
			}
		}
		return false
	}
	// Report each edge from an allowed package into a forbidden one,
	// with how the SDK reaches it: that edge is what to cut.
	var bad []string
	for p, deps := range imports {
		if forbidden(p) {
			continue
		}
		for _, q := range deps {
			if !forbidden(q) {
				continue
			}
			for _, r := range roots {
				if c := chain(imports, r, p); c != nil {
					bad = append(bad, strings.Join(append(c, q), " -> "))
					break
				}
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("server package linked: %s", b)
	}
}

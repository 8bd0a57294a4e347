package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestNodeRevoke: `sluice node revoke` retires a running node's
// identity: meta takes it for down at once, the node stops with a clear
// error, and its certificate no longer registers it when it is started
// again; the other node goes on. Meta's banner passes the join token in
// the environment, and a token on the command line is warned about.
func TestNodeRevoke(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	if m := c.metaProc.waitLine(t, regexp.MustCompile(`add storage nodes with: (.*)$`), 5*time.Second); !strings.HasPrefix(m[1], envJoin+`="$(`) || strings.Contains(m[1], "--join") {
		t.Errorf("meta's banner puts the join token on a command line: %s", m[1])
	}
	n1 := c.startNode(t, "n1")
	n2 := c.startNode(t, "n2")
	waitNodesUp(t, c.conf, 2, 15*time.Second)
	if !strings.Contains(n1.proc.stderrText(), "visible to other users") {
		t.Errorf("a node given --join does not warn: %s", tail(n1.proc.stderrText(), 5))
	}

	out := mustRun(t, c.conf, nil, "node", "revoke", n1.id.String())
	if !strings.Contains(string(out.stdout), "revoked") {
		t.Errorf("node revoke printed %q", out.stdout)
	}
	if st := nodeStates(status(t, c.conf)); st[n1.id] != metaapi.NodeDown || st[n2.id] != metaapi.NodeUp {
		t.Errorf("after revoking %v: %v", n1.id, st)
	}
	if msg := waitExit(t, n1.proc, "revoked node"); !strings.Contains(msg, "identity was revoked") {
		t.Errorf("revoked node stopped with: %s", tail(msg, 5))
	}
	r := run(t, c.conf, nil, "node", "--data", n1.dir, "--meta", c.meta, "--listen", "127.0.0.1:0")
	if r.code == 0 || !strings.Contains(r.stderr, "identity was revoked") {
		t.Errorf("revoked node started again: %s", r)
	}
	mustFail(t, c.conf, []string{`never admitted`}, "node", "revoke", "n9")
	if st := nodeStates(status(t, c.conf)); st[n2.id] != metaapi.NodeUp {
		t.Errorf("node %v after revoking %v: %v", n2.id, n1.id, st)
	}
}

package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// restartMeta starts meta again on its address and data (after a kill),
// with extra flags, and waits until it listens.
func (c *splitCluster) restartMeta(t *testing.T, name string, extra ...string) {
	t.Helper()
	args := append([]string{"meta", "--data", filepath.Join(c.dir, "meta"), "--listen", c.meta, "--node-timeout", "2s"}, extra...)
	c.metaProc = startProc(t, c.dir, name, args...)
	c.metaProc.waitLine(t, reMetaListen, 20*time.Second)
}

// TestCLIMetaRestart: commands started while meta is down (restarting)
// wait for it within --op-timeout and succeed once it is back; with meta
// staying down, a command fails after --op-timeout naming meta's address.
func TestCLIMetaRestart(t *testing.T) {
	c := threeNodes(t, nil, nil)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "2")
	mustRun(t, c.conf, strings.NewReader("before"), "put", "-", "/before")

	c.metaProc.kill()
	data := randomBytes(t, 3<<20)
	stdin := filepath.Join(c.dir, "put.in")
	writeFile(t, stdin, data)
	cmds := map[string][]string{
		"ls":     {"--conf", c.conf, "--op-timeout", "60s", "ls", "/"},
		"status": {"--conf", c.conf, "--op-timeout", "60s", "status"},
		"put":    {"--conf", c.conf, "--op-timeout", "60s", "put", stdin, "/during"},
		"get":    {"--conf", c.conf, "--op-timeout", "60s", "get", "/before", filepath.Join(c.dir, "before.out")},
	}
	procs := map[string]*proc{}
	for name, args := range cmds {
		procs[name] = startProc(t, c.dir, "cli-"+name, args...)
	}
	// Well past the 2 s a command gives a meta that never answered it.
	time.Sleep(4 * time.Second)
	for name, p := range procs {
		if p.exited() {
			t.Fatalf("%s gave up while meta was down: %v\n%s", name, p.waitErr, p.stderrText())
		}
	}
	c.restartMeta(t, "meta-restarted")
	for name, p := range procs {
		select {
		case <-p.done:
		case <-time.After(50 * time.Second):
			t.Fatalf("%s still running 50 s after meta came back", name)
		}
		if p.waitErr != nil {
			t.Errorf("%s across a meta restart: %v\n%s", name, p.waitErr, p.stderrText())
		}
	}
	if ls := strings.Join(procs["ls"].out.snapshot(), "\n"); !strings.Contains(ls, "before") {
		t.Errorf("ls across the restart printed %q", ls)
	}
	got := mustRun(t, c.conf, nil, "cat", "/during").stdout
	if !bytes.Equal(got, data) {
		t.Errorf("file put across the restart reads back %d bytes, want the %d put", len(got), len(data))
	}

	// Meta stays down: a clear error after --op-timeout, naming it.
	c.metaProc.kill()
	start := time.Now()
	r := mustFail(t, c.conf, []string{`did not answer for [0-9.]+s`, regexp.QuoteMeta(c.meta)}, "--op-timeout", "3s", "ls", "/")
	took := time.Since(start)
	t.Logf("meta down: %q after %s", strings.TrimSpace(r.stderr), took.Round(time.Millisecond))
	if took < 3*time.Second || took > 20*time.Second {
		t.Errorf("with --op-timeout 3s, gave up after %s", took)
	}
}

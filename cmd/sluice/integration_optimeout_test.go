package main

import (
	"regexp"
	"syscall"
	"testing"
	"time"
)

// TestCLIFrozenMeta: --op-timeout bounds a command against a meta that
// takes connections but never answers (stopped with SIGSTOP): it fails
// within about the op timeout, naming meta's address. An attempt used
// to take its own time whatever the op timeout said: 10 s for a new
// connection (the TLS handshake's timeout), 30 s for an open one.
func TestCLIFrozenMeta(t *testing.T) {
	c := startMeta(t, baseDir(t))
	mustRun(t, c.conf, nil, "ls", "/")
	p := c.metaProc.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			p.Signal(syscall.SIGCONT)
		}
	}()
	start := time.Now()
	r := mustFail(t, c.conf, []string{regexp.QuoteMeta(c.meta)}, "--op-timeout", "3s", "ls", "/")
	took := time.Since(start)
	t.Logf("meta stopped: %q after %s", r.stderr, took.Round(time.Millisecond))
	if took > 8*time.Second {
		t.Errorf("with --op-timeout 3s and meta stopped, gave up after %s", took)
	}
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	mustRun(t, c.conf, nil, "ls", "/")
}

package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
)

// TestMetaAdvertise: meta listening on every interface writes the
// address it is told to advertise into client.conf, its certificate
// names it, and a node and a client reach it there; an unspecified
// address is refused with a clear error.
func TestMetaAdvertise(t *testing.T) {
	c := startMeta(t, baseDir(t), "--listen", "0.0.0.0:0", "--advertise", "127.0.0.2")
	if !strings.HasPrefix(c.meta, "127.0.0.2:") {
		t.Fatalf("meta says it listens on %s, want the advertised 127.0.0.2", c.meta)
	}
	cc, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	if cc.Meta != c.meta {
		t.Fatalf("client.conf names meta at %s, want %s", cc.Meta, c.meta)
	}
	c.startNode(t, "n1")
	waitNodesUp(t, c.conf, 1, 15*time.Second)
	mustRun(t, c.conf, nil, "mkdir", "/reached")
	dir := filepath.Join(c.dir, "meta-bad")
	mustFail(t, c.conf, []string{`--advertise "0.0.0.0": give an address other hosts can reach`}, "meta", "--data", dir, "--listen", "127.0.0.1:0", "--advertise", "0.0.0.0")
}

package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestODAFSNodeRestart (issue 19, faults): a client holds references to
// blocks in a node's exported cache — over TCP (checked by the node) and
// over shared memory (its own cache, mapped) — and the node is killed -9
// and restarted. Every read through an old reference fails softly and
// falls back to a request (the new run has a new epoch, secret and
// regions), the bytes are right, and the references refill: the next
// reads are optimistic again.
func TestODAFSNodeRestart(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	nodeArgs := []string{"--export-cache", "1MiB", "--fabric", "auto"}
	n := c.startNode(t, "n1", nodeArgs...)
	waitNodesUp(t, c.conf, 1, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "1")
	data := randomBytes(t, 64<<10)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")
	conf, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	clients := map[string]*sdk.Client{}
	for name, fm := range map[string]fabric.Fabric{"tcp": fabric.FabricTCP, "shm": fabric.FabricShm} {
		cl, err := sdk.New(sdk.Options{Conf: conf, Fabric: fm, BusyRetry: 20 * time.Second, ODAFS: &odafs.Options{CacheBytes: -1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		clients[name] = cl
	}
	// readAll reads the file in 4 KiB blocks and returns how many went
	// optimistically and how many fell back.
	readAll := func(name, what string, upTo int) (uint64, uint64) {
		t.Helper()
		cl := clients[name]
		f, err := cl.Open(ctx, "/f")
		if err != nil {
			t.Fatalf("%s, %s: %v", name, what, err)
		}
		defer f.Close()
		before := cl.Stats()
		buf := make([]byte, 4096)
		for off := 0; off < upTo; off += len(buf) {
			if _, err := f.ReadAt(buf, int64(off)); err != nil {
				t.Fatalf("%s, %s: read at %d: %v", name, what, off, err)
			}
			if !bytes.Equal(buf, data[off:off+len(buf)]) {
				t.Fatalf("%s, %s: wrong bytes at %d", name, what, off)
			}
		}
		after := cl.Stats()
		return after.Optimistic - before.Optimistic, after.OptimisticFallbacks - before.OptimisticFallbacks
	}
	const blocks = 16
	for name := range clients {
		readAll(name, "first reads", len(data))
		if o, f := readAll(name, "second reads", len(data)); o != blocks || f != 0 {
			t.Fatalf("%s: second reads: %d optimistic, %d fell back; want %d, 0", name, o, f, blocks)
		}
	}
	n.proc.kill()
	c.startNode(t, "n1", nodeArgs...)
	waitNodesUp(t, c.conf, 1, 20*time.Second)
	for name := range clients {
		// The first block's old reference is refused: a fallback (more
		// than one if the dead connection is found on the way).
		if o, f := readAll(name, "first block after the restart", 4096); o != 0 || f == 0 {
			t.Fatalf("%s: first read after the restart: %d optimistic, %d fell back; want none, and a fallback", name, o, f)
		}
		// The rest: by new references (a reply refills its store
		// block's) or by request, the old epoch's dropped.
		o, f := readAll(name, "after the restart", len(data))
		t.Logf("%s after the restart: %d optimistic, %d fell back", name, o, f)
		if o, f := readAll(name, "references refilled", len(data)); o != blocks || f != 0 {
			t.Fatalf("%s: reads after the refill: %d optimistic, %d fell back; want %d, 0", name, o, f, blocks)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/nfsclient"
	"github.com/sluicefs/sluice/internal/oncrpc"
)

var reOptimistic = regexp.MustCompile(`^sluice: optimistic reads: (\d+) served, (\d+) fell back to a request$`)

// odCounts are a front end's optimistic-read counters.
type odCounts struct{ served, fellBack uint64 }

// mountODAFS asks a `sluice mount --odafs` for its counters (SIGUSR1)
// and waits for the line it prints.
func mountODAFS(t *testing.T, p *proc) odCounts {
	t.Helper()
	count := func() (int, []string) {
		n, last := 0, []string(nil)
		for _, l := range p.out.snapshot() {
			if m := reOptimistic.FindStringSubmatch(l); m != nil {
				n, last = n+1, m
			}
		}
		return n, last
	}
	before, _ := count()
	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatalf("%s: SIGUSR1: %v", p.name, err)
	}
	var m []string
	eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		var n int
		n, m = count()
		return n > before, "no counters printed after SIGUSR1"
	})
	return parseODCounts(t, m)
}

func parseODCounts(t *testing.T, m []string) odCounts {
	t.Helper()
	s, err1 := strconv.ParseUint(m[1], 10, 64)
	f, err2 := strconv.ParseUint(m[2], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("counters %q", m[0])
	}
	return odCounts{s, f}
}

// odRanges are the small ranges read back: inside the first block, across
// the second and third, and the short last block.
var odRanges = [][2]int64{{0, 100}, {4096 + 7, 4096 + 50}, {3 * 4096, 100}}

// readRanges reads odRanges of path with one open, as a program would.
func readRanges(t *testing.T, path string, want []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, r := range odRanges {
		got := make([]byte, r[1])
		if n, err := f.ReadAt(got, r[0]); err != nil || n != len(got) {
			t.Fatalf("reading [%d, +%d) of %s: %d bytes, %v", r[0], r[1], path, n, err)
		}
		if !bytes.Equal(got, want[r[0]:r[0]+r[1]]) {
			t.Fatalf("[%d, +%d) of %s: not the bytes written", r[0], r[1], path)
		}
	}
}

// overwrite writes data over path in place (the file keeps its chunks,
// which get a new version), through a mount.
func overwrite(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil { // close-to-open: durable now
		t.Fatal(err)
	}
}

// TestODAFSFrontEnds runs optimistic reads end to end: `sluice up
// --export-cache` starts a node with an exported cache; a FUSE mount and
// the NFS gateway with --odafs --odafs-cache 0 (references only, so
// every read they count as optimistic was a one-sided read of the
// node's cache) read a small file twice. The second reads must be
// optimistic, by the counters the front ends give (the mount's on
// SIGUSR1, the gateway's stats program), and right; after another mount
// overwrites the file in place, they must return the new bytes (the
// node invalidated the blocks the references named), then read
// optimistically again through the fresh references.
func TestODAFSFrontEnds(t *testing.T) {
	requireFUSE(t)
	requireLibnfs(t)
	c := startUp(t, filepath.Join(baseDir(t), "data"), 1, "--export-cache", "1MiB", "--export-block", "4KiB")
	data := randomBytes(t, 3*4096+100)
	mustRun(t, c.conf, nil, "mkdir", "/odafs")
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/odafs/f")
	w := mountAt(t, c.conf, "w") // the other client, which overwrites

	t.Run("mount", func(t *testing.T) {
		r := mountAt(t, c.conf, "r", "--odafs", "--odafs-cache", "0")
		path := filepath.Join(r.dir, "odafs", "f")
		readRanges(t, path, data)
		first := mountODAFS(t, r.proc)
		readRanges(t, path, data)
		second := mountODAFS(t, r.proc)
		if second.served <= first.served || second.fellBack != first.fellBack {
			t.Fatalf("second reads: optimistic reads %+v after the first reads, %+v after the second: want more served, none fallen back", first, second)
		}
		fresh := randomBytes(t, len(data))
		overwrite(t, filepath.Join(w.dir, "odafs", "f"), fresh)
		readRanges(t, path, fresh)
		third := mountODAFS(t, r.proc)
		readRanges(t, path, fresh)
		if fourth := mountODAFS(t, r.proc); fourth.served <= third.served || fourth.fellBack != third.fellBack {
			t.Errorf("reads after the overwrite's: %+v, then %+v: want more served through the fresh references", third, fourth)
		}
		t.Logf("optimistic reads: %+v %+v %+v", first, second, third)
		// At the unmount it says its counters once more, last.
		mustRun(t, c.conf, nil, "umount", r.dir)
		select {
		case <-r.proc.done:
		case <-time.After(15 * time.Second):
			t.Fatal("sluice mount still running 15s after it was unmounted")
		}
		lines := r.proc.out.snapshot()
		if last := reOptimistic.FindStringSubmatch(lines[len(lines)-1]); last == nil {
			t.Errorf("the mount's last line %q: want its counters", lines[len(lines)-1])
		} else if got := parseODCounts(t, last); got.served < third.served {
			t.Errorf("counters at the unmount %+v, fewer than before it %+v", got, third)
		}
	})

	t.Run("nfs", func(t *testing.T) {
		// The gateway's own cache off: its READs reach the SDK.
		addr, _ := nfsGateway(t, c.conf, "--odafs", "--odafs-cache", "0", "--cache-mib", "0")
		ctx := context.Background()
		rc, err := oncrpc.DialResv(ctx, addr, oncrpc.ResvNone)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		stats := func() nfs3.Stats {
			st, err := serverStats(ctx, nfsclient.TCP(rc))
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		want, _ := os.ReadFile(filepath.Join(w.dir, "odafs", "f")) // what the mount subtest left
		cat := func() []byte { return libnfs(t, "nfs-cat", nfsURL(addr, "/odafs/f")) }
		if got := cat(); !bytes.Equal(got, want) {
			t.Fatalf("nfs-cat: %d bytes, not the file's %d", len(got), len(want))
		}
		first := stats()
		if got := cat(); !bytes.Equal(got, want) {
			t.Fatalf("nfs-cat again: %d bytes, not the file's %d", len(got), len(want))
		}
		second := stats()
		if second.Optimistic <= first.Optimistic || second.OptimisticFallbacks != first.OptimisticFallbacks {
			t.Fatalf("second read: gateway's optimistic reads %d (%d fell back) after the first, %d (%d) after the second: want more served, none fallen back",
				first.Optimistic, first.OptimisticFallbacks, second.Optimistic, second.OptimisticFallbacks)
		}
		fresh := randomBytes(t, len(want))
		overwrite(t, filepath.Join(w.dir, "odafs", "f"), fresh)
		// Another client's write shows within the gateway's attribute
		// time (1 s); until then whole old bytes, never a mix.
		eventually(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
			got := cat()
			if !bytes.Equal(got, fresh) && !bytes.Equal(got, want) {
				t.Fatalf("nfs-cat after the overwrite: neither the old bytes nor the new")
			}
			return bytes.Equal(got, fresh), "nfs-cat still returns the bytes overwritten"
		})
		third := stats()
		if got := cat(); !bytes.Equal(got, fresh) {
			t.Fatal("nfs-cat after the overwrite: not the new bytes")
		}
		if fourth := stats(); fourth.Optimistic <= third.Optimistic || fourth.OptimisticFallbacks != third.OptimisticFallbacks {
			t.Errorf("reads after the overwrite's: %d served (%d fell back), then %d (%d): want more served through the fresh references",
				third.Optimistic, third.OptimisticFallbacks, fourth.Optimistic, fourth.OptimisticFallbacks)
		}
		t.Log(fmt.Sprintf("gateway optimistic reads: %d, %d, %d (fallbacks %d)", first.Optimistic, second.Optimistic, third.Optimistic, third.OptimisticFallbacks))
	})
}

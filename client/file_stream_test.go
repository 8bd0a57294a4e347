package client_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicefs/sluice/client"
)

// TestGetIntoFile covers Get into a regular file, which receives the
// pieces straight into the file's mapped pages: whole files across chunks
// with replicas 1 and 3, a hole, appending after what the file holds, and
// the files that must take the streaming path (not at their end,
// write-only) — every one byte for byte, the offset left at the end as
// write(2) would.
func TestGetIntoFile(t *testing.T) {
	c := startCluster(t, 3)
	// Whole-block pieces land in the file itself, others (300 KiB: not
	// whole blocks) are copied into it.
	for _, req := range []int{0, 300 << 10} {
		t.Run(fmt.Sprintf("ReadReq=%d", req), func(t *testing.T) { getIntoFile(t, newClient(t, c, client.Options{ReadReq: req}), req) })
	}
}

func getIntoFile(t *testing.T, cl *client.Client, req int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(18, uint64(req)))
	dir := tmpDir(t)
	for _, k := range []int{1, 3} {
		dirWithPolicy(t, cl, fmt.Sprintf("/k%d", k), k)
	}
	data := randBytes(rng, 3*testChunk+12345)
	for _, p := range []string{"/k1/f", "/k3/f"} {
		if _, err := cl.Put(ctx, p, bytes.NewReader(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A file with a hole: its first chunk and a half never written.
	fh, err := cl.Create(ctx, "/k1/holey", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	tail := data[:testChunk]
	if _, err := fh.WriteAt(tail, 3*testChunk/2); err != nil {
		t.Fatal(err)
	}
	holey := append(make([]byte, 3*testChunk/2), tail...)

	check := func(name, path string, want []byte, open func() (*os.File, error)) {
		t.Helper()
		out, err := open()
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		before, _ := out.Seek(0, io.SeekCurrent)
		prefix := make([]byte, before)
		if _, err := out.ReadAt(prefix, 0); err != nil && before > 0 {
			t.Fatal(err)
		}
		n, err := cl.Get(ctx, path, out)
		if err != nil || n != int64(len(want)) {
			t.Fatalf("%s: get %s: %d bytes, %v", name, path, n, err)
		}
		if pos, _ := out.Seek(0, io.SeekCurrent); pos != before+n {
			t.Fatalf("%s: offset %d after get, want %d", name, pos, before+n)
		}
		got, err := os.ReadFile(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		// Past what Get wrote, an overwritten file keeps its old bytes.
		if len(got) < len(prefix)+len(want) || !bytes.Equal(got[:len(prefix)+len(want)], append(prefix, want...)) {
			t.Fatalf("%s: the file holds %d bytes differing from the %d expected", name, len(got), len(prefix)+len(want))
		}
	}
	create := func(name string) func() (*os.File, error) {
		return func() (*os.File, error) { return os.Create(filepath.Join(dir, name)) }
	}
	check("replicas 1", "/k1/f", data, create("k1"))
	check("replicas 3", "/k3/f", data, create("k3"))
	check("hole", "/k1/holey", holey, create("holey"))
	check("appending", "/k1/f", data, func() (*os.File, error) {
		f, err := os.Create(filepath.Join(dir, "append"))
		if err == nil {
			_, err = f.Write([]byte("already here"))
		}
		return f, err
	})
	// Not at the end: Get writes from the offset, over what is there.
	check("overwriting", "/k3/f", data, func() (*os.File, error) {
		f, err := os.Create(filepath.Join(dir, "over"))
		if err == nil {
			_, err = f.Write(make([]byte, 4*testChunk))
		}
		if err == nil {
			_, err = f.Seek(0, io.SeekStart)
		}
		return f, err
	})
	// Write-only: cannot be mapped (streams).
	check("write-only", "/k1/f", data, func() (*os.File, error) {
		return os.OpenFile(filepath.Join(dir, "wo"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	})
}

// TestGetIntoFileFails: a Get into a file that fails part way (the only
// replica's node is down) returns an error and leaves the file as it
// was, not extended to the full size with pieces missing.
func TestGetIntoFileFails(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, client.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dirWithPolicy(t, cl, "/k1", 1)
	// Six chunks over three nodes: some live on the node stopped below.
	data := randBytes(rand.New(rand.NewPCG(18, 9)), 6*testChunk)
	if _, err := cl.Put(ctx, "/k1/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Nodes[0].Close()
	out, err := os.Create(filepath.Join(tmpDir(t), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := out.Write([]byte("kept")); err != nil {
		t.Fatal(err)
	}
	if n, err := cl.Get(ctx, "/k1/f", out); err == nil {
		t.Fatalf("get with a chunk's only node down: %d bytes, no error", n)
	}
	if fi, err := out.Stat(); err != nil || fi.Size() != 4 {
		t.Fatalf("after a failed get the file is %d bytes (%v), want the 4 it held", fi.Size(), err)
	}
}

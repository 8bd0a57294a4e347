package sdk_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluicefs/sluice/internal/sdk"
)

// TestPutFromPipe: a put from a pipe stores what the pipe carried, and
// grows the pipe first (the default 64 KiB makes the writer and the put
// take turns, a context switch every 64 KiB).
func TestPutFromPipe(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	data := randBytes(rand.New(rand.NewPCG(18, 1)), 5*testChunk+777)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	before, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	if before >= 1<<20 {
		t.Skipf("pipes start at %d bytes here: nothing to grow", before)
	}
	go func() {
		w.Write(data)
		w.Close()
	}()
	if n, err := cl.Put(ctx, "/piped", r, 0o644); err != nil || n != int64(len(data)) {
		t.Fatalf("put from a pipe: %d, %v", n, err)
	}
	if after, err := unix.FcntlInt(r.Fd(), unix.F_GETPIPE_SZ, 0); err != nil || after < 1<<20 {
		t.Errorf("pipe of %d bytes after the put (%v), was %d: not grown", after, err, before)
	}
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/piped", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("get: %d bytes, %v", out.Len(), err)
	}
}

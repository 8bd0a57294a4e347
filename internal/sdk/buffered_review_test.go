package sdk_test

import (
	"bytes"
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestBufferedLossSeenByAll: buffered writes whose send fails when a
// read (or another caller's Flush) sends them are a loss like a failed
// background send: OnLost is called (the NFS gateway changes its write
// verifier) and Lost counts it, so a second caller that flushes after
// the first took the error still learns of it (a mount's other file
// descriptor, whose fsync must not succeed).
func TestBufferedLossSeenByAll(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{OpTimeout: 5 * time.Second})
	ctx := context.Background()
	f, err := cl.Create(ctx, "/gone", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int32
	b := sdk.NewBuffered(f, sdk.BufferOptions{WriteBuffer: 4 << 20, OnLost: func(error) { lost.Add(1) }})
	before, _ := b.Lost()
	chunk := bytes.Repeat([]byte("y"), 64<<10)
	for off := int64(0); off < 4*int64(len(chunk)); off += int64(len(chunk)) {
		n, buffered, err := b.WriteAtBuffered(ctx, chunk, off)
		if err != nil || n != len(chunk) || !buffered {
			t.Fatalf("write at %d: %d, buffered %v, %v", off, n, buffered, err)
		}
	}
	if err := cl.Remove(ctx, "/gone"); err != nil {
		t.Fatal(err)
	}
	// A reader sends the buffered writes, and is told they failed.
	if _, err := b.ReadAtContext(ctx, make([]byte, 10), 0); err == nil {
		t.Fatal("a read flushing writes to a removed file succeeded")
	}
	if lost.Load() == 0 {
		t.Fatal("OnLost not called when buffered writes failed to send at a read")
	}
	// The failure was the reader's: a writer's Flush now says nothing...
	if err := b.Flush(ctx); err != nil {
		t.Logf("second Flush: %v", err)
	}
	// ...but the loss is on record for it.
	if n, last := b.Lost(); n == before || last == nil {
		t.Fatalf("Lost after the failed send: %d (before %d), %v", n, before, last)
	}
}

// TestBufferedWriteNearMaxOffset: a write whose end would wrap past
// int64 is refused at once (EFBIG), not buffered and acknowledged.
func TestBufferedWriteNearMaxOffset(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{OpTimeout: 5 * time.Second})
	ctx := context.Background()
	f, err := cl.Create(ctx, "/far", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	b := sdk.NewBuffered(f, sdk.BufferOptions{WriteBuffer: 1 << 20})
	p := make([]byte, 100)
	for _, off := range []int64{math.MaxInt64 - 10, math.MaxInt64 - 99, metaapi.MaxFileSize - 99} {
		if n, buffered, err := b.WriteAtBuffered(ctx, p, off); err == nil || buffered || n != 0 {
			t.Errorf("write of 100 bytes at %d: %d, buffered %v, %v", off, n, buffered, err)
		}
	}
	if b.Pending() {
		t.Error("a refused write left something pending")
	}
}

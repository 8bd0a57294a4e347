package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/sluicefs/sluice/internal/sdk"
)

// TestBudgetKeepsWholeWriteBuffers: a Budget keeps a few write buffers of
// finished streams so the next stream need not allocate (and zero) one.
// A buffer grows to a whole write buffer through smaller ones (the NFS
// gateway's first buffered WRITE starts one of 1 MiB); those outgrown,
// and kept too, took the few places while no stream ever asked for their
// size again, and after four streams no whole buffer was kept at all.
func TestBudgetKeepsWholeWriteBuffers(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	const mib = 1 << 20
	const wb = 4 * mib
	bud := sdk.NewBudget(256 * mib)
	opts := sdk.BufferOptions{Sequential: 1, WriteBuffer: wb, ReadAhead: -1, Budget: bud}
	ctx := context.Background()
	piece := bytes.Repeat([]byte{7}, mib)
	for i := range 6 {
		f, err := cl.Create(ctx, fmt.Sprintf("/s%d", i), 0o644)
		if err != nil {
			t.Fatal(err)
		}
		b := sdk.NewBuffered(f, opts)
		for off := int64(0); off < 6*mib; off += mib {
			if _, err := b.WriteAtContext(ctx, piece, off); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		caps := sdk.SpareCaps(bud)
		if i > 0 && !slices.Contains(caps, wb) {
			t.Fatalf("after stream %d the budget keeps buffers of %v bytes, none a whole write buffer (%d) for the next stream", i, caps, wb)
		}
	}
}

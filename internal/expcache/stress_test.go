//go:build !race

// The readers copy bytes the writer is changing, as a client's one-sided
// reads do across processes: a data race by design, which the seqlock and
// the CRC make safe. The race detector would report it, so this test is
// left out of -race builds.

package expcache

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestOptimisticReadsUnderOverwrites: a million optimistic reads against
// a writer that keeps refilling, evicting and invalidating blocks return
// no byte of a fill other than the one their reference names: every
// accepted read equals the block's bytes at the reference's version.
func TestOptimisticReadsUnderOverwrites(t *testing.T) {
	reads := 1_000_000
	if testing.Short() {
		reads = 100_000
	}
	const blocks = 16
	c, _ := New(arena(8), bs, 0) // fewer slots than blocks: evictions
	var refs [blocks]atomic.Pointer[Ref]
	var version atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the node: fills, refills, invalidates
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b := uint64(i % blocks)
			if i%17 == 0 {
				c.Invalidate(1, b)
				continue
			}
			v := version.Add(1)
			r, err := c.Fill(1, b, v, pattern(b, v, int(b*29)%bs+1))
			if err != nil {
				t.Error(err)
				return
			}
			refs[b].Store(&r)
			if i%64 == 0 {
				runtime.Gosched()
			}
		}
	}()
	var accepted, stale atomic.Int64
	var bad atomic.Value
	readers := 2
	var rg sync.WaitGroup
	for w := range readers {
		rg.Add(1)
		go func() {
			defer rg.Done()
			slot := make([]byte, HeaderSize+bs)
			for i := w; i < reads; i += readers {
				r := refs[i%blocks].Load()
				for r == nil { // not filled yet
					runtime.Gosched()
					r = refs[i%blocks].Load()
				}
				off := r.Off(bs)
				copy(slot, c.mem[off:off+HeaderSize+bs])
				gen := c.header(r.Slot).gen().Load()
				data, err := Check(*r, slot, gen, bs)
				if err != nil {
					if !errors.Is(err, ErrStale) {
						bad.Store(err.Error())
					}
					stale.Add(1)
					continue
				}
				accepted.Add(1)
				if !bytes.Equal(data, pattern(r.Block, r.Version, len(data))) {
					bad.Store("accepted bytes of another fill")
				}
			}
		}()
	}
	rg.Wait()
	close(stop)
	wg.Wait()
	if b := bad.Load(); b != nil {
		t.Fatal(b)
	}
	if accepted.Load() == 0 || stale.Load() == 0 {
		t.Fatalf("%d accepted, %d stale: the test did not exercise both", accepted.Load(), stale.Load())
	}
	t.Logf("%d reads accepted, %d stale", accepted.Load(), stale.Load())
}

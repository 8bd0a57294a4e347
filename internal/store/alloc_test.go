package store

import (
	"testing"
)

// TestPlaceDoesNotAllocate guards the per-packet hot path, both into the
// append region and into staging (an overwrite).
func TestPlaceDoesNotAllocate(t *testing.T) {
	const pkt = 64 << 10
	const runs = 50
	s := openStore(t, Options{})
	p := make([]byte, pkt)
	for _, overwrite := range []bool{false, true} {
		if overwrite {
			// Commit the whole range first so the next write is staged.
			w, err := s.BeginWrite(1, 0, (runs+1)*pkt, 0)
			if err != nil {
				t.Fatal(err)
			}
			for i := range runs + 1 {
				if err := w.Place(int64(i)*pkt, p); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := w.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		w, err := s.BeginWrite(1, 0, (runs+1)*pkt, 0)
		if err != nil {
			t.Fatal(err)
		}
		if (w.stage != nil) != overwrite {
			t.Fatalf("overwrite=%v but staging=%v", overwrite, w.stage != nil)
		}
		off := int64(0)
		allocs := testing.AllocsPerRun(runs, func() {
			if err := w.Place(off, p); err != nil {
				t.Fatal(err)
			}
			off += pkt
		})
		if allocs != 0 {
			t.Errorf("overwrite=%v: Place allocates %.1f times per call", overwrite, allocs)
		}
		w.Abort()
	}
}

package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
)

// BenchmarkPlace measures the per-packet path into the append region:
// 64 KiB packets, CRC and pwrite each. Writes of 16 MiB are aborted (off
// the clock) so tmpfs does not fill.
func BenchmarkPlace(b *testing.B) {
	const pkt = 64 << 10
	const perWrite = 256
	s := openStore(b, Options{Dir: testDir(b)})
	p := make([]byte, pkt)
	for i := range p {
		p[i] = byte(i * 7)
	}
	b.SetBytes(pkt)
	b.ReportAllocs()
	var w *Write
	var off int64
	b.ResetTimer()
	for i := range b.N {
		if i%perWrite == 0 {
			b.StopTimer()
			if w != nil {
				w.Abort()
			}
			var err error
			if w, err = s.BeginWrite(1, 0, perWrite*pkt, 0); err != nil {
				b.Fatal(err)
			}
			off = 0
			b.StartTimer()
		}
		if err := w.Place(off, p); err != nil {
			b.Fatal(err)
		}
		off += pkt
	}
	b.StopTimer()
	if w != nil {
		w.Abort()
	}
}

// BenchmarkWriteCommit measures whole writes in 64 KiB packets: a new
// chunk (append region only) and a rewrite of a committed one (everything
// staged, then applied).
func BenchmarkWriteCommit(b *testing.B) {
	const pkt = 64 << 10
	for _, size := range []int64{1 << 20, 64 << 20} {
		for _, mode := range []string{"append", "overwrite"} {
			b.Run(fmt.Sprintf("%s/%dMiB", mode, size>>20), func(b *testing.B) {
				s := openStore(b, Options{Dir: testDir(b)})
				p := make([]byte, pkt)
				var inCommit time.Duration
				one := func(id ids.ChunkID) {
					w, err := s.BeginWrite(id, 0, size, 0)
					if err != nil {
						b.Fatal(err)
					}
					for off := int64(0); off < size; off += pkt {
						if err := w.Place(off, p); err != nil {
							b.Fatal(err)
						}
					}
					t0 := time.Now()
					if _, err := w.Commit(); err != nil {
						b.Fatal(err)
					}
					inCommit += time.Since(t0)
				}
				if mode == "overwrite" {
					one(1)
				}
				b.SetBytes(size)
				inCommit = 0
				b.ResetTimer()
				for i := range b.N {
					if mode == "overwrite" {
						one(1)
						continue
					}
					// A fresh chunk each time, deleted off the clock so
					// tmpfs does not fill.
					id := ids.ChunkID(i + 2)
					one(id)
					{
						b.StopTimer()
						if err := s.Delete(id); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
				}
				b.ReportMetric(float64(inCommit.Microseconds())/float64(b.N), "commit-µs/op")
			})
		}
	}
}

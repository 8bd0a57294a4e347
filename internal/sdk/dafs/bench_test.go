package dafs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/sluicefs/sluice/internal/sdk/dafs"
)

// BenchmarkRandomRead4K: 4 KiB reads at random 4 KiB-aligned offsets of
// one 16 MiB file on a three-node in-process cluster (data on /dev/shm),
// through the asynchronous API with 1, 8 and 64 ops outstanding, against
// the synchronous File.ReadAt from 1, 8 and 64 goroutines — same file,
// same cluster, same run. IOPS is reads per second.
func BenchmarkRandomRead4K(b *testing.B) {
	const size, span = 4 << 10, 16 << 20
	fx := newFixture(b, span)
	ctx := context.Background()
	for _, k := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("sync/outstanding=%d", k), func(b *testing.B) {
			var next sync.Mutex
			left := b.N
			var wg sync.WaitGroup
			b.ResetTimer()
			for g := range k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 9))
					buf := make([]byte, size)
					for {
						next.Lock()
						if left == 0 {
							next.Unlock()
							return
						}
						left--
						next.Unlock()
						if _, err := fx.f.ReadAt(buf, rng.Int64N(span/size)*size); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "IOPS")
		})
		b.Run(fmt.Sprintf("async/outstanding=%d", k), func(b *testing.B) {
			s := dafs.New(fx.cl, dafs.Options{})
			defer s.Close()
			buf, err := s.Register(make([]byte, k*size))
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, 9))
			op := func(slot int) *dafs.Op {
				return dafs.ReadAsync(fx.f, rng.Int64N(span/size)*size, buf, slot*size, size)
			}
			b.ResetTimer()
			sent, done := 0, 0
			var ops []*dafs.Op
			for slot := 0; slot < k && sent < b.N; slot++ {
				ops = append(ops, op(slot))
				sent++
			}
			if err := s.Submit(ctx, ops...); err != nil {
				b.Fatal(err)
			}
			for done < b.N {
				cs, err := s.Wait(ctx, 1)
				if err != nil {
					b.Fatal(err)
				}
				ops = ops[:0]
				for _, c := range cs {
					if c.Err != nil {
						b.Fatal(c.Err)
					}
					done++
					if sent < b.N {
						ops = append(ops, op(c.Op.BufOff/size))
						sent++
					}
				}
				if err := s.Submit(ctx, ops...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "IOPS")
			st := s.Stats()
			b.ReportMetric(float64(st.Reads)/float64(max(st.Requests, 1)), "reads/request")
		})
	}
}

// BenchmarkCachedRandomRead4K: 4 KiB reads at random 4 KiB-aligned
// offsets of a 16 MiB file (same cluster as BenchmarkRandomRead4K), one
// at a time: through a session without a cache (Submit, Wait), with
// File.ReadAt, and through a Cache of 4 KiB blocks holding a quarter,
// half and three quarters of the file (LRU over uniform reads: hit
// ratios about 25, 50 and 75%; the measured one is reported). The cache
// is filled before the timer starts.
func BenchmarkCachedRandomRead4K(b *testing.B) {
	const size, span = 4 << 10, 16 << 20
	fx := newFixture(b, span)
	ctx := context.Background()
	b.Run("session", func(b *testing.B) {
		s := dafs.New(fx.cl, dafs.Options{})
		defer s.Close()
		buf, err := s.Register(make([]byte, size))
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, 9))
		b.ResetTimer()
		for range b.N {
			if err := s.Submit(ctx, dafs.ReadAsync(fx.f, rng.Int64N(span/size)*size, buf, 0, size)); err != nil {
				b.Fatal(err)
			}
			cs, err := s.Wait(ctx, 1)
			if err != nil || cs[0].Err != nil {
				b.Fatal(err, cs)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "IOPS")
	})
	b.Run("file", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(7, 9))
		p := make([]byte, size)
		b.ResetTimer()
		for range b.N {
			if _, err := fx.f.ReadAt(p, rng.Int64N(span/size)*size); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "IOPS")
	})
	for _, quarters := range []int64{1, 2, 3} {
		b.Run(fmt.Sprintf("cache=%d%%", quarters*25), func(b *testing.B) {
			s := dafs.New(fx.cl, dafs.Options{})
			defer s.Close()
			c, err := dafs.NewCache(s, dafs.CacheOptions{BlockSize: size, Bytes: span * quarters / 4})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(ctx)
			rng := rand.New(rand.NewPCG(7, 9))
			p := make([]byte, size)
			for range span / size * quarters / 4 { // fill: the cache's worth of blocks
				if _, err := c.ReadAt(ctx, fx.f, p, rng.Int64N(span/size)*size); err != nil {
					b.Fatal(err)
				}
			}
			st0 := c.Stats()
			b.ResetTimer()
			for range b.N {
				if _, err := c.ReadAt(ctx, fx.f, p, rng.Int64N(span/size)*size); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "IOPS")
			st := c.Stats()
			b.ReportMetric(float64(st.Hits-st0.Hits)/float64(b.N), "hit-ratio")
		})
	}
}

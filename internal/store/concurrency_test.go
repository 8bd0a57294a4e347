package store

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestConcurrentWritersAndReaders runs writers on their own chunks, two
// writers contending for one shared chunk, and readers checking that every
// read view they get is self-consistent (data matches its checksums) —
// which fails if a commit's visibility switch or staging apply ever
// interleaves with a reader. Run it with -race.
func TestConcurrentWritersAndReaders(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096, MaxChunkSize: 1 << 20})
	const (
		writers   = 4
		perWriter = 3
		ops       = 40
		shared    = ids.ChunkID(1000)
	)
	var wg sync.WaitGroup
	var stop atomic.Bool
	errc := make(chan error, 64)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}

	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 77))
			m := newModel()
			for range ops {
				id := ids.ChunkID(g*perWriter + rng.IntN(perWriter) + 1)
				L := int64(len(m.data[id]))
				off := rng.Int64N(L + 20000)
				p := randBytes(rng, rng.IntN(20000))
				got, err := write(s, rng, id, off, p, m.info[id].Version+1)
				if err != nil {
					fail(fmt.Errorf("writer %d: %w", g, err))
					return
				}
				if want := m.apply(id, off, p); got != want {
					fail(fmt.Errorf("writer %d: committed %+v, want %+v", g, got, want))
					return
				}
				if err := checkChunk(s, id, m.info[id], m.data[id]); err != nil {
					fail(fmt.Errorf("writer %d: %w", g, err))
					return
				}
			}
		}()
	}

	var sharedCommits atomic.Int64
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 99))
			for range ops / 2 {
				for {
					w, err := s.BeginWrite(shared, rng.Int64N(50000), 3000, 0)
					if errors.Is(err, ErrBusy) {
						runtime.Gosched()
						continue
					}
					if err != nil {
						fail(err)
						return
					}
					if err := placeAll(w, rng, w.off, randBytes(rng, 3000)); err != nil {
						fail(err)
						return
					}
					if _, err := w.Commit(); err != nil {
						fail(err)
						return
					}
					sharedCommits.Add(1)
					break
				}
			}
		}()
	}

	var readers sync.WaitGroup
	var views atomic.Int64
	for g := range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 55))
			buf := make([]byte, 1<<20)
			for !stop.Load() {
				id := ids.ChunkID(rng.IntN(writers*perWriter) + 1)
				if rng.IntN(3) == 0 {
					id = shared
				}
				if err := checkSelfConsistent(s, id, buf); err != nil {
					fail(fmt.Errorf("reader %d: %w", g, err))
					return
				}
				views.Add(1)
				if _, err := s.Stat(id); err != nil {
					fail(err)
					return
				}
				s.Usage()
			}
		}()
	}

	wg.Wait()
	stop.Store(true)
	readers.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if in, _ := s.Stat(shared); in.Version != uint64(sharedCommits.Load()) {
		t.Errorf("shared chunk at version %d after %d commits", in.Version, sharedCommits.Load())
	}
	if views.Load() == 0 {
		t.Error("readers never got a view")
	}
	for id := ids.ChunkID(1); id <= writers*perWriter; id++ {
		if _, err := s.Verify(id); err != nil {
			t.Error(err)
		}
	}
}

func checkSelfConsistent(s *Store, id ids.ChunkID, buf []byte) error {
	r, err := s.OpenRead(id)
	if err != nil {
		return err
	}
	defer r.Close()
	L := r.Info().Length
	B := int64(s.BlockSize())
	nb := int((L + B - 1) / B)
	sums, err := r.Checksums(0, nb, nil)
	if err != nil {
		return err
	}
	data := buf[:L]
	if n, err := r.ReadAt(data, 0); n != len(data) || (err != nil && n < len(data)) {
		return fmt.Errorf("read %v: %d, %v", id, n, err)
	}
	for i, want := range sums {
		blk := data[int64(i)*B : min(int64(i+1)*B, L)]
		if got := crc32.Checksum(blk, castagnoli); got != want {
			return fmt.Errorf("view of %v v%d: block %d crc %#x, checksum says %#x", id, r.Info().Version, i, got, want)
		}
	}
	return nil
}

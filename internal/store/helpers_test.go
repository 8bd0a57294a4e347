package store

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// testDir returns a fresh directory on tmpfs when there is one, so tests
// and benchmarks measure the store rather than the disk.
func testDir(tb testing.TB) string {
	tb.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "sluice-store-")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return tb.TempDir()
}

func openStore(tb testing.TB, opts Options) *Store {
	tb.Helper()
	if opts.Dir == "" {
		opts.Dir = testDir(tb)
	}
	s, err := Open(opts)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func reopen(tb testing.TB, s *Store) *Store {
	tb.Helper()
	if err := s.Close(); err != nil {
		tb.Fatalf("Close: %v", err)
	}
	return openStore(tb, Options{Dir: s.dir, MaxChunkSize: s.maxChunk})
}

func randBytes(rng *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// placeAll places data at off in random packet sizes, receiving packets
// directly into the mapped append region when the store offers it, as the
// fabric does.
func placeAll(w *Write, rng *rand.Rand, off int64, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), 1+rng.IntN(3*w.s.blockSize/2))
		if rng.IntN(4) == 0 {
			n = min(len(data), 1+rng.IntN(64))
		}
		pkt := data[:n]
		if dst := w.DirectBegin(off, n); dst != nil && rng.IntN(4) != 0 {
			copy(dst, pkt)
			w.DirectEnd()
			pkt = dst
		} else if dst != nil {
			w.DirectEnd()
		}
		if err := w.Place(off, pkt); err != nil {
			return err
		}
		off += int64(n)
		data = data[n:]
	}
	return nil
}

// write runs a whole write transaction.
func write(s *Store, rng *rand.Rand, id ids.ChunkID, off int64, data []byte, version uint64) (Info, error) {
	w, err := s.BeginWrite(id, off, int64(len(data)), version)
	if err != nil {
		return Info{}, err
	}
	if err := placeAll(w, rng, off, data); err != nil {
		w.Abort()
		return Info{}, err
	}
	if rng.IntN(2) == 0 { // half the time, sync ahead of the commit as a replica does
		if err := w.Sync(); err != nil {
			w.Abort()
			return Info{}, err
		}
	}
	in, err := w.Commit()
	w.Abort() // no-op after Commit
	return in, err
}

// model is the expected content of every chunk.
type model struct {
	data map[ids.ChunkID][]byte
	info map[ids.ChunkID]Info
}

func newModel() *model {
	return &model{data: map[ids.ChunkID][]byte{}, info: map[ids.ChunkID]Info{}}
}

func (m *model) apply(id ids.ChunkID, off int64, p []byte) Info {
	d := m.data[id]
	if end := off + int64(len(p)); int64(len(d)) < end {
		d = append(d, make([]byte, end-int64(len(d)))...)
	}
	copy(d[off:], p)
	m.data[id] = d
	in := Info{Version: m.info[id].Version + 1, Length: int64(len(d))}
	m.info[id] = in
	return in
}

// mustWrite writes and applies to the model, checking the returned Info.
func (m *model) mustWrite(t testing.TB, s *Store, rng *rand.Rand, id ids.ChunkID, off int64, p []byte) {
	t.Helper()
	version := m.info[id].Version + 1
	if rng.IntN(2) == 0 {
		version = 0 // let the store assign it
	}
	got, err := write(s, rng, id, off, p, version)
	if err != nil {
		t.Fatalf("write %v [%d, +%d): %v", id, off, len(p), err)
	}
	if want := m.apply(id, off, p); got != want {
		t.Fatalf("write %v [%d, +%d): committed %+v, want %+v", id, off, len(p), got, want)
	}
}

// check compares a chunk's Stat, data and checksums with the model.
func (m *model) check(t testing.TB, s *Store, id ids.ChunkID) {
	t.Helper()
	if err := checkChunk(s, id, m.info[id], m.data[id]); err != nil {
		t.Fatal(err)
	}
}

func checkChunk(s *Store, id ids.ChunkID, wantInfo Info, want []byte) error {
	in, err := s.Stat(id)
	if err != nil {
		return fmt.Errorf("stat %v: %w", id, err)
	}
	if in != wantInfo {
		return fmt.Errorf("stat %v = %+v, want %+v", id, in, wantInfo)
	}
	r, err := s.OpenRead(id)
	if err != nil {
		return fmt.Errorf("open read %v: %w", id, err)
	}
	defer r.Close()
	return checkView(r, wantInfo, want)
}

func checkView(r *Read, wantInfo Info, want []byte) error {
	id := r.id
	if r.Info() != wantInfo {
		return fmt.Errorf("read view of %v: info %+v, want %+v", id, r.Info(), wantInfo)
	}
	got := make([]byte, len(want)+10)
	n, err := r.ReadAt(got, 0)
	if n != len(want) || !errors.Is(err, io.EOF) {
		return fmt.Errorf("ReadAt(%d bytes, 0) of %v = %d, %v; want %d, EOF", len(got), id, n, err, len(want))
	}
	if !bytes.Equal(got[:n], want) {
		i := 0
		for i < n && got[i] == want[i] {
			i++
		}
		return fmt.Errorf("data of %v differs first at byte %d (got %#x, want %#x)", id, i, got[i], want[i])
	}
	if n, err := r.ReadAt(got[:1], int64(len(want))); n != 0 || err != io.EOF {
		return fmt.Errorf("ReadAt at length of %v = %d, %v; want 0, EOF", id, n, err)
	}
	if len(want) > 0 {
		// A read ending exactly at Length is a full read, no EOF.
		if n, err := r.ReadAt(got[:1], int64(len(want))-1); n != 1 || err != nil {
			return fmt.Errorf("ReadAt of last byte of %v = %d, %v", id, n, err)
		}
	}
	B := int(r.s.BlockSize())
	nb := (len(want) + B - 1) / B
	sums, err := r.Checksums(0, nb, nil)
	if err != nil {
		return fmt.Errorf("checksums of %v: %w", id, err)
	}
	for i := range nb {
		blk := want[i*B : min((i+1)*B, len(want))]
		if w := crc32.Checksum(blk, castagnoli); sums[i] != w {
			return fmt.Errorf("checksum of %v block %d = %#08x, want %#08x", id, i, sums[i], w)
		}
	}
	if _, err := r.Checksums(nb, 1, nil); !errors.Is(err, ErrRange) {
		return fmt.Errorf("checksums of %v past the end: err %v, want ErrRange", id, err)
	}
	return nil
}

// pageBounds returns [lo, hi) spanning every checksum page of id. hi is
// the chunk prefix followed by more 0xff bytes than any page number has,
// so it works for the largest chunk ID too.
func pageBounds(id ids.ChunkID) (lo, hi []byte) {
	lo = chunkKey(kindPage, id)
	hi = append(chunkKey(kindPage, id), 0xff, 0xff, 0xff, 0xff, 0xff)
	return lo, hi
}

package nfs3

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
)

// fakeFile is a filler over a byte slice. A read takes its snapshot of
// the data when called, then waits for gate (if set).
type fakeFile struct {
	mu    sync.Mutex
	data  []byte
	err   error
	gate  chan struct{}
	calls atomic.Int64
}

func (f *fakeFile) set(data []byte) {
	f.mu.Lock()
	f.data = data
	f.mu.Unlock()
}

func (f *fakeFile) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	f.calls.Add(1)
	f.mu.Lock()
	data, ferr, gate := f.data, f.err, f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if ferr != nil {
		return 0, ferr
	}
	if off >= int64(len(data)) {
		return 0, io.EOF
	}
	n := copy(p, data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// pattern is n bytes that differ with seed and position.
func pattern(seed byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7+i/4093)
	}
	return p
}

func verFor(data []byte, gen int64) blockVer {
	return blockVer{size: int64(len(data)), mtime: gen, ctime: gen}
}

// check verifies the cache's accounting: what the index and the LRU list
// hold agree, and the index and the free list stay within the bound.
func (c *blockCache) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var listed, unpinned int64
	n := 0
	for b := c.lru.next; b != &c.lru; b = b.next {
		n++
		listed += b.charge
		if b.refs == 0 {
			unpinned += b.charge
		}
		if !b.indexed || c.index[b.ino][b.idx] != b {
			t.Fatalf("block (%d,%d) listed but not indexed", b.ino, b.idx)
		}
	}
	indexed := 0
	for _, m := range c.index {
		indexed += len(m)
	}
	switch {
	case n != indexed:
		t.Fatalf("%d blocks listed, %d indexed", n, indexed)
	case listed != c.bytes:
		t.Fatalf("bytes %d, blocks listed hold %d", c.bytes, listed)
	case c.freeB != int64(len(c.free))*blockSize:
		t.Fatalf("freeB %d for %d buffers", c.freeB, len(c.free))
	case c.bytes+c.freeB > c.max:
		t.Fatalf("holds %d bytes indexed + %d free, over the bound %d", c.bytes, c.freeB, c.max)
	case unpinned > c.max:
		t.Fatalf("holds %d unpinned bytes, over the bound %d", unpinned, c.max)
	}
}

// waitFor waits until cond holds, failing the test after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

func mustGet(t *testing.T, c *blockCache, f filler, ino ids.Ino, idx int64, ver blockVer) *block {
	t.Helper()
	b, err := c.get(context.Background(), f, ino, idx, ver)
	if err != nil {
		t.Fatalf("get (%d,%d): %v", ino, idx, err)
	}
	return b
}

// TestCacheHitMiss: a second read of each block is a hit, the data is
// the file's, and the last block holds only the bytes to the end.
func TestCacheHitMiss(t *testing.T) {
	c := newBlockCache(16 << 20)
	data := pattern(1, 2*blockSize+blockSize/2+17)
	f := &fakeFile{data: data}
	ver := verFor(data, 1)
	for pass := range 2 {
		for idx := int64(0); idx < 3; idx++ {
			b := mustGet(t, c, f, 7, idx, ver)
			want := data[idx*blockSize : min(int64(len(data)), (idx+1)*blockSize)]
			if !bytes.Equal(b.data, want) {
				t.Fatalf("pass %d block %d: %d bytes, not the file's (%d)", pass, idx, len(b.data), len(want))
			}
			b.release()
		}
	}
	hits, misses, held := c.stats()
	if hits != 3 || misses != 3 || f.calls.Load() != 3 {
		t.Fatalf("hits %d misses %d fills %d, want 3 3 3", hits, misses, f.calls.Load())
	}
	if held != 3*blockSize {
		t.Fatalf("holds %d bytes, want %d", held, 3*blockSize)
	}
	c.check(t)
}

// TestCacheStale: a block filled under other attributes is filled again.
func TestCacheStale(t *testing.T) {
	c := newBlockCache(16 << 20)
	old := pattern(1, blockSize+5)
	f := &fakeFile{data: old}
	mustGet(t, c, f, 1, 0, verFor(old, 1)).release()
	neu := pattern(2, blockSize+5)
	f.set(neu)
	b := mustGet(t, c, f, 1, 0, verFor(neu, 2))
	if !bytes.Equal(b.data, neu[:blockSize]) {
		t.Fatal("a block of older attributes was served")
	}
	b.release()
	if _, misses, _ := c.stats(); misses != 2 {
		t.Fatalf("%d misses, want 2", misses)
	}
	c.check(t)
}

// TestCacheInvalidate: invalidate drops a file's blocks, and a fill in
// progress when it runs is not kept (it may have read the old data).
func TestCacheInvalidate(t *testing.T) {
	c := newBlockCache(16 << 20)
	old := pattern(1, 3*blockSize)
	ver := verFor(old, 1) // the same attributes throughout: only invalidate tells
	f := &fakeFile{data: old}
	mustGet(t, c, f, 1, 0, ver).release()
	neu := pattern(2, 3*blockSize)
	f.set(neu)
	c.invalidate(1)
	if b := mustGet(t, c, f, 1, 0, ver); !bytes.Equal(b.data, neu[:blockSize]) {
		t.Fatal("served a block dropped by invalidate")
	} else {
		b.release()
	}

	// A fill that reads the old data, then the write and its
	// invalidation, then the fill ends.
	f.set(old)
	gate := make(chan struct{})
	f.gate = gate
	done := make(chan *block)
	go func() {
		b, err := c.get(context.Background(), f, 1, 1, ver)
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	waitFor(t, func() bool { return f.calls.Load() == 3 })
	f.mu.Lock()
	f.data, f.gate = neu, nil
	f.mu.Unlock()
	c.invalidate(1)
	if _, _, held := c.stats(); held != 0 {
		t.Fatalf("holds %d bytes after invalidate", held)
	}
	close(gate)
	if b := <-done; b != nil {
		b.release() // its caller may have the old data: it began before the write
	}
	b := mustGet(t, c, f, 1, 1, ver)
	if !bytes.Equal(b.data, neu[blockSize:2*blockSize]) {
		t.Fatal("a fill in progress at invalidate was kept")
	}
	b.release()
	c.check(t)
}

// TestCacheOneFill: concurrent misses on one block wait for one fill.
func TestCacheOneFill(t *testing.T) {
	c := newBlockCache(16 << 20)
	data := pattern(3, blockSize)
	f := &fakeFile{data: data, gate: make(chan struct{})}
	const n = 16
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			b, err := c.get(context.Background(), f, 1, 0, verFor(data, 1))
			if err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(b.data, data) {
				t.Error("wrong data")
			}
			b.release()
		})
	}
	waitFor(t, func() bool { hits, misses, _ := c.stats(); return hits+misses == n })
	close(f.gate)
	wg.Wait()
	if got := f.calls.Load(); got != 1 {
		t.Fatalf("%d fills for %d concurrent reads of one block", got, n)
	}
	c.check(t)
}

// TestCacheFailedFill: the waiters of a failed fill get its error and
// nothing is kept; the next read fills again.
func TestCacheFailedFill(t *testing.T) {
	c := newBlockCache(16 << 20)
	data := pattern(4, blockSize)
	boom := errors.New("node down")
	f := &fakeFile{data: data, err: boom, gate: make(chan struct{})}
	const n = 8
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range n {
		wg.Go(func() {
			if _, err := c.get(context.Background(), f, 1, 0, verFor(data, 1)); errors.Is(err, boom) {
				failed.Add(1)
			}
		})
	}
	waitFor(t, func() bool { hits, misses, _ := c.stats(); return hits+misses == n })
	close(f.gate)
	wg.Wait()
	if failed.Load() != n || f.calls.Load() != 1 {
		t.Fatalf("%d of %d reads failed, %d fills", failed.Load(), n, f.calls.Load())
	}
	if _, _, held := c.stats(); held != 0 {
		t.Fatalf("a failed fill kept %d bytes", held)
	}
	c.check(t)
	f.mu.Lock()
	f.err, f.gate = nil, nil
	f.mu.Unlock()
	b := mustGet(t, c, f, 1, 0, verFor(data, 1))
	if !bytes.Equal(b.data, data) || f.calls.Load() != 2 {
		t.Fatal("no new fill after a failed one")
	}
	b.release()
	c.check(t)
}

// TestCacheFillerCancelled: a waiter whose filler's call is cancelled
// fills the block itself.
func TestCacheFillerCancelled(t *testing.T) {
	c := newBlockCache(16 << 20)
	data := pattern(5, blockSize)
	f := &fakeFile{data: data, gate: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	ferr := make(chan error)
	go func() {
		_, err := c.get(ctx, f, 1, 0, verFor(data, 1))
		ferr <- err
	}()
	waitFor(t, func() bool { return f.calls.Load() == 1 })
	werr := make(chan error)
	go func() {
		b, err := c.get(context.Background(), f, 1, 0, verFor(data, 1))
		if err == nil {
			if !bytes.Equal(b.data, data) {
				err = errors.New("wrong data")
			}
			b.release()
		}
		werr <- err
	}()
	waitFor(t, func() bool { hits, _, _ := c.stats(); return hits == 1 })
	cancel()
	if err := <-ferr; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled filler: %v", err)
	}
	close(f.gate)
	if err := <-werr; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if f.calls.Load() != 2 {
		t.Fatalf("%d fills, want 2", f.calls.Load())
	}
	c.check(t)
}

// TestCachePinned: a pinned block's memory is neither reused nor changed
// while the cache evicts and invalidates around it, with a bound of two
// blocks; it is freed (for reuse) with its last pin.
func TestCachePinned(t *testing.T) {
	c := newBlockCache(2 * blockSize)
	files := map[ids.Ino]*fakeFile{}
	gen := int64(0)
	fill := func(ino ids.Ino) *block { // ino's block 0, with new data
		gen++
		data := pattern(byte(gen), blockSize)
		f := files[ino]
		if f == nil {
			f = &fakeFile{}
			files[ino] = f
		}
		f.set(data)
		b := mustGet(t, c, f, ino, 0, verFor(data, gen))
		if !bytes.Equal(b.data, data) {
			t.Fatalf("inode %d: wrong data", ino)
		}
		return b
	}
	pinned := fill(1)
	want := bytes.Clone(pinned.data)
	pinned.ref(t, 2) // a second pin (two READs of it)
	// Pressure: other files fill through the cache, evicting; the pinned
	// block is invalidated, and its file filled again under new
	// attributes.
	var also []*block
	for i := range 20 {
		b := fill(ids.Ino(10 + i))
		if i%7 == 0 {
			also = append(also, b) // pinned a while too
		} else {
			b.release()
		}
		if i == 5 {
			c.invalidate(1)
		}
		if i == 9 {
			fill(1).release()
		}
		c.check(t)
	}
	if !bytes.Equal(pinned.data, want) {
		t.Fatal("a pinned block's memory was reused")
	}
	pinned.release()
	if !bytes.Equal(pinned.data, want) {
		t.Fatal("a block still pinned once was changed")
	}
	for _, b := range also {
		b.release()
	}
	pinned.release()
	if pinned.buf != nil || pinned.data != nil {
		t.Fatal("an evicted block was not freed with its last pin")
	}
	c.check(t)

	// Every block pinned: a new one evicts the oldest, which stays
	// intact outside the index until released.
	var bs [][]byte
	also = also[:0]
	for i := range 4 {
		b := fill(ids.Ino(100 + i))
		also = append(also, b)
		bs = append(bs, bytes.Clone(b.data))
		c.check(t)
	}
	for i, b := range also {
		if !bytes.Equal(b.data, bs[i]) {
			t.Fatalf("pinned block %d changed", i)
		}
		b.release()
	}
	c.check(t)
}

// ref adds pins to b (as further READs of it would) up to refs.
func (b *block) ref(t *testing.T, refs int) {
	t.Helper()
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	b.refs = refs
}

// TestCacheBound: under random reads, releases and invalidations of
// files of random sizes, the index and the free buffers never hold more
// than the bound.
func TestCacheBound(t *testing.T) {
	const bound = 3*blockSize + blockSize/2
	c := newBlockCache(bound)
	rng := rand.New(rand.NewPCG(1, 2))
	type file struct {
		f   *fakeFile
		ver blockVer
	}
	files := make([]file, 8)
	for i := range files {
		data := pattern(byte(i), rng.IntN(3*blockSize)+1)
		if i%3 == 0 {
			data = data[:rng.IntN(64<<10)+1] // small files
		}
		files[i] = file{&fakeFile{data: data}, verFor(data, 1)}
	}
	var held []*block
	for range 2000 {
		switch op := rng.IntN(10); {
		case op < 6:
			i := rng.IntN(len(files))
			fl := files[i]
			idx := rng.Int64N((fl.ver.size + blockSize - 1) / blockSize)
			b := mustGet(t, c, fl.f, ids.Ino(i+1), idx, fl.ver)
			if !bytes.Equal(b.data, fl.f.data[idx*blockSize:min(fl.ver.size, (idx+1)*blockSize)]) {
				t.Fatalf("file %d block %d: wrong data", i, idx)
			}
			held = append(held, b)
		case op < 9 && len(held) > 0:
			j := rng.IntN(len(held))
			held[j].release()
			held = append(held[:j], held[j+1:]...)
		case op == 9:
			c.invalidate(ids.Ino(rng.IntN(len(files)) + 1))
		}
		for len(held) > 4 { // as READs in flight: a few pins at a time
			held[0].release()
			held = held[1:]
		}
		c.check(t)
	}
	for _, b := range held {
		b.release()
	}
	c.check(t)
	if hits, misses, _ := c.stats(); hits == 0 || misses == 0 {
		t.Fatalf("hits %d misses %d: the test did not exercise both", hits, misses)
	}
}

// TestCacheTooSmall: a bound below a block caches nothing but serves.
func TestCacheTooSmall(t *testing.T) {
	c := newBlockCache(blockSize - 1)
	data := pattern(6, blockSize)
	f := &fakeFile{data: data}
	for range 2 {
		b := mustGet(t, c, f, 1, 0, verFor(data, 1))
		if !bytes.Equal(b.data, data) {
			t.Fatal("wrong data")
		}
		b.release()
	}
	if _, misses, held := c.stats(); misses != 2 || held != 0 {
		t.Fatalf("misses %d, %d bytes held", misses, held)
	}
	c.check(t)
}

// BenchmarkCacheHit is the cost of a READ's hit: get and release.
func BenchmarkCacheHit(b *testing.B) {
	c := newBlockCache(16 << 20)
	data := pattern(1, blockSize)
	f := &fakeFile{data: data}
	ver := verFor(data, 1)
	blk, err := c.get(context.Background(), f, 1, 0, ver)
	if err != nil {
		b.Fatal(err)
	}
	blk.release()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		blk, err := c.get(ctx, f, 1, 0, ver)
		if err != nil {
			b.Fatal(err)
		}
		blk.release()
	}
}

// handingOver is a filler that reads each block into a buffer of its own
// from the cache's spare ones and hands it over, as read-ahead does.
type handingOver struct {
	*fakeFile
	c *blockCache
}

func (h handingOver) ReadBlock(ctx context.Context, off int64, into []byte) ([]byte, error) {
	buf := h.c.spare(blockSize)
	n, err := h.ReadAtContext(ctx, buf[:len(into)], off)
	return buf[:n], err
}

// TestCacheReusesHandedOverBuffers: a cold sequential read of a file much
// larger than the cache, its blocks read ahead and handed over, goes
// round a bounded set of buffers instead of allocating one per block
// (each a megabyte the allocator zeroes). Before: one per block.
func TestCacheReusesHandedOverBuffers(t *testing.T) {
	const bound = 8 * blockSize
	c := newBlockCache(bound)
	data := pattern(3, 64*blockSize)
	src := handingOver{&fakeFile{data: data}, c}
	ver := verFor(data, 1)
	seen := map[*byte]bool{}
	for idx := int64(0); idx < 64; idx++ {
		b := mustGet(t, c, src, 1, idx, ver)
		if !bytes.Equal(b.data, data[idx*blockSize:(idx+1)*blockSize]) {
			t.Fatalf("block %d: wrong data", idx)
		}
		seen[&b.buf[0]] = true
		b.release()
		c.check(t)
	}
	if max := bound/blockSize + maxSwapped + 2; len(seen) > max {
		t.Fatalf("64 blocks read through %d distinct buffers, want at most %d", len(seen), max)
	}
}

package dafs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/sdk/dafs"
)

const blk = 4 << 10

func newCache(t testing.TB, fx *fixture, opts dafs.CacheOptions) (*dafs.Cache, *dafs.Session) {
	t.Helper()
	s := dafs.New(fx.cl, dafs.Options{})
	t.Cleanup(func() { s.Close() })
	c, err := dafs.NewCache(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// eventually polls cond (no sleeps as assertions: generous deadline).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func readCached(t *testing.T, c *dafs.Cache, f *sdk.File, off int64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	got, err := c.ReadAt(context.Background(), f, p, off)
	if err != nil && !(errors.Is(err, io.EOF) && got < n) {
		t.Fatalf("cached read [%d,+%d): %d bytes, %v", off, n, got, err)
	}
	return p[:got]
}

// TestCacheHitsAndMisses: a read's missing blocks are fetched in one
// Submit (one batched request per node), a read of cached blocks is
// served without I/O, and both are counted.
func TestCacheHitsAndMisses(t *testing.T) {
	fx := newFixture(t, 4*testChunk)
	c, s := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 1 << 20})
	// 8 blocks, not aligned: 9 blocks touched, all missing.
	off := int64(testChunk - 3*blk + 100)
	if got := readCached(t, c, fx.f, off, 8*blk); !bytes.Equal(got, fx.data[off:off+8*blk]) {
		t.Fatal("first read: wrong bytes")
	}
	st := c.Stats()
	if st.Misses != 9 || st.Hits != 0 || st.Fetched != 9 || st.Submits != 1 {
		t.Fatalf("after the first read: %+v", st)
	}
	if bst := s.Stats(); bst.Requests > 3 || bst.Reads < 9 {
		t.Fatalf("misses of one read not batched: %+v", bst)
	}
	// Inside what is cached: hits only, no I/O.
	if got := readCached(t, c, fx.f, off+blk, 5*blk); !bytes.Equal(got, fx.data[off+blk:off+6*blk]) {
		t.Fatal("second read: wrong bytes")
	}
	st = c.Stats()
	if st.Hits != 6 || st.Misses != 9 || st.Submits != 1 {
		t.Fatalf("after the second read: %+v", st)
	}
	// Straddling: two cached blocks, two new ones.
	off2 := off + 7*blk
	if got := readCached(t, c, fx.f, off2, 3*blk); !bytes.Equal(got, fx.data[off2:off2+3*blk]) {
		t.Fatal("third read: wrong bytes")
	}
	if st = c.Stats(); st.Hits != 8 || st.Misses != 11 || st.Submits != 2 {
		t.Fatalf("after the third read: %+v", st)
	}
	// The end of the file: short, with io.EOF.
	end := int64(len(fx.data))
	p := make([]byte, 2*blk)
	if n, err := c.ReadAt(context.Background(), fx.f, p, end-blk); n != blk || err != io.EOF || !bytes.Equal(p[:n], fx.data[end-blk:]) {
		t.Fatalf("read at the end: %d, %v", n, err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestCacheReadAhead: with read-ahead, a sequential reader's next blocks
// are fetched before it asks, and it later reads them from the cache
// (PrefetchHits); nothing is fetched twice. Without it, nothing is
// prefetched. WillNeed prefetches a range without waiting.
func TestCacheReadAhead(t *testing.T) {
	fx := newFixture(t, 2*testChunk)
	const nblocks = 64
	for _, ra := range []int{0, 4} {
		c, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 1 << 20, ReadAhead: ra})
		for i := range int64(nblocks) {
			if got := readCached(t, c, fx.f, i*blk, blk); !bytes.Equal(got, fx.data[i*blk:(i+1)*blk]) {
				t.Fatalf("read-ahead %d: block %d wrong", ra, i)
			}
		}
		eventually(t, "prefetches to land", func() bool { st := c.Stats(); return st.Fetched == uint64(st.Blocks) })
		st := c.Stats()
		t.Logf("read-ahead %d: %+v", ra, st)
		switch {
		case ra == 0 && (st.Prefetched != 0 || st.Misses != nblocks || st.Fetched != nblocks):
			t.Fatalf("no read-ahead: %+v", st)
		case ra > 0 && (st.PrefetchHits < nblocks-1 || st.Prefetched < nblocks-1 || st.Fetched > nblocks+uint64(ra)):
			t.Fatalf("read-ahead %d: %+v", ra, st)
		case ra > 0 && st.Hits+st.Misses != nblocks:
			t.Fatalf("read-ahead %d: %d reads counted: %+v", ra, st.Hits+st.Misses, st)
		}
		c.Close(context.Background())
	}

	// WillNeed: the range is fetched asynchronously; then reads hit.
	c, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 1 << 20})
	const from = testChunk / 2
	if err := c.WillNeed(fx.f, from, 32*blk); err != nil {
		t.Fatal(err)
	}
	eventually(t, "WillNeed's blocks", func() bool { return c.Stats().Fetched == 32 })
	if got := readCached(t, c, fx.f, from, 32*blk); !bytes.Equal(got, fx.data[from:from+32*blk]) {
		t.Fatal("read after WillNeed: wrong bytes")
	}
	if st := c.Stats(); st.Hits != 32 || st.Misses != 0 || st.PrefetchHits != 32 || st.Prefetched != 32 || st.Submits != 1 {
		t.Fatalf("after WillNeed: %+v", st)
	}
}

// otherClient is a plain SDK client of the same cluster, without the
// cache.
func otherClient(t *testing.T, fx *fixture) *sdk.Client {
	t.Helper()
	conf, err := fx.c.Conf()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// readPlain reads path whole through cl.
func readPlain(t *testing.T, cl *sdk.Client, path string) []byte {
	t.Helper()
	ctx := context.Background()
	f, err := cl.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, f.Size())
	if n, err := f.ReadAtContext(ctx, p, 0); err != nil || n != len(p) {
		t.Fatalf("plain read of %s: %d of %d bytes, %v", path, n, len(p), err)
	}
	return p
}

// TestCacheWriteBehind: small writes land in the cache, are read back
// from it at once, go to the nodes in batches once WriteBehind bytes are
// dirty (before the dirty bound, without Flush; far fewer Submits than
// writes), and after Flush another client reads them.
func TestCacheWriteBehind(t *testing.T) {
	fx := newFixture(t, blk)
	ctx := context.Background()
	f, err := fx.cl.Create(ctx, "/wb", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 256 * blk, WriteBehind: 16 * blk, MaxDirty: 64 * blk})
	const writes, size = 300, 1000 // 300 KB in 74 blocks, each block written several times
	want := make([]byte, writes*size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range writes {
		p := want[i*size : (i+1)*size]
		for j := range p {
			p[j] = byte(rng.Uint32())
		}
		if n, err := c.WriteAt(ctx, f, p, int64(i*size)); err != nil || n != size {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		if got := readCached(t, c, f, int64(i*size), size); !bytes.Equal(got, p) {
			t.Fatalf("write %d not read back from the cache", i)
		}
		if i == 100 { // 24 blocks dirtied: past WriteBehind, short of MaxDirty
			eventually(t, "write-behind without Flush", func() bool { return c.Stats().Flushed >= 16 })
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("%+v", st)
	if st.Writes != writes || st.Submits >= writes/10 || st.Flushed < 74 || st.DirtyBytes != 0 || st.MaxDirtyBytes > 64*blk {
		t.Fatalf("write-behind: %+v", st)
	}
	if got := readPlain(t, otherClient(t, fx), "/wb"); !bytes.Equal(got, want) {
		t.Fatalf("another client reads %d bytes, not the %d written", len(got), len(want))
	}
}

// TestCacheWriteBehindFailure: when the file is removed under dirty
// blocks, the write-behind fails; Flush reports it, the blocks stay
// dirty (a second Flush reports them again, not lost), a writer at the
// dirty bound gets ErrDirtyFull rather than blocking, and Discard is
// the explicit way out. A failure of write-behind in the background
// is returned by the next Flush.
func TestCacheWriteBehindFailure(t *testing.T) {
	fx := newFixture(t, blk)
	ctx := context.Background()
	f, err := fx.cl.Create(ctx, "/doomed", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 64 * blk, WriteBehind: 32 * blk, MaxDirty: 8 * blk})
	p := bytes.Repeat([]byte("x"), 4*blk)
	if _, err := c.WriteAt(ctx, f, p, 0); err != nil {
		t.Fatal(err)
	}
	if err := fx.cl.Remove(ctx, "/doomed"); err != nil {
		t.Fatal(err)
	}
	err = c.Flush(ctx)
	t.Logf("flush after remove: %v", err)
	if err == nil {
		t.Fatal("Flush of blocks of a removed file succeeded")
	}
	if st := c.Stats(); st.DirtyBytes != 4*blk || st.FlushErrors < 4 {
		t.Fatalf("after the failed flush: %+v", st)
	}
	if err := c.Flush(ctx); err == nil {
		t.Fatal("the second Flush lost the failure")
	}
	// 4 dirty blocks failing, room for 4 more; the 5th cannot wait.
	n, err := c.WriteAt(ctx, f, bytes.Repeat([]byte("y"), 5*blk), 4*blk)
	if !errors.Is(err, dafs.ErrDirtyFull) || n != 4*blk {
		t.Fatalf("writing past the dirty bound with write-behind failing: %d, %v", n, err)
	}
	if err := c.Discard(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("flush after Discard: %v", err)
	}
	if st := c.Stats(); st.DirtyBytes != 0 || st.Blocks != 0 {
		t.Fatalf("after Discard: %+v", st)
	}

	// The failure in background write-behind (no Flush running) is kept
	// for the next Flush.
	f2, err := fx.cl.Create(ctx, "/doomed2", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 64 * blk, WriteBehind: 3 * blk})
	if _, err := c2.WriteAt(ctx, f2, p[:blk], 0); err != nil {
		t.Fatal(err)
	}
	if err := fx.cl.Remove(ctx, "/doomed2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.WriteAt(ctx, f2, p[:2*blk], blk); err != nil { // 3 dirty blocks: write-behind starts
		t.Fatal(err)
	}
	eventually(t, "the background write-behind to fail", func() bool { return c2.Stats().FlushErrors == 3 })
	if st := c2.Stats(); st.DirtyBytes != 3*blk {
		t.Fatalf("after the background failure: %+v", st)
	}
	if err := c2.Flush(ctx); err == nil || !strings.Contains(err.Error(), "ENOENT") {
		t.Fatalf("Flush after a failed write-behind: %v", err)
	}
}

// TestCacheDontNeed: DontNeed drops a range's clean blocks at once (the
// next read misses), and writes dirty ones back before dropping them.
func TestCacheDontNeed(t *testing.T) {
	fx := newFixture(t, 2*testChunk)
	ctx := context.Background()
	c, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: 1 << 20})
	readCached(t, c, fx.f, 0, 8*blk)
	if err := c.DontNeed(fx.f, 2*blk, 4*blk); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Blocks != 4 || st.Dropped != 4 {
		t.Fatalf("after DontNeed: %+v", st)
	}
	if got := readCached(t, c, fx.f, 0, 8*blk); !bytes.Equal(got, fx.data[:8*blk]) {
		t.Fatal("read after DontNeed: wrong bytes")
	}
	if st := c.Stats(); st.Hits != 4 || st.Misses != 12 {
		t.Fatalf("read after DontNeed: %+v", st)
	}
	// Dirty: written back, then dropped; to the end of the file (n 0).
	p := bytes.Repeat([]byte("dirty"), 1000)
	if _, err := c.WriteAt(ctx, fx.f, p, 3*blk+7); err != nil {
		t.Fatal(err)
	}
	if err := c.DontNeed(fx.f, 0, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "dirty blocks written and dropped", func() bool { return c.Stats().Blocks == 0 })
	if st := c.Stats(); st.DirtyBytes != 0 || st.Flushed != 2 {
		t.Fatalf("after DontNeed of dirty blocks: %+v", st)
	}
	want := append([]byte(nil), fx.data...)
	copy(want[3*blk+7:], p)
	if got := readPlain(t, otherClient(t, fx), "/data"); !bytes.Equal(got, want) {
		t.Fatal("dirty blocks dropped without being written")
	}
}

// TestCacheMemoryBound: four goroutines read and write random ranges
// of their own parts of a file much larger than the cache; every read
// returns what that goroutine's model says, the cache never holds more
// blocks than its bound nor more dirty bytes than MaxDirty, blocks are
// evicted, and after Flush a plain client reads the model.
func TestCacheMemoryBound(t *testing.T) {
	const part = 64 * blk
	fx := newFixture(t, 4*part)
	ctx := context.Background()
	const slots, maxDirty = 16, 6 * blk
	c, _ := newCache(t, fx, dafs.CacheOptions{BlockSize: blk, Bytes: slots * blk, MaxDirty: maxDirty, WriteBehind: 4 * blk, ReadAhead: 2})
	model := append([]byte(nil), fx.data...)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 77))
			mine := model[g*part : (g+1)*part]
			for range 150 {
				off := rng.IntN(part - 1)
				n := 1 + rng.IntN(min(3*blk, part-off))
				if rng.IntN(3) == 0 {
					p := make([]byte, n)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					if _, err := c.WriteAt(ctx, fx.f, p, int64(g*part+off)); err != nil {
						errs <- err
						return
					}
					copy(mine[off:], p)
					continue
				}
				p := make([]byte, n)
				if _, err := c.ReadAt(ctx, fx.f, p, int64(g*part+off)); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(p, mine[off:off+n]) {
					errs <- errors.New("a read does not return the model's bytes")
					return
				}
				if st := c.Stats(); st.Blocks > slots || st.DirtyBytes > maxDirty {
					errs <- errors.New("bound exceeded")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	t.Logf("%+v", st)
	if st.MaxBlocks > slots || st.MaxDirtyBytes > maxDirty || st.Evicted == 0 || st.Flushed == 0 {
		t.Fatalf("bounds: %+v", st)
	}
	if got := readPlain(t, otherClient(t, fx), "/data"); !bytes.Equal(got, model) {
		t.Fatal("after Flush, another client does not read what was written")
	}
}

// TestCacheSmallQueue: a session whose queue is shallower than a
// read's misses or a flush's dirty blocks: the cache splits its Submits
// or waits for room, and every byte is right.
func TestCacheSmallQueue(t *testing.T) {
	fx := newFixture(t, testChunk)
	ctx := context.Background()
	s := dafs.New(fx.cl, dafs.Options{Depth: 3})
	defer s.Close()
	c, err := dafs.NewCache(s, dafs.CacheOptions{BlockSize: blk, Bytes: 64 * blk, MaxDirty: 32 * blk, WriteBehind: 32 * blk})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WillNeed(fx.f, 20*blk, 8*blk); err != nil {
		t.Fatal(err)
	}
	if got := readCached(t, c, fx.f, 0, 24*blk); !bytes.Equal(got, fx.data[:24*blk]) {
		t.Fatal("read of 24 blocks through a queue of 3: wrong bytes")
	}
	p := bytes.Repeat([]byte("q"), 10*blk)
	if _, err := c.WriteAt(ctx, fx.f, p, 30*blk); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), fx.data...)
	copy(want[30*blk:], p)
	if got := readPlain(t, otherClient(t, fx), "/data"); !bytes.Equal(got, want) {
		t.Fatal("writes flushed through a queue of 3: wrong bytes")
	}
	t.Logf("%+v", c.Stats())
}

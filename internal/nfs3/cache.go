package nfs3

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The read cache: file data in blocks of blockSize bytes, aligned to file
// offsets, keyed by inode and block index. READ serves a range within one
// block straight from the block's memory (no copy: over the fabric the
// client pulls it from there), so a block READ is using is pinned and is
// neither reused nor changed until the reply releases it.
//
// Validity: a block records the size, mtime and ctime it was filled
// under; READ compares them with the file's attributes (at most AttrTTL
// old), so another client's change shows within AttrTTL, as with NFS
// attribute caching. Changes through the gateway drop the file's blocks
// at once, fills in progress included (invalidate), so every block in
// the index was read after the gateway's last change to its file.
//
// Memory: the blocks in the index and the free buffers together stay
// within the bound. A block that leaves the index while pinned (evicted,
// stale or invalidated) is no longer counted and is freed when its last
// pin goes: that memory is bounded by the READs in flight (each pins at
// most one block; TCP replies copy the data and unpin at once, fabric
// replies hold theirs until the client has pulled it or a timeout).

// blockSize is the cache's unit of fill and eviction.
const blockSize = 1 << 20

// defaultCacheBytes bounds the cache when Options.CacheBytes is 0.
const defaultCacheBytes = 256 << 20

// minCharge is the least a block is charged, so a cache of tiny files
// holds a bounded number of blocks (their bookkeeping is not free).
const minCharge = 4 << 10

// blockVer is the file attributes a block was filled under.
type blockVer struct{ size, mtime, ctime int64 }

func verOf(a *metaapi.Attr) blockVer { return blockVer{a.Size, a.Mtime, a.Ctime} }

// filler reads a file's data (a *sdk.File).
type filler interface {
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
}

// blockReader is a filler that can hand over a block it read ahead
// (sdk.Buffered.ReadBlock): the cache keeps that memory instead of
// copying it.
type blockReader interface {
	ReadBlock(ctx context.Context, off int64, into []byte) ([]byte, error)
}

// block is one block of a file's data.
type block struct {
	c      *blockCache
	ino    ids.Ino
	idx    int64
	ver    blockVer
	charge int64  // bytes counted while indexed
	buf    []byte // the memory
	data   []byte // the valid bytes, set before ready closes
	err    error  // the fill's failure, set before ready closes

	ready chan struct{} // closed when filled (or failed)
	// Release unpins the block (for xdr.Writer.Hold; bound once, so a
	// READ allocates nothing for it).
	release func()

	// Guarded by c.mu.
	filled     bool
	indexed    bool // in c.index and the LRU list
	refs       int  // pins
	prev, next *block
}

// blockCache is the gateway's read cache.
type blockCache struct {
	mu    sync.Mutex
	max   int64 // bound on bytes + freeB
	index map[ids.Ino]map[int64]*block
	lru   block // sentinel: lru.next is the most recently used
	bytes int64 // charged to indexed blocks
	free  [][]byte
	freeB int64 // bytes in free
	// swapped holds buffers a read-ahead hand-over displaced (see spare).
	swapped [][]byte

	hits, misses int64
}

// maxSwapped bounds the buffers kept outside the bound for read-ahead:
// one read-ahead window's worth (sdk.BufferOptions.ReadAhead's default).
const maxSwapped = 16

func newBlockCache(bound int64) *blockCache {
	c := &blockCache{max: bound, index: map[ids.Ino]map[int64]*block{}}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// get returns block idx of file ino, as of ver, pinned: the caller must
// call its release exactly once. idx*blockSize must be below ver.size. A
// miss fills the block from src; concurrent gets of a block being filled
// wait for that fill. A failed fill is not kept, and its waiters get its
// error.
func (c *blockCache) get(ctx context.Context, src filler, ino ids.Ino, idx int64, ver blockVer) (*block, error) {
	for {
		c.mu.Lock()
		b := c.index[ino][idx]
		if b != nil && b.ver != ver {
			c.removeLocked(b) // stale
			b = nil
		}
		if b == nil {
			break // a miss, with c.mu held
		}
		b.refs++
		c.hits++
		c.touchLocked(b)
		if b.filled { // and so not failed: failed blocks leave the index
			c.mu.Unlock()
			return b, nil
		}
		c.mu.Unlock()
		select {
		case <-b.ready:
		case <-ctx.Done():
			b.release()
			return nil, ctx.Err()
		}
		if b.err == nil {
			return b, nil
		}
		err := b.err
		b.release()
		if !isCtxErr(err) || ctx.Err() != nil {
			return nil, err
		}
		// The filler's call was cancelled, not ours: fill again.
	}
	c.misses++
	want := min(ver.size-idx*blockSize, blockSize)
	small := want <= blockSize/4 // a file's short last block: a buffer of its own size
	b := &block{c: c, ino: ino, idx: idx, ver: ver, ready: make(chan struct{}), refs: 1, charge: blockSize}
	b.release = b.unpin
	if small {
		b.charge = max(want, minCharge)
	}
	if b.charge <= c.max {
		c.makeRoomLocked(b.charge, small)
		if !small {
			b.buf = c.popFreeLocked()
		}
		c.insertLocked(b)
	} // else too big to keep: served to this call only
	c.mu.Unlock()
	if b.buf == nil { // allocated out of the lock
		if small {
			b.buf = make([]byte, want)
		} else {
			b.buf = make([]byte, blockSize)
		}
	}

	var n int
	var err error
	if br, ok := src.(blockReader); ok && !small {
		var data []byte
		data, err = br.ReadBlock(ctx, idx*blockSize, b.buf[:want])
		n = len(data)
		switch {
		case n == 0 || &data[0] == &b.buf[0]: // read into b.buf
		case cap(data) == blockSize: // handed over: kept, b.buf spared
			c.mu.Lock()
			c.swapLocked(b.buf)
			c.mu.Unlock()
			b.buf = data[:blockSize]
		default:
			n = copy(b.buf, data)
		}
	} else {
		n, err = src.ReadAtContext(ctx, b.buf[:want], idx*blockSize)
	}
	if errors.Is(err, io.EOF) {
		err = nil // short: the file shrank since ver (kept out below)
	}
	c.mu.Lock()
	if err == nil {
		b.data = b.buf[:n]
	} else {
		b.err = err
	}
	if (err != nil || int64(n) != want) && b.indexed {
		c.removeLocked(b)
	}
	b.filled = true
	c.mu.Unlock()
	close(b.ready)
	if err != nil {
		b.release()
		return nil, err
	}
	return b, nil
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// unpin drops one pin; a block out of the index is freed with its last.
func (b *block) unpin() {
	c := b.c
	c.mu.Lock()
	b.refs--
	if b.refs < 0 {
		c.mu.Unlock()
		panic("nfs3: cache block released more often than pinned")
	}
	if b.refs == 0 && !b.indexed {
		c.recycleLocked(b)
	}
	c.mu.Unlock()
}

// invalidate drops every block of ino, fills in progress included (their
// waiters still get the data; later gets fill again).
func (c *blockCache) invalidate(ino ids.Ino) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.index[ino] {
		c.removeLocked(b)
	}
}

// stats returns the hits, the misses (fills) and the bytes charged to
// the blocks in the index.
func (c *blockCache) stats() (hits, misses, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.bytes
}

// insertLocked adds b to the index, most recently used.
func (c *blockCache) insertLocked(b *block) {
	m := c.index[b.ino]
	if m == nil {
		m = map[int64]*block{}
		c.index[b.ino] = m
	}
	m[b.idx] = b
	b.indexed = true
	c.bytes += b.charge
	b.prev, b.next = &c.lru, c.lru.next
	b.prev.next, b.next.prev = b, b
}

// touchLocked makes indexed b the most recently used.
func (c *blockCache) touchLocked(b *block) {
	if c.lru.next == b {
		return
	}
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = &c.lru, c.lru.next
	b.prev.next, b.next.prev = b, b
}

// removeLocked takes indexed b out of the index; unpinned, it is freed.
func (c *blockCache) removeLocked(b *block) {
	m := c.index[b.ino]
	delete(m, b.idx)
	if len(m) == 0 {
		delete(c.index, b.ino)
	}
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
	b.indexed = false
	c.bytes -= b.charge
	if b.refs == 0 {
		c.recycleLocked(b)
	}
}

// makeRoomLocked evicts until a block charged need fits: with its buffer
// from the free list (full) or apart from it (small).
func (c *blockCache) makeRoomLocked(need int64, small bool) {
	for {
		switch {
		case !small && len(c.free) > 0: // bytes+freeB stays as it is
			return
		case c.bytes+c.freeB+need <= c.max:
			return
		case small && len(c.free) > 0:
			c.popFreeLocked() // to the collector
		case !c.evictLocked():
			return
		}
	}
}

// evictLocked removes the least recently used unpinned block or, if
// every block is pinned, the least recently used (it then lives outside
// the index until unpinned). It reports whether there was one.
func (c *blockCache) evictLocked() bool {
	for b := c.lru.prev; b != &c.lru; b = b.prev {
		if b.refs == 0 {
			c.removeLocked(b)
			return true
		}
	}
	if b := c.lru.prev; b != &c.lru {
		c.removeLocked(b)
		return true
	}
	return false
}

// popFreeLocked takes a buffer from the free list, or returns nil.
func (c *blockCache) popFreeLocked() []byte {
	n := len(c.free)
	if n == 0 {
		return nil
	}
	buf := c.free[n-1]
	c.free[n-1] = nil
	c.free = c.free[:n-1]
	c.freeB -= blockSize
	return buf
}

// putFreeLocked keeps a full buffer no block uses for reuse, while the
// index and the free list stay within the bound.
func (c *blockCache) putFreeLocked(buf []byte) {
	if cap(buf) == blockSize && c.bytes+c.freeB+blockSize <= c.max {
		c.free = append(c.free, buf[:blockSize])
		c.freeB += blockSize
	}
}

// spare returns a buffer of n bytes for a block read ahead: one a
// hand-over displaced or a free one if n is a block's size and the cache
// has one, else a new one.
func (c *blockCache) spare(n int) []byte {
	if n == blockSize {
		c.mu.Lock()
		buf := c.popSwappedLocked()
		if buf == nil {
			buf = c.popFreeLocked()
		}
		c.mu.Unlock()
		if buf != nil {
			return buf
		}
	}
	return make([]byte, n)
}

// swapLocked keeps a buffer a block read ahead displaced when it became
// a cache block. A cold sequential read fills a full cache: each new
// block's buffer is an evicted one, which the hand-over then displaces,
// while the read-ahead needs a new buffer per block. Kept for the next
// read-ahead, the buffers go round instead of being zeroed anew by the
// allocator each (measured: a sixth of the gateway's CPU reading a cold
// file); the read-ahead would hold as much memory anyway.
func (c *blockCache) swapLocked(buf []byte) {
	if cap(buf) != blockSize {
		return
	}
	if c.bytes+c.freeB+blockSize <= c.max {
		c.putFreeLocked(buf)
		return
	}
	if len(c.swapped) < maxSwapped {
		c.swapped = append(c.swapped, buf[:blockSize])
	}
}

func (c *blockCache) popSwappedLocked() []byte {
	n := len(c.swapped)
	if n == 0 {
		return nil
	}
	buf := c.swapped[n-1]
	c.swapped[n-1] = nil
	c.swapped = c.swapped[:n-1]
	return buf
}

// recycleLocked frees unpinned b's memory, keeping a full buffer for
// reuse while the index and the free list stay within the bound.
func (c *blockCache) recycleLocked(b *block) {
	if cap(b.buf) == blockSize && c.bytes+c.freeB+blockSize <= c.max {
		c.free = append(c.free, b.buf[:blockSize])
		c.freeB += blockSize
	}
	b.buf, b.data = nil, nil
}

package dafs

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Cache is an optional block cache on top of a Session, with the
// application's policy (seed 004: the DAFS core caches nothing; caching
// is a layer the application chooses). It uses only Session's public
// API: its memory is one arena registered once with the session, cut in
// fixed-size blocks, so fetched blocks are placed by the nodes straight
// into the cache; the misses of one call (and the blocks it reads
// ahead) go in one Submit, hence in one batched request per node.
//
// Policy is explicit and the application's:
//   - read-ahead: on a sequential pattern (a read that starts in the
//     block where the file's previous read ended, or the next) the cache fetches the next ReadAhead
//     blocks (SetReadAhead per file) along with the read's misses;
//     WillNeed prefetches a range asynchronously;
//   - write-behind: writes land in the cache and are written to the
//     nodes in one Submit when the dirty bytes reach WriteBehind, or on
//     Flush/Sync. A block that fails to be written stays dirty and its
//     error is returned by the next Flush/Sync (which retries it): data
//     is never dropped silently, only by an explicit Discard. Dirty
//     bytes are bounded by MaxDirty: a writer that would exceed it
//     starts write-behind and blocks until enough blocks are clean (or
//     its context ends); if the blocks it waits for failed to be
//     written, it gets that error instead of blocking forever;
//   - eviction: least recently used clean block; DontNeed drops a range
//     (dirty blocks are written first, then dropped).
//
// Coherence: this is the application's private cache, as DAFS's is. It
// does not see other clients' writes: a block stays as it was read until
// evicted or dropped (DontNeed), and nothing invalidates it. What holds:
// the application's own writes through the cache are visible to its own
// reads through the cache at once; once Flush (or Sync of the file)
// returns nil they are durable on every replica and committed, so a
// client that opens the file afterwards reads them. Until then no other
// client sees them. Writes that bypass the cache (File.WriteAt, or
// ops submitted elsewhere) are not seen by blocks it already holds. A
// truncation is not seen either.
//
// Memory is bounded: Bytes of blocks in all, dirty ones included, plus
// a small record per file touched. The Session must be the cache's own:
// the cache reaps every completion on it. A Cache is safe for
// concurrent use.
type Cache struct {
	s     *Session
	buf   *Buffer
	bs    int
	opts  CacheOptions
	slots int

	mu          sync.Mutex
	cond        *sync.Cond // broadcast when a block changes state
	blocks      map[blockKey]*block
	lru         *list.List // of *block, most recent at the front
	free        []int      // free slots
	files       map[ids.Ino]*fileState
	dirty       int64 // bytes of dirty blocks (whole blocks)
	flushing    int64 // of which being written
	outstanding int   // ops submitted and not reaped
	reaping     bool
	reapErr     error // the session's queue failed under the cache
	closed      bool
	st          CacheStats
}

// CacheOptions size a cache and set its policy.
type CacheOptions struct {
	// BlockSize is the unit of caching, in bytes. Default 4 KiB.
	BlockSize int
	// Bytes bounds the blocks held, dirty ones included; it is rounded
	// down to whole blocks, at least 2. Default 4 MiB.
	Bytes int64
	// ReadAhead is how many blocks are fetched ahead of a sequential
	// read (0: none).
	ReadAhead int
	// WriteBehind is the dirty bytes at which the dirty blocks are
	// written in one batch. Default MaxDirty/2.
	WriteBehind int64
	// MaxDirty bounds the dirty bytes: at least a block, at most Bytes
	// less one block (a clean block is always left for reads). Default
	// Bytes/2.
	MaxDirty int64
}

// CacheStats are a cache's counters, in blocks unless said otherwise.
type CacheStats struct {
	// Hits are blocks a read found in the cache; Misses blocks it
	// fetched, or waited for while they were being fetched.
	Hits, Misses uint64
	// Fetched are blocks read from the nodes; Prefetched those of them
	// read ahead or on WillNeed, PrefetchHits the prefetched blocks a
	// read later used, PrefetchWasted those evicted or dropped unread.
	Fetched, Prefetched, PrefetchHits, PrefetchWasted uint64
	// Evicted are clean blocks evicted to make room, Dropped blocks
	// dropped by DontNeed or Discard.
	Evicted, Dropped uint64
	// Writes are Write calls, Flushed blocks written to the nodes,
	// FlushErrors failed block writes.
	Writes, Flushed, FlushErrors uint64
	// Submits are the cache's Session.Submit calls.
	Submits uint64
	// Blocks and DirtyBytes are held now; MaxBlocks and MaxDirtyBytes
	// the most ever held.
	Blocks, MaxBlocks         int
	DirtyBytes, MaxDirtyBytes int64
}

type blockKey struct {
	ino ids.Ino
	idx int64
}

// block is one cached block in a slot of the arena.
type block struct {
	key  blockKey
	f    *sdk.File // the handle last used on it, for its I/O
	slot int
	elem *list.Element

	valid    bool // the slot holds the block's bytes (zeros past the end of the file)
	fetching bool // a read into the slot is in flight
	flushing bool // a write from the slot is in flight
	pins     int  // readers waiting to copy from it
	dirty    bool
	lo, hi   int   // the dirty bytes, [lo, hi) of the block
	err      error // the last fetch's or write's error
	ahead    bool  // prefetched and not yet read
	drop     bool  // DontNeed arrived while it was busy or dirty
}

// fileState is what the cache knows of a file.
type fileState struct {
	size int64 // the end of this cache's writes
	next int64 // the block after the last read's (sequential detection)
	ra   int   // read-ahead in blocks, -1 for the default
}

// NewCache builds a cache over s, which it uses alone. It registers its
// arena with s once.
func NewCache(s *Session, opts CacheOptions) (*Cache, error) {
	if opts.BlockSize <= 0 {
		opts.BlockSize = 4 << 10
	}
	if opts.Bytes <= 0 {
		opts.Bytes = 4 << 20
	}
	bs := int64(opts.BlockSize)
	slots := opts.Bytes / bs
	if slots < 2 {
		return nil, fmt.Errorf("dafs cache: %d bytes hold fewer than 2 blocks of %d", opts.Bytes, bs)
	}
	opts.Bytes = slots * bs
	if opts.MaxDirty <= 0 {
		opts.MaxDirty = max(opts.Bytes/2/bs, 1) * bs
	}
	if opts.MaxDirty < bs || opts.MaxDirty > opts.Bytes-bs {
		return nil, fmt.Errorf("dafs cache: MaxDirty %d is not between a block (%d) and all but one of %d", opts.MaxDirty, bs, opts.Bytes)
	}
	if opts.WriteBehind <= 0 {
		opts.WriteBehind = max(opts.MaxDirty/2, bs)
	}
	if opts.ReadAhead < 0 {
		return nil, fmt.Errorf("dafs cache: read-ahead of %d blocks", opts.ReadAhead)
	}
	buf, err := s.Register(make([]byte, opts.Bytes))
	if err != nil {
		return nil, fmt.Errorf("dafs cache: registering its arena: %w", err)
	}
	c := &Cache{s: s, buf: buf, bs: opts.BlockSize, opts: opts, slots: int(slots),
		blocks: map[blockKey]*block{}, lru: list.New(), files: map[ids.Ino]*fileState{}}
	c.cond = sync.NewCond(&c.mu)
	for i := int(slots) - 1; i >= 0; i-- {
		c.free = append(c.free, i)
	}
	return c, nil
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.Blocks = len(c.blocks)
	st.DirtyBytes = c.dirty
	return st
}

// SetReadAhead sets f's read-ahead, in blocks (negative: the default).
func (c *Cache) SetReadAhead(f *sdk.File, blocks int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.file(f).ra = max(blocks, -1)
}

// file returns f's state (under c.mu).
func (c *Cache) file(f *sdk.File) *fileState {
	ino := f.Attr().Ino
	fs := c.files[ino]
	if fs == nil {
		fs = &fileState{ra: -1}
		c.files[ino] = fs
	}
	return fs
}

// size is f's size as this cache knows it (under c.mu).
func (c *Cache) size(f *sdk.File, fs *fileState) int64 { return max(f.Size(), fs.size) }

// mem is b's slot.
func (c *Cache) mem(b *block) []byte { return c.buf.mem[b.slot*c.bs : (b.slot+1)*c.bs] }

// ReadAt reads len(p) bytes of f at off through the cache, as
// File.ReadAt does (short with io.EOF only at the end of the file).
func (c *Cache) ReadAt(ctx context.Context, f *sdk.File, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("dafs cache: reading at negative offset %d", off)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	fs := c.file(f)
	size := c.size(f, fs)
	if off >= size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := min(int64(len(p)), size-off)
	end := off + n
	bs := int64(c.bs)
	// Sequential: the read starts in the last read's last block or the
	// next one.
	seq := off/bs == fs.next || off/bs == fs.next-1
	fs.next = (end-1)/bs + 1
	var ahead []int64
	if ra := c.readAhead(fs); seq && ra > 0 {
		for i := end/bs + min(end%bs, 1); i <= (end-1)/bs+int64(ra) && i*bs < size; i++ {
			ahead = append(ahead, i)
		}
	}
	idx, last := off/bs, (end-1)/bs
	for idx <= last {
		// A window: serve hits, start the misses (and, last, the
		// read-ahead) in one Submit, wait, copy. A window ends early
		// when no slot is free; the blocks it pinned are released
		// before the next window waits for one, so readers never hold
		// slots while waiting for slots.
		var ops []*Op
		var wait []*block
		for ; idx <= last; idx++ {
			k := blockKey{f.Attr().Ino, idx}
			b := c.blocks[k]
			if b != nil && b.valid && !b.fetching {
				c.st.Hits++
				c.used(b)
				c.copyOut(b, p, off, end)
				continue
			}
			if b == nil {
				slot, ok := c.alloc()
				if !ok {
					break
				}
				b = c.add(k, f, slot)
			}
			c.st.Misses++
			if b.ahead {
				c.st.PrefetchHits++
				b.ahead = false
			}
			if !b.fetching {
				b.fetching, b.err = true, nil
				ops = append(ops, c.readOp(b))
			}
			b.pins++
			wait = append(wait, b)
		}
		if idx > last {
			ops = append(ops, c.prefetch(f, ahead)...)
		}
		c.submit(ops)
		if len(wait) == 0 && idx <= last {
			if err := c.wait(ctx); err != nil {
				return 0, fmt.Errorf("dafs cache: waiting for a free block: %w", err)
			}
			continue
		}
		var err error
		for _, b := range wait {
			for b.fetching && err == nil {
				err = c.wait(ctx)
			}
			if err == nil && b.err != nil {
				err = b.err
			}
			if err == nil {
				c.copyOut(b, p, off, end)
			}
			c.unpin(b)
		}
		if err != nil {
			return 0, fmt.Errorf("dafs cache: reading inode %d at %d: %w", f.Attr().Ino, off, err)
		}
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// readAhead is fs's read-ahead in blocks (under c.mu).
func (c *Cache) readAhead(fs *fileState) int {
	if fs.ra >= 0 {
		return fs.ra
	}
	return c.opts.ReadAhead
}

// copyOut copies b's part of [off, end) into p (under c.mu).
func (c *Cache) copyOut(b *block, p []byte, off, end int64) {
	start := b.key.idx * int64(c.bs)
	lo, hi := max(start, off), min(start+int64(c.bs), end)
	copy(p[lo-off:hi-off], c.mem(b)[lo-start:hi-start])
}

// WillNeed fetches the blocks of [off, off+n) of f that are not cached,
// asynchronously, in one Submit, as far as free or evictable blocks
// allow; it does not wait.
func (c *Cache) WillNeed(f *sdk.File, off, n int64) error {
	if off < 0 || n < 0 {
		return fmt.Errorf("dafs cache: WillNeed [%d,+%d)", off, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	size := c.size(f, c.file(f))
	bs := int64(c.bs)
	var idx []int64
	for i := off / bs; i*bs < min(off+n, size); i++ {
		idx = append(idx, i)
	}
	c.submit(c.prefetch(f, idx))
	return nil
}

// prefetch makes read ops for the blocks idx of f not cached, while
// slots are free or evictable (under c.mu).
func (c *Cache) prefetch(f *sdk.File, idx []int64) []*Op {
	var ops []*Op
	for _, i := range idx {
		k := blockKey{f.Attr().Ino, i}
		if c.blocks[k] != nil {
			continue
		}
		slot, ok := c.alloc()
		if !ok {
			break
		}
		b := c.add(k, f, slot)
		b.fetching, b.ahead = true, true
		c.st.Prefetched++
		ops = append(ops, c.readOp(b))
	}
	return ops
}

// DontNeed drops f's blocks in [off, off+n) (n 0: to the end of the
// file): clean ones at once, dirty ones once written back, blocks being
// fetched when the fetch completes.
func (c *Cache) DontNeed(f *sdk.File, off, n int64) error {
	if off < 0 || n < 0 {
		return fmt.Errorf("dafs cache: DontNeed [%d,+%d)", off, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	in := c.inRange(f, off, n)
	var ops []*Op
	for _, b := range c.blocks {
		if !in(b) {
			continue
		}
		b.drop = true
		if b.dirty && !b.flushing && !b.fetching {
			ops = append(ops, c.writeOp(b))
		}
		c.maybeDrop(b)
	}
	c.submit(ops)
	return nil
}

// inRange reports whether a block is f's and meets [off, off+n) (n 0:
// to the end).
func (c *Cache) inRange(f *sdk.File, off, n int64) func(*block) bool {
	ino, bs := f.Attr().Ino, int64(c.bs)
	return func(b *block) bool {
		start := b.key.idx * bs
		return b.key.ino == ino && start+bs > off && (n == 0 || start < off+n)
	}
}

// maybeDrop removes b if DontNeed asked for it and nothing holds it
// (under c.mu).
func (c *Cache) maybeDrop(b *block) {
	if b.drop && !b.dirty && !b.fetching && !b.flushing && b.pins == 0 {
		c.st.Dropped++
		c.remove(b)
	}
}

// alloc returns a free slot, evicting the least recently used clean
// block that nothing holds if none is free (under c.mu).
func (c *Cache) alloc() (int, bool) {
	if n := len(c.free); n > 0 {
		slot := c.free[n-1]
		c.free = c.free[:n-1]
		return slot, true
	}
	for e := c.lru.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*block)
		if !b.dirty && !b.fetching && !b.flushing && b.pins == 0 {
			c.st.Evicted++
			slot := b.slot
			c.remove(b)
			c.free = c.free[:len(c.free)-1] // remove freed it: take it back
			return slot, true
		}
	}
	return 0, false
}

// add caches an empty block k in slot (under c.mu).
func (c *Cache) add(k blockKey, f *sdk.File, slot int) *block {
	b := &block{key: k, f: f, slot: slot}
	b.elem = c.lru.PushFront(b)
	c.blocks[k] = b
	c.st.MaxBlocks = max(c.st.MaxBlocks, len(c.blocks))
	return b
}

// remove forgets b and frees its slot (under c.mu).
func (c *Cache) remove(b *block) {
	if b.ahead {
		c.st.PrefetchWasted++
	}
	if b.dirty {
		c.dirty -= int64(c.bs)
	}
	c.lru.Remove(b.elem)
	delete(c.blocks, b.key)
	c.free = append(c.free, b.slot)
	c.cond.Broadcast()
}

// used marks b most recently used (under c.mu).
func (c *Cache) used(b *block) {
	c.lru.MoveToFront(b.elem)
	if b.ahead {
		c.st.PrefetchHits++
		b.ahead = false
	}
}

// unpin releases a reader's hold on b; a block whose fetch failed goes
// once no reader holds it (under c.mu).
func (c *Cache) unpin(b *block) {
	b.pins--
	if b.pins == 0 && !b.valid && !b.fetching {
		c.remove(b)
		return
	}
	c.maybeDrop(b)
	c.cond.Broadcast()
}

// wait waits for a change of any block's state or for ctx to end
// (under c.mu).
func (c *Cache) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.reapErr != nil {
		return c.reapErr
	}
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	c.cond.Wait()
	stop()
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.reapErr
}

// errReaped says the cache's ops were reaped by someone else.
var errReaped = errors.New("dafs cache: the session's completions were reaped outside the cache (the session must be the cache's own)")

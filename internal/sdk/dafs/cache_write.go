package dafs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/sluicefs/sluice/internal/sdk"
)

// ErrDirtyFull is a writer's error when the dirty bytes are at MaxDirty
// and the blocks it would wait for failed to be written back.
var ErrDirtyFull = errors.New("dafs cache: dirty bytes at their bound and write-behind failing")

// WriteAt writes p at off of f into the cache (write-behind): it returns
// once the bytes are in the cache, visible to this cache's reads. They
// reach the nodes in a batch when the dirty bytes not yet being written
// reach WriteBehind, or on Flush or Sync. A write to part of a block that holds data of the
// file and is not cached reads the block first. A writer that would take
// the dirty bytes past MaxDirty blocks until write-behind makes room;
// if the blocks in the way failed to be written it gets ErrDirtyFull
// (with their error; Flush reports and retries them) and p is written
// only up to the returned count.
func (c *Cache) WriteAt(ctx context.Context, f *sdk.File, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("dafs cache: writing at negative offset %d", off)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	c.st.Writes++
	fs := c.file(f)
	bs := int64(c.bs)
	for done := 0; done < len(p); {
		pos := off + int64(done)
		k := blockKey{f.Attr().Ino, pos / bs}
		bo := int(pos % bs)
		n := min(c.bs-bo, len(p)-done)
		b := c.blocks[k]
		if b != nil && (b.fetching || b.flushing) {
			if err := c.wait(ctx); err != nil {
				return done, fmt.Errorf("dafs cache: writing at %d: %w", pos, err)
			}
			continue
		}
		if (b == nil || !b.dirty) && c.dirty+bs > c.opts.MaxDirty {
			if err := c.makeRoom(ctx); err != nil {
				return done, fmt.Errorf("dafs cache: writing at %d: %w", pos, err)
			}
			continue
		}
		if b == nil || !b.valid {
			if b == nil {
				slot, ok := c.alloc()
				if !ok {
					if err := c.wait(ctx); err != nil {
						return done, fmt.Errorf("dafs cache: writing at %d: waiting for a free block: %w", pos, err)
					}
					continue
				}
				b = c.add(k, f, slot)
			}
			start, size := k.idx*bs, c.size(f, fs)
			if (bo > 0 && start < size) || (bo+n < c.bs && pos+int64(n) < size) {
				// Bytes of the block around the write hold data: read it.
				b.fetching, b.err = true, nil
				b.pins++
				c.submit([]*Op{c.readOp(b)})
				var err error
				for b.fetching && err == nil {
					err = c.wait(ctx)
				}
				if err == nil {
					err = b.err
				}
				c.unpin(b)
				if err != nil {
					return done, fmt.Errorf("dafs cache: reading the block under a write at %d: %w", pos, err)
				}
				continue
			}
			clear(c.mem(b))
			b.valid = true
		}
		copy(c.mem(b)[bo:], p[done:done+n])
		b.f, b.ahead, b.drop = f, false, false
		if !b.dirty {
			b.dirty, b.lo, b.hi = true, bo, bo+n
			c.dirty += bs
			c.st.MaxDirtyBytes = max(c.st.MaxDirtyBytes, c.dirty)
		} else {
			b.lo, b.hi = min(b.lo, bo), max(b.hi, bo+n)
		}
		c.lru.MoveToFront(b.elem)
		fs.size = max(fs.size, pos+int64(n))
		done += n
	}
	if c.dirty-c.flushing >= c.opts.WriteBehind {
		c.writeBehind(nil)
	}
	return len(p), nil
}

// makeRoom starts write-behind and waits for a change; ErrDirtyFull if
// nothing is being written and dirty blocks failed (under c.mu).
func (c *Cache) makeRoom(ctx context.Context) error {
	c.writeBehind(func(b *block) bool { return b.err == nil })
	flushing := false
	var failed error
	for _, b := range c.blocks {
		flushing = flushing || b.flushing
		if b.dirty && b.err != nil && failed == nil {
			failed = b.err
		}
	}
	if !flushing && failed != nil {
		return fmt.Errorf("%w: %w", ErrDirtyFull, failed)
	}
	return c.wait(ctx)
}

// writeBehind writes the dirty blocks that are not busy and that want
// (nil: all) in one Submit, in file order (under c.mu).
func (c *Cache) writeBehind(want func(*block) bool) {
	var bs []*block
	for _, b := range c.blocks {
		if b.dirty && !b.flushing && !b.fetching && (want == nil || want(b)) {
			bs = append(bs, b)
		}
	}
	sortBlocks(bs)
	ops := make([]*Op, len(bs))
	for i, b := range bs {
		ops[i] = c.writeOp(b)
	}
	c.submit(ops)
}

// Flush writes every dirty block to the nodes in one Submit (retrying
// blocks that failed before) and waits for those writes and for any
// write-behind in flight. It returns nil once every block dirty when it
// was called is durable on the nodes and committed; else the errors of
// the blocks that are not (they stay dirty, and the next Flush retries
// them).
func (c *Cache) Flush(ctx context.Context) error {
	return c.flush(ctx, func(*block) bool { return true })
}

// Sync is Flush for f's blocks only.
func (c *Cache) Sync(ctx context.Context, f *sdk.File) error {
	return c.flush(ctx, c.inRange(f, 0, 0))
}

// sortBlocks sorts bs in file order.
func sortBlocks(bs []*block) {
	slices.SortFunc(bs, func(a, b *block) int {
		return cmp.Or(cmp.Compare(a.key.ino, b.key.ino), cmp.Compare(a.key.idx, b.key.idx))
	})
}

func (c *Cache) flush(ctx context.Context, want func(*block) bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var set []*block
	for _, b := range c.blocks {
		if b.dirty && want(b) {
			set = append(set, b)
		}
	}
	sortBlocks(set)
	c.writeBehind(want)
	var errs []error
	for _, b := range set {
		for b.flushing {
			if err := c.wait(ctx); err != nil {
				return fmt.Errorf("dafs cache: flushing: %w", err)
			}
		}
		if b.dirty && b.err != nil {
			errs = append(errs, b.err)
		}
	}
	return errors.Join(errs...)
}

// Discard drops every block of f, dirty ones included: their writes are
// lost. It is the way out for writes that cannot succeed (the file was
// removed). It waits for f's I/O in flight.
func (c *Cache) Discard(ctx context.Context, f *sdk.File) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := c.inRange(f, 0, 0)
	for {
		busy := false
		for _, b := range c.blocks {
			if !in(b) {
				continue
			}
			if b.fetching || b.flushing || b.pins > 0 {
				busy = true
				continue
			}
			c.st.Dropped++
			c.remove(b)
		}
		if !busy {
			delete(c.files, f.Attr().Ino)
			return nil
		}
		if err := c.wait(ctx); err != nil {
			return fmt.Errorf("dafs cache: discarding: %w", err)
		}
	}
}

// Close flushes, waits for the cache's I/O, and deregisters its arena;
// it returns Flush's error (the cache is closed even then). The session
// stays open.
func (c *Cache) Close(ctx context.Context) error {
	ferr := c.Flush(ctx)
	c.mu.Lock()
	c.closed = true
	for c.outstanding > 0 && c.reapErr == nil {
		if err := c.wait(ctx); err != nil {
			c.mu.Unlock()
			return errors.Join(ferr, fmt.Errorf("dafs cache: closing: %w", err))
		}
	}
	c.mu.Unlock()
	return errors.Join(ferr, c.s.Deregister(ctx, c.buf))
}

// readOp reads b into its slot.
func (c *Cache) readOp(b *block) *Op {
	op := ReadAsync(b.f, b.key.idx*int64(c.bs), c.buf, b.slot*c.bs, c.bs)
	op.Tag = b
	return op
}

// writeOp writes b's dirty bytes from its slot and marks it flushing
// (under c.mu).
func (c *Cache) writeOp(b *block) *Op {
	b.flushing = true
	c.flushing += int64(c.bs)
	op := WriteAsync(b.f, b.key.idx*int64(c.bs)+int64(b.lo), c.buf, b.slot*c.bs+b.lo, b.hi-b.lo)
	op.Tag = b
	return op
}

// submit submits ops (under c.mu); Submit does not block, so holding the
// lock orders it before the reaper's Wait. A full queue is waited out;
// ops the session refuses complete with its error.
func (c *Cache) submit(ops []*Op) {
	if len(ops) == 0 {
		return
	}
	for {
		err := c.s.Submit(context.Background(), ops...)
		switch {
		case err == nil:
			c.st.Submits++
			c.outstanding += len(ops)
			if !c.reaping {
				c.reaping = true
				go c.reap()
			}
			return
		case errors.Is(err, ErrQueueFull) && c.outstanding > 0 && c.reapErr == nil:
			c.cond.Wait()
			continue
		case errors.Is(err, ErrQueueFull) && len(ops) > 1:
			c.submit(ops[:len(ops)/2])
			c.submit(ops[len(ops)/2:])
			return
		}
		for _, op := range ops {
			c.complete(Completion{Op: op, Err: fmt.Errorf("dafs cache: submitting: %w", err)})
		}
		c.cond.Broadcast()
		return
	}
}

// reap collects the session's completions while the cache has ops
// outstanding.
func (c *Cache) reap() {
	for {
		cs, err := c.s.Wait(context.Background(), 1)
		c.mu.Lock()
		for _, cp := range cs {
			c.complete(cp)
		}
		c.outstanding -= len(cs)
		if err != nil && len(cs) == 0 {
			c.reapErr = fmt.Errorf("%w: %w", errReaped, err)
		}
		c.cond.Broadcast()
		if c.outstanding <= 0 || c.reapErr != nil {
			c.reaping = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// complete applies an op's outcome to its block (under c.mu).
func (c *Cache) complete(cp Completion) {
	b, ok := cp.Op.Tag.(*block)
	if !ok {
		return // not the cache's op
	}
	switch cp.Op.Kind {
	case Read:
		b.fetching = false
		if cp.Err == nil || errors.Is(cp.Err, io.EOF) {
			clear(c.mem(b)[cp.N:]) // past the end of the file
			b.valid, b.err = true, nil
			c.st.Fetched++
		} else {
			b.err = cp.Err
			if b.pins == 0 && !b.valid {
				c.remove(b)
				return
			}
		}
	case Write:
		b.flushing = false
		c.flushing -= int64(c.bs)
		if cp.Err == nil {
			b.dirty, b.err = false, nil
			c.dirty -= int64(c.bs)
			c.st.Flushed++
		} else {
			b.err = fmt.Errorf("dafs cache: writing back [%d,+%d) of inode %d: %w", cp.Op.Off, cp.Op.Len, b.f.Attr().Ino, cp.Err)
			c.st.FlushErrors++
		}
	}
	c.maybeDrop(b)
}

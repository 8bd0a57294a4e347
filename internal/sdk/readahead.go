package sdk

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"
)

// readAhead is a Buffered file's sequential read-ahead: blocks of the
// file fetched in the background ahead of a reader that reads on from
// where it stopped, each charged to the Budget until dropped.
type readAhead struct {
	mu     sync.Mutex
	next   int64 // where a sequential reader reads next
	streak int   // reads in a row that were sequential
	ver    fileVer
	blocks []*raBlock  // ascending, not overlapping
	idle   *time.Timer // drops the blocks of a reader that stopped
}

// raIdle is how long blocks read ahead wait for their reader: one that
// stopped (an NFS client never says it closed the file) gives back the
// memory.
const raIdle = 2 * time.Second

// fileVer is the file attributes blocks were fetched under: a change
// (another client's write, a truncation) makes them stale.
type fileVer struct{ size, mtime, ctime int64 }

// raBlock is one block read ahead.
type raBlock struct {
	off    int64
	want   int64
	done   chan struct{} // closed once data or err is set
	data   []byte
	err    error
	cancel context.CancelFunc

	// Guarded by readAhead.mu: whoever comes second of the drop and the
	// fetch's end gives the memory back. readers are the reads copying
	// from it; a block is handed over (ReadBlock) only with none.
	dropped, fetched bool
	readers          int
}

func (bl *raBlock) end() int64 { return bl.off + bl.want }

// ReadAtContext reads len(p) bytes at off, as File.ReadAtContext, after
// sending the buffered writes (a read sees every write made before it):
// from the blocks read ahead if they hold the range, else straight from
// the nodes. A read that continues the previous one reads ahead.
func (b *Buffered) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if b.Pending() {
		if err := b.Flush(ctx); err != nil {
			return 0, err
		}
	}
	if b.opts.ReadAhead <= 0 || off < 0 || len(p) == 0 {
		return b.f.ReadAtContext(ctx, p, off)
	}
	use, limit := b.ra.lookup(b, off, off+int64(len(p)))
	n, ok := b.ra.copy(ctx, use, p, off, limit)
	if !ok {
		return b.f.ReadAtContext(ctx, p, off)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ReadBlock is ReadAtContext for a caller that keeps what it reads (a
// cache): it reads len(into) bytes at off into into, or, when a block
// read ahead is exactly that range, returns that block's own memory
// (BufferOptions.ReadAheadBlock bytes, no copy), which is the caller's
// from then on. Short at the end of the file, with io.EOF.
func (b *Buffered) ReadBlock(ctx context.Context, off int64, into []byte) ([]byte, error) {
	if b.Pending() {
		if err := b.Flush(ctx); err != nil {
			return nil, err
		}
	}
	if b.opts.ReadAhead <= 0 || off < 0 || len(into) == 0 {
		n, err := b.f.ReadAtContext(ctx, into, off)
		return into[:n], err
	}
	use, limit := b.ra.lookup(b, off, off+int64(len(into)))
	if len(use) == 1 && use[0].off == off && use[0].want == int64(len(into)) {
		if data, ok := b.ra.take(ctx, use[0], b.opts.Budget); ok && len(data) > 0 {
			if len(data) < len(into) {
				return data, io.EOF
			}
			return data, nil
		}
	} else if n, ok := b.ra.copy(ctx, use, into, off, limit); ok {
		if n < len(into) {
			return into[:n], io.EOF
		}
		return into[:n], nil
	}
	n, err := b.f.ReadAtContext(ctx, into, off)
	return into[:n], err
}

// take waits for bl and hands its memory over, if no other read uses it
// (else it is released as a copy would).
func (ra *readAhead) take(ctx context.Context, bl *raBlock, bud *Budget) ([]byte, bool) {
	select {
	case <-bl.done:
	case <-ctx.Done():
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	bl.readers--
	if ctx.Err() != nil || bl.err != nil || bl.readers > 0 || bl.dropped {
		return nil, false
	}
	for i, x := range ra.blocks {
		if x == bl {
			ra.blocks = append(ra.blocks[:i], ra.blocks[i+1:]...)
			break
		}
	}
	ra.dropBlockLocked(bl, bud)
	return bl.data, true
}

// copy copies [off, limit) from the blocks use into p, and reports
// whether they held it all; it releases them.
func (ra *readAhead) copy(ctx context.Context, use []*raBlock, p []byte, off, limit int64) (int, bool) {
	if len(use) == 0 {
		return 0, false
	}
	defer func() {
		ra.mu.Lock()
		for _, bl := range use {
			bl.readers--
		}
		ra.mu.Unlock()
	}()
	n := int64(0)
	for _, bl := range use {
		select {
		case <-bl.done:
		case <-ctx.Done():
			return 0, false
		}
		if bl.err != nil {
			return 0, false // read again, straight: the error is this read's to report
		}
		lo, hi := off+n, min(limit, bl.off+int64(len(bl.data)))
		if lo < bl.off || hi < lo {
			return 0, false // short: the file shrank meanwhile
		}
		n += int64(copy(p[lo-off:], bl.data[lo-bl.off:hi-bl.off]))
	}
	if off+n < limit {
		return 0, false
	}
	return int(n), true
}

// lookup returns the blocks read ahead that hold [off, end) (within the
// file's size, limit), each counted as a reader, or none if they do not
// hold all of it; and reads further ahead if the reader is sequential.
func (ra *readAhead) lookup(b *Buffered, off, end int64) (use []*raBlock, limit int64) {
	a := b.f.Attr()
	ver := fileVer{a.Size, a.Mtime, a.Ctime}
	bud := b.opts.Budget
	limit = min(end, ver.size)

	ra.mu.Lock()
	if ver != ra.ver {
		ra.dropLocked(bud)
		ra.ver = ver
	}
	inWindow := false
	for _, bl := range ra.blocks {
		if bl.off <= off && off < bl.end() {
			inWindow = true
		}
	}
	if off == ra.next || inWindow {
		ra.streak++
	} else {
		// Not sequential: read no further ahead. What was read ahead is
		// kept if the read is near it (a kernel's reads arrive somewhat
		// out of order); a jump drops it.
		ra.streak = 0
		if n := len(ra.blocks); n > 0 && (off < ra.blocks[0].off-int64(b.opts.ReadAhead) || off >= ra.blocks[n-1].end()) {
			ra.dropLocked(bud)
		}
	}
	ra.next = end
	if ra.idle == nil {
		ra.idle = time.AfterFunc(raIdle, func() { ra.drop(bud) })
	} else {
		ra.idle.Reset(raIdle)
	}
	// Blocks wholly before the read are done with.
	keep := ra.blocks[:0]
	for _, bl := range ra.blocks {
		if bl.end() <= off {
			ra.dropBlockLocked(bl, bud)
		} else {
			keep = append(keep, bl)
		}
	}
	clear(ra.blocks[len(keep):])
	ra.blocks = keep
	pos := off
	for _, bl := range ra.blocks {
		if pos < limit && bl.off <= pos && pos < bl.end() {
			use = append(use, bl)
			pos = bl.end()
		}
	}
	if off >= limit || pos < limit {
		use = nil
	}
	for _, bl := range use {
		bl.readers++
	}
	if ra.streak > 0 && off < ver.size {
		ra.fillLocked(b, end, ver)
	}
	ra.mu.Unlock()
	return use, limit
}

// fillLocked starts fetching blocks from end (or the end of the blocks
// already there) up to ReadAhead bytes past end, within the file and the
// budget. Caller holds ra.mu.
func (ra *readAhead) fillLocked(b *Buffered, end int64, ver fileVer) {
	start := end
	if n := len(ra.blocks); n > 0 {
		start = max(start, ra.blocks[n-1].end())
	}
	unit := int64(b.opts.ReadAheadBlock)
	for start < end+int64(b.opts.ReadAhead) && start < ver.size {
		n := min(unit, ver.size-start)
		if !b.opts.Budget.take(n) {
			return
		}
		fctx, cancel := context.WithTimeout(context.Background(), b.opts.OpTimeout)
		bl := &raBlock{off: start, want: n, done: make(chan struct{}), cancel: cancel}
		ra.blocks = append(ra.blocks, bl)
		start += n
		go ra.fetch(fctx, b, bl)
	}
}

// fetch reads one block.
func (ra *readAhead) fetch(ctx context.Context, b *Buffered, bl *raBlock) {
	var data []byte
	if b.opts.Alloc != nil {
		data = b.opts.Alloc(int(bl.want))[:bl.want]
	} else {
		data = make([]byte, bl.want)
	}
	n, err := b.f.ReadAtContext(ctx, data, bl.off)
	if errors.Is(err, io.EOF) {
		err = nil // short: the file shrank (a later read finds it short)
	}
	bl.data, bl.err = data[:n], err
	close(bl.done)
	bl.cancel()
	ra.mu.Lock()
	bl.fetched = true
	if bl.dropped {
		b.opts.Budget.give(bl.want)
	}
	ra.mu.Unlock()
}

// drop discards every block (a write through this handle, a truncation).
func (ra *readAhead) drop(bud *Budget) {
	ra.mu.Lock()
	ra.dropLocked(bud)
	ra.streak = 0
	ra.mu.Unlock()
}

func (ra *readAhead) dropLocked(bud *Budget) {
	for _, bl := range ra.blocks {
		ra.dropBlockLocked(bl, bud)
	}
	clear(ra.blocks)
	ra.blocks = ra.blocks[:0]
}

// dropBlockLocked forgets bl: its fetch is cancelled, its memory given
// back now or when the fetch ends. Readers copying from it keep its data
// alive until they are done. Caller holds ra.mu.
func (ra *readAhead) dropBlockLocked(bl *raBlock, bud *Budget) {
	if bl.dropped {
		return
	}
	bl.dropped = true
	if bl.fetched {
		bud.give(bl.want)
	} else {
		bl.cancel()
	}
}

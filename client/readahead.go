package client

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
	// fetch's end gives the memory back.
	dropped, fetched bool
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
	if n, ok := b.ra.read(ctx, b, p, off); ok {
		if n < len(p) {
			return n, io.EOF
		}
		return n, nil
	}
	return b.f.ReadAtContext(ctx, p, off)
}

// read serves p at off from the blocks read ahead (ok) and reads further
// ahead if the reader is sequential.
func (ra *readAhead) read(ctx context.Context, b *Buffered, p []byte, off int64) (int, bool) {
	a := b.f.Attr()
	ver := fileVer{a.Size, a.Mtime, a.Ctime}
	bud := b.opts.Budget
	end := off + int64(len(p))
	limit := min(end, ver.size)

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
		ra.streak = 0
		ra.dropLocked(bud)
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
	var use []*raBlock
	pos := off
	for _, bl := range ra.blocks {
		if pos < limit && bl.off <= pos && pos < bl.end() {
			use = append(use, bl)
			pos = bl.end()
		}
	}
	covered := off < limit && pos >= limit
	if ra.streak > 0 && off < ver.size {
		ra.fillLocked(b, end, ver)
	}
	ra.mu.Unlock()
	if !covered {
		return 0, false
	}
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

// fillLocked starts fetching blocks from end (or the end of the blocks
// already there) up to ReadAhead bytes past end, within the file and the
// budget. Caller holds ra.mu.
func (ra *readAhead) fillLocked(b *Buffered, end int64, ver fileVer) {
	start := end
	if n := len(ra.blocks); n > 0 {
		start = max(start, ra.blocks[n-1].end())
	}
	unit := min(maxRABlock, max(int64(b.opts.ReadAhead)/4, 64<<10))
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
	data := make([]byte, bl.want)
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

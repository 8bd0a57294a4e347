package sdk

import (
	"context"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Buffered is the front ends' file layer: a File with write-behind and
// sequential read-ahead, for a front end (the FUSE mount, the NFS
// gateway) that turns many small requests into the SDK's large ones.
//
// Write-behind: a write that continues the previous one is copied into a
// buffer of BufferOptions.WriteBuffer bytes; a full buffer is sent (and
// recorded with meta) in the background while the next one fills. Only
// one send is in flight at a time: sends to one chunk must go in file
// order. Anything else (a write elsewhere in the file, no memory left in
// the Budget) first sends what is buffered and is then written through.
// A background send's failure is kept and returned by the next
// WriteAtContext, Flush or Close (and handed to OnLost at once): it is
// never dropped silently.
//
// Read-ahead: a read that starts where the previous one ended starts
// fetching the next ReadAhead bytes in blocks, several in flight; later
// sequential reads are served from them. Writes through this handle,
// Drop and a change of the file's attributes (another client's write,
// seen through SetAttr) discard what was read ahead.
//
// Memory: what a Buffered buffers or reads ahead is charged to its
// Budget, which many files share; past it, writes go through and reads
// are not read ahead, so many open files or hostile patterns cost no
// more than the Budget. It is safe for concurrent use.
type Buffered struct {
	f    *File
	opts BufferOptions

	mu      sync.Mutex
	buf     []byte // sequential writes not yet sent, at bufOff
	bufOff  int64
	charged int64 // budget held by buf
	pending *send // the send in flight
	err     error // a background send failed: reported by the next call
	seqEnd  int64 // end of the last write (-1: none)
	streak  int   // writes in a row that continued the previous one
	idle    *time.Timer

	// Every loss of writes that were buffered (a send that failed), for
	// the callers that must each hear of it (a mount's file descriptors:
	// b.err is reported once, to whichever call comes first).
	lostMu  sync.Mutex
	lostN   uint64
	lostErr error

	ra readAhead
}

// BufferOptions configure a Buffered file.
type BufferOptions struct {
	// WriteBuffer is how many bytes of sequential writes are gathered
	// into one streaming write (default 16 MiB; negative: none, every
	// write goes through).
	WriteBuffer int
	// Sequential is how many writes in a row must each start where the
	// previous one ended before writes are buffered (0: from the first).
	// The NFS gateway asks for 1: a lone write stays durable at once.
	Sequential int
	// ReadAhead is how many bytes a sequential reader is read ahead
	// (default 16 MiB; negative: none), in blocks of ReadAheadBlock
	// bytes (default a quarter of it, at most 4 MiB), fetched at once.
	ReadAhead      int
	ReadAheadBlock int
	// Alloc, if set, returns a buffer of at least n bytes for a block
	// read ahead (a cache's spare one; see ReadBlock). Default make.
	Alloc func(n int) []byte
	// IdleFlush sends buffered writes once no write came for this long
	// (0: they wait for the next write, Flush or Close).
	IdleFlush time.Duration
	// OpTimeout bounds a background send or fetch (default 1 minute).
	OpTimeout time.Duration
	// Budget bounds the memory of every Buffered sharing it (nil: one of
	// 4 write buffers plus one read-ahead for this file alone).
	Budget *Budget
	// OnLost, if set, is called when a send of buffered writes fails
	// (in the background, on the sender's goroutine, or by a Flush, a
	// read or a write that sends them): writes that were acknowledged
	// may be lost (the NFS gateway changes its write verifier).
	OnLost func(error)
}

// maxRABlock bounds one read-ahead block.
const maxRABlock = 4 << 20

func (o *BufferOptions) defaults() {
	if o.WriteBuffer == 0 {
		o.WriteBuffer = 16 << 20
	}
	if o.ReadAhead == 0 {
		o.ReadAhead = 16 << 20
	}
	if o.ReadAheadBlock <= 0 {
		o.ReadAheadBlock = min(maxRABlock, max(o.ReadAhead/4, 64<<10))
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = time.Minute
	}
	if o.Budget == nil {
		o.Budget = NewBudget(4*int64(max(o.WriteBuffer, 0)) + int64(max(o.ReadAhead, 0)))
	}
}

// NewBuffered returns the buffered layer over f. f stays usable, but
// writes made straight through it bypass the buffers (Flush first).
func NewBuffered(f *File, opts BufferOptions) *Buffered {
	opts.defaults()
	return &Buffered{f: f, opts: opts, seqEnd: -1}
}

// File is the file underneath.
func (b *Buffered) File() *File { return b.f }

// send is a full buffer on its way.
type send struct {
	done    chan struct{}
	buf     []byte
	off     int64
	end     int64
	charged int64
	err     error // set before done is closed
}

// WriteAtContext writes p at off: buffered (see Buffered), or through to
// every replica before it returns. An error may be an earlier background
// send's.
func (b *Buffered) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	n, _, err := b.WriteAtBuffered(ctx, p, off)
	return n, err
}

// WriteAtBuffered is WriteAtContext, and reports whether p was buffered
// (durable only after a Flush) rather than written through: what this
// write alone made of it, which Pending, asked afterwards, cannot tell
// (another caller's writes, or another caller taking a failure).
func (b *Buffered) WriteAtBuffered(ctx context.Context, p []byte, off int64) (int, bool, error) {
	if off < 0 {
		n, err := b.f.WriteAtContext(ctx, p, off) // refused there, with the reason
		return n, false, err
	}
	if off > metaapi.MaxFileSize-int64(len(p)) { // (off+len(p) may wrap)
		return 0, false, pathErr("write", b.f.path, metaapi.Errorf(metaapi.EFBIG, "write ends beyond the largest file size"))
	}
	b.ra.drop(b.opts.Budget)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.takeErrLocked(); err != nil {
		return 0, false, err
	}
	if off == b.seqEnd {
		b.streak++
	} else {
		b.streak = 0
	}
	b.seqEnd = off + int64(len(p))
	max := b.opts.WriteBuffer
	continues := len(b.buf) > 0 && off == b.bufOff+int64(len(b.buf))
	switch {
	case max < 0 || b.streak < b.opts.Sequential:
		// Not (yet) a sequential writer: through.
	case continues && len(b.buf)+len(p) <= max:
		if b.appendLocked(p) {
			b.armIdleLocked()
			return len(p), true, nil
		}
	case continues:
		b.sendLocked() // full: on its way while the next buffer fills
		if len(p) < max && b.opts.Budget.take(int64(max)) {
			// A whole buffer at once: this writer will fill it.
			b.buf, b.charged, b.bufOff = b.opts.Budget.buffer(max), int64(max), off
			b.buf = append(b.buf, p...)
			b.armIdleLocked()
			return len(p), true, nil
		}
	default:
		// Elsewhere in the file: what is buffered goes first.
		if err := b.flushLocked(ctx); err != nil {
			return 0, false, err
		}
		if len(p) < max && b.startLocked(p, off) {
			return len(p), true, nil
		}
	}
	// Through, after what is buffered (a write elsewhere goes after
	// those before it).
	if err := b.flushLocked(ctx); err != nil {
		return 0, false, err
	}
	n, err := b.f.WriteAtContext(ctx, p, off)
	return n, false, err
}

// startLocked starts a new buffer with p at off, if the budget allows.
// Caller holds b.mu; nothing is buffered.
func (b *Buffered) startLocked(p []byte, off int64) bool {
	if len(b.buf) > 0 {
		return false
	}
	b.buf = b.buf[:0]
	b.bufOff = off
	if !b.appendLocked(p) {
		return false
	}
	b.armIdleLocked()
	return true
}

// appendLocked adds p to the buffer, growing it within the budget; false:
// no memory for it (nothing changed). A buffer outgrowing 1 MiB is a
// large sequential writer's: it gets a whole write buffer at once rather
// than grow by doubling, which copies. Caller holds b.mu.
func (b *Buffered) appendLocked(p []byte) bool {
	need := len(b.buf) + len(p)
	if need > cap(b.buf) {
		size := max(2*cap(b.buf), need, 64<<10)
		if need > 1<<20 || size > b.opts.WriteBuffer {
			size = b.opts.WriteBuffer
		}
		if !b.opts.Budget.take(int64(size) - b.charged) {
			return false
		}
		var nb []byte
		if size == b.opts.WriteBuffer {
			nb = b.opts.Budget.buffer(size)
		} else {
			nb = make([]byte, 0, size)
		}
		nb = append(nb, b.buf...)
		b.keep(b.buf)
		b.buf, b.charged = nb, int64(size)
	}
	b.buf = append(b.buf, p...)
	return true
}

// releaseLocked gives the (empty) buffer's memory back. Caller holds b.mu.
func (b *Buffered) releaseLocked() {
	b.opts.Budget.give(b.charged)
	b.keep(b.buf)
	b.buf, b.charged = nil, 0
}

// keep offers buf, no longer used, to the Budget for reuse: only a whole
// write buffer, the one size asked of it again. Smaller ones (outgrown
// on the way to a whole one) took the Budget's few places for good, and
// then no whole buffer was kept.
func (b *Buffered) keep(buf []byte) {
	if cap(buf) == b.opts.WriteBuffer {
		b.opts.Budget.keep(buf)
	}
}

// armIdleLocked (re)starts the idle flush. Caller holds b.mu.
func (b *Buffered) armIdleLocked() {
	if b.opts.IdleFlush <= 0 {
		return
	}
	if b.idle == nil {
		b.idle = time.AfterFunc(b.opts.IdleFlush, b.idleFlush)
		return
	}
	b.idle.Reset(b.opts.IdleFlush)
}

// idleFlush sends what waited IdleFlush for a next write.
func (b *Buffered) idleFlush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) > 0 {
		b.sendLocked()
	}
}

// sendLocked sends the buffer in the background (after the previous
// send: writes to one chunk go in order). Caller holds b.mu.
func (b *Buffered) sendLocked() {
	b.waitLocked()
	s := &send{done: make(chan struct{}), buf: b.buf, off: b.bufOff, end: b.bufOff + int64(len(b.buf)), charged: b.charged}
	b.pending = s
	b.buf, b.charged = nil, 0
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.OpTimeout)
		defer cancel()
		_, s.err = b.f.WriteAtContext(ctx, s.buf, s.off)
		if s.err != nil {
			b.noteLost(s.err)
		}
		// The memory goes back now, not when the send is reaped: a file
		// no one writes to again holds none.
		b.opts.Budget.give(s.charged)
		b.keep(s.buf)
		s.buf = nil
		close(s.done)
	}()
}

// waitLocked waits for the send in flight, keeping its error for the
// next report. Caller holds b.mu.
func (b *Buffered) waitLocked() {
	s := b.pending
	if s == nil {
		return
	}
	<-s.done
	b.pending = nil
	if s.err != nil && b.err == nil {
		b.err = s.err
	}
}

// noteLost records a loss of buffered writes and calls OnLost.
func (b *Buffered) noteLost(err error) {
	b.lostMu.Lock()
	b.lostN++
	b.lostErr = err
	b.lostMu.Unlock()
	if b.opts.OnLost != nil {
		b.opts.OnLost(err)
	}
}

// Lost reports how many times buffered writes were lost so far, and the
// last failure: a caller that remembers the count sees each loss since,
// even one another caller was told of.
func (b *Buffered) Lost() (n uint64, last error) {
	b.lostMu.Lock()
	defer b.lostMu.Unlock()
	return b.lostN, b.lostErr
}

// takeErrLocked returns and forgets a background send's failure.
func (b *Buffered) takeErrLocked() error {
	err := b.err
	b.err = nil
	return err
}

// flushLocked sends what is buffered and waits: every write made so far
// is durable on every replica and recorded with meta when it returns nil.
// Caller holds b.mu.
func (b *Buffered) flushLocked(ctx context.Context) error {
	b.waitLocked()
	var err error
	if len(b.buf) > 0 {
		_, err = b.f.WriteAtContext(ctx, b.buf, b.bufOff)
		b.buf = b.buf[:0]
		if err != nil {
			// Writes answered as buffered are gone, whoever flushed
			// them (a reader, another writer): as a failed send.
			b.noteLost(err)
		}
	}
	b.releaseLocked()
	if e := b.takeErrLocked(); e != nil {
		err = e
	}
	return err
}

// Flush makes every write made so far durable (fsync, close, NFS
// COMMIT). It reports a failed background send not yet reported.
func (b *Buffered) Flush(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked(ctx)
}

// Close flushes and gives back the memory the file holds. The handle
// stays usable.
func (b *Buffered) Close(ctx context.Context) error {
	b.ra.drop(b.opts.Budget)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.idle != nil {
		b.idle.Stop()
	}
	return b.flushLocked(ctx)
}

// Drop discards the buffered writes (the file is being truncated to
// zero, O_TRUNC) and what was read ahead, after the send in flight
// (which must not land after the truncation; its failure stays to be
// reported).
func (b *Buffered) Drop() {
	b.ra.drop(b.opts.Budget)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waitLocked()
	b.buf = b.buf[:0]
	b.releaseLocked()
}

// Pending reports whether writes are buffered or in flight, or a failure
// awaits reporting: whether Flush has something to do.
func (b *Buffered) Pending() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.pending; s != nil {
		select {
		case <-s.done: // over: its failure, if any, is kept in b.err
			b.waitLocked()
		default:
		}
	}
	return len(b.buf) > 0 || b.pending != nil || b.err != nil
}

// Buffered reports the end of the writes not yet recorded with meta (-1:
// none), and how many of them are still in the buffer (those in flight
// excluded): a front end reports the size they make at once.
func (b *Buffered) Buffered() (end, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	end = -1
	if len(b.buf) > 0 {
		end = b.bufOff + int64(len(b.buf))
	}
	if s := b.pending; s != nil {
		end = max(end, s.end)
	}
	return end, int64(len(b.buf))
}

// Budget bounds the memory of the Buffered files sharing it, and keeps a
// few full write buffers of closed files for the next ones, within the
// bound too: what is charged plus what is kept never exceeds it.
type Budget struct {
	mu     sync.Mutex
	max    int64
	used   int64
	spare  [][]byte
	spareB int64 // bytes in spare
}

// maxSpare bounds the idle write buffers a Budget keeps.
const maxSpare = 4

// NewBudget returns a budget of max bytes.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

// take charges n bytes if they fit; n <= 0 always does.
func (g *Budget) take(n int64) bool {
	if n <= 0 {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.used+n > g.max {
		return false
	}
	// Spare buffers make room for a charge: they go to the collector.
	for len(g.spare) > 0 && g.used+n+g.spareB > g.max {
		last := len(g.spare) - 1
		g.spareB -= int64(cap(g.spare[last]))
		g.spare[last] = nil
		g.spare = g.spare[:last]
	}
	g.used += n
	return true
}

func (g *Budget) give(n int64) {
	g.mu.Lock()
	g.used -= n
	g.mu.Unlock()
}

// Used reports the bytes charged (tests, statistics).
func (g *Budget) Used() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used
}

// buffer returns an empty buffer of capacity size, a spare one if kept.
func (g *Budget) buffer(size int) []byte {
	g.mu.Lock()
	for i, s := range g.spare {
		if cap(s) == size {
			g.spare[i] = g.spare[len(g.spare)-1]
			g.spare[len(g.spare)-1] = nil
			g.spare = g.spare[:len(g.spare)-1]
			g.spareB -= int64(cap(s))
			g.mu.Unlock()
			return s[:0]
		}
	}
	g.mu.Unlock()
	return make([]byte, 0, size)
}

// keep keeps a large buffer no longer used, if few are kept.
func (g *Budget) keep(b []byte) {
	if cap(b) < 1<<20 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.spare) < maxSpare && g.used+g.spareB+int64(cap(b)) <= g.max {
		g.spare = append(g.spare, b[:0])
		g.spareB += int64(cap(b))
	}
}

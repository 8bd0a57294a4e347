package store

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// directMin is the smallest append region worth mapping: below it, the
// mapping's set-up and tear-down cost more than the copy they save
// (measured: 1 MiB writes are 2x faster with pwrite).
const directMin = 2 << 20

// directMap is a write's append region mapped into memory, so the fabric
// can receive packets straight into the chunk file's pages — direct
// placement, the software analogue of a NIC DMA-ing a packet into storage
// memory: no copy from a receive buffer into the store.
//
// The pages are allocated up front (see setupDirect), so running out of
// disk shows up as a fallback at BeginWrite, never as SIGBUS on a fault. The
// mapping is torn down only when nobody is placing into it: an Abort that
// races with a packet being received defers its cleanup (unmap, truncate,
// chunk unlock) to the receiver's DirectEnd.
type directMap struct {
	mu     sync.Mutex
	base   int64 // chunk offset of mem[0], page aligned
	from   int64 // first chunk offset handed out: the committed length
	mem    []byte
	users  int
	closed bool
	onIdle func() // deferred teardown, run by the last DirectEnd

	// [readyFrom, ready) are the chunk offsets whose pages are populated.
	// A background goroutine populates ahead of the packets; a packet that
	// outruns it is placed by copy instead, and the populator then jumps
	// ahead of the packets rather than populate pages already copied to
	// (mapping a page costs more than copying it on a VM). readyFrom
	// changes only under mu.
	ready        atomic.Int64
	readyFrom    int64
	head         atomic.Int64  // end of the last packet asked for
	populated    chan struct{} // closed when the populator stops
	stopPopulate atomic.Bool
}

// directStep is the background populator's unit of work.
const directStep = 2 << 20

var pageSize = int64(os.Getpagesize())

// setupDirect maps [max(off, old length), end) when it is large enough.
// Failure is not an error: the write falls back to pwrite.
//
// The file is extended (sparsely) and the pages are allocated and mapped
// in one call with MADV_POPULATE_WRITE. Unlike a page fault, populating
// reports a lack of space as an error instead of raising SIGBUS, so once
// it succeeds every later store into the mapping has its page.
func (w *Write) setupDirect() {
	start := max(w.off, w.old.Length)
	if w.end-start < directMin || w.f == nil {
		return
	}
	if w.fileSize < w.end { // a recycled file may be long enough already
		if err := w.f.Truncate(w.end); err != nil {
			w.s.log.Debug("store: direct placement off: extend", "chunk", w.id, "err", err)
			return
		}
		w.fileSize = w.end
	}
	w.appended = true // the file now extends past the committed length
	base := start &^ (pageSize - 1)
	mem, err := unix.Mmap(int(w.f.Fd()), base, int(w.end-base), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		w.s.log.Debug("store: direct placement off: mmap", "chunk", w.id, "err", err)
		return
	}
	// Nothing is populated before the write is admitted: the first packets
	// are copied while the populator gets ahead of them.
	d := &directMap{base: base, from: start, mem: mem, populated: make(chan struct{}), readyFrom: base}
	d.ready.Store(base)
	w.direct = d
	go d.populate(0)
}

// populate maps the region in steps, publishing progress. It stops early
// on failure — no space (populating reports that as an error, not SIGBUS)
// or an old kernel: later packets are then copied with pwrite, which
// reports a lack of space properly — or when the write ends.
func (d *directMap) populate(from int64) {
	defer close(d.populated)
	for pos := from; pos < int64(len(d.mem)) && !d.stopPopulate.Load(); {
		if h := d.head.Load() - d.base; h > pos {
			// Outrun: start again a step ahead of the packets.
			pos = min(int64(len(d.mem)), (h+directStep+pageSize-1)&^(pageSize-1))
			d.mu.Lock()
			d.readyFrom = d.base + pos
			d.ready.Store(d.base + pos)
			d.mu.Unlock()
			continue
		}
		end := min(int64(len(d.mem)), pos+directStep)
		if unix.Madvise(d.mem[pos:end], unix.MADV_POPULATE_WRITE) != nil {
			return
		}
		d.ready.Store(d.base + end)
		pos = end
	}
}

// DirectBegin returns the bytes of the chunk file where the packet for
// [off, off+n) belongs, for the caller to fill in place, or nil when that
// range cannot be placed directly (it overwrites committed data, no
// mapping, or the write is finished). A non-nil result must be followed
// by DirectEnd once the bytes are written; then Place(off, those bytes)
// records them without copying. Safe to call concurrently with the
// Write's other methods.
func (w *Write) DirectBegin(off int64, n int) []byte {
	d := w.direct
	if d == nil || n <= 0 {
		return nil
	}
	d.head.Store(off + int64(n))
	if off < d.from || off+int64(n) > d.ready.Load() {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || off < d.readyFrom {
		return nil
	}
	d.users++
	return d.mem[off-d.base : off-d.base+int64(n) : off-d.base+int64(n)]
}

// DirectEnd ends a DirectBegin.
func (w *Write) DirectEnd() {
	d := w.direct
	d.mu.Lock()
	d.users--
	var fn func()
	if d.closed && d.users == 0 {
		fn, d.onIdle = d.onIdle, nil
	}
	d.mu.Unlock()
	if fn != nil {
		// The deferred teardown does file I/O: not on the caller (the
		// fabric's reader goroutine, which must not block).
		go fn()
	}
}

// isDirect reports whether p is the mapped memory for offset off. It runs
// in Place, never concurrently with the mapping's teardown.
func (w *Write) isDirect(off int64, p []byte) bool {
	d := w.direct
	if d == nil || d.mem == nil || len(p) == 0 || off < d.from || off+int64(len(p)) > d.base+int64(len(d.mem)) {
		return false
	}
	return &p[0] == &d.mem[off-d.base]
}

// syncDirect writes mapped pages back (the msync POSIX asks for; fdatasync
// follows in syncData).
func (w *Write) syncDirect() error {
	if d := w.direct; d != nil && d.mem != nil {
		if err := unix.Msync(d.mem, unix.MS_SYNC); err != nil {
			return fmt.Errorf("msync mapped append region: %w", err)
		}
	}
	return nil
}

// closeDirect stops handing out the mapping and runs then once nobody is
// placing into it: now, or from the last DirectEnd. It may be called
// more than once (Sync, then Commit or Abort); then always runs.
func (w *Write) closeDirect(then func()) {
	d := w.direct
	if d == nil {
		then()
		return
	}
	d.mu.Lock()
	d.closed = true
	if d.users > 0 {
		prev := d.onIdle
		d.onIdle = func() {
			if prev != nil {
				prev()
			}
			w.unmapDirect()
			then()
		}
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	w.unmapDirect()
	then()
}

func (w *Write) unmapDirect() {
	d := w.direct
	d.stopPopulate.Store(true)
	<-d.populated
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mem == nil {
		return
	}
	if err := unix.Munmap(d.mem); err != nil {
		w.s.log.Warn("store: munmap append region", "chunk", w.id, "err", err)
	}
	d.mem = nil
}

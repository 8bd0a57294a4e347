package fusefs

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// openFile is a regular file open through this mount, shared by all its
// open handles: one write buffer per file, so that a read through any
// handle sees every write made through the others.
type openFile struct {
	fsys   *FS
	ino    ids.Ino
	opens  int  // handles, under fsys.mu
	pins   int  // removals of one of its names in progress, under fsys.mu
	orphan bool // its last name was removed while open, under fsys.mu

	mu     sync.Mutex
	f      *sdk.File
	buf    []byte // sequential writes not yet sent, at bufOff
	bufOff int64
	// One full buffer may be on its way while the next fills: the
	// program's copying overlaps the network.
	pending *pendingFlush
	spare   []byte // a sent buffer, for reuse
	err     error  // a background send failed: reported by the next call
}

// handle is one open(2) of a regular file.
type handle struct {
	of *openFile

	lockMu sync.Mutex
	owners map[uint64]uint8 // lock owners that used it: ownerPOSIX etc.
}

var (
	_ fs.FileReader   = (*handle)(nil)
	_ fs.FileWriter   = (*handle)(nil)
	_ fs.FileFlusher  = (*handle)(nil)
	_ fs.FileFsyncer  = (*handle)(nil)
	_ fs.FileReleaser = (*handle)(nil)
)

// file returns the open state of ino, if this mount has it open.
func (f *FS) file(ino ids.Ino) *openFile {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[ino]
}

// adjustSize reports a file's size including what this mount has
// buffered for it: the program that wrote it must see it at once.
func (f *FS) adjustSize(ino ids.Ino, out *fuse.Attr) {
	of := f.file(ino)
	if of == nil {
		return
	}
	of.mu.Lock()
	end := int64(-1)
	if len(of.buf) > 0 {
		end = of.bufOff + int64(len(of.buf))
	}
	if of.pending != nil {
		end = max(end, of.pending.end)
	}
	if end >= 0 && uint64(end) > out.Size {
		grow := uint64(end) - out.Size
		if len(of.buf) > 0 {
			grow = min(grow, uint64(len(of.buf))) // written past a hole: the hole takes nothing
		}
		out.Size = uint64(end)
		out.Blocks += (grow + 511) / 512
	}
	of.mu.Unlock()
}

// fileLocked returns the open state of ino, registering it if new.
// Caller holds f.mu.
func (f *FS) fileLocked(ino ids.Ino) *openFile {
	of := f.files[ino]
	if of == nil {
		of = &openFile{fsys: f, ino: ino}
		f.files[ino] = of
	}
	return of
}

// lockFlushed locks ino's open state, if this mount has the file open,
// after sending what is buffered for it: a truncation after a write must
// cut it, and times set after a write (tar, cp -p) must not be
// overwritten by that write's commit. unlock is never nil.
func (f *FS) lockFlushed(ctx context.Context, ino ids.Ino) (of *openFile, unlock func(), err error) {
	if of = f.file(ino); of == nil {
		return nil, func() {}, nil
	}
	of.mu.Lock()
	if err := of.flushLocked(ctx); err != nil {
		of.mu.Unlock()
		return nil, func() {}, err
	}
	return of, of.mu.Unlock, nil
}

// learn records attributes meta returned for a file this mount has open
// (of may be nil). Caller holds of.mu.
func (of *openFile) learn(a metaapi.Attr) {
	if of != nil && of.f != nil {
		of.f.SetAttr(a)
	}
}

// open opens regular file ino with the attributes known (from a create)
// or, if nil, read afresh from meta — after the file is registered as
// open, so that a rename or unlink racing with the open either fails it
// or keeps the file (see beginRemoval). It applies O_TRUNC.
func (f *FS) open(ctx context.Context, ino ids.Ino, name string, flags uint32, known *metaapi.Attr) (*handle, syscall.Errno) {
	f.mu.Lock()
	of := f.fileLocked(ino)
	of.opens++
	f.mu.Unlock()
	h := &handle{of: of}

	of.mu.Lock()
	errno := f.openLocked(ctx, of, name, flags, known)
	of.mu.Unlock()
	if errno != 0 {
		h.release() // takes of.mu itself if the file was removed meanwhile
		return nil, errno
	}
	return h, 0
}

// openLocked fills in of's file (or refreshes its attributes) and
// applies O_TRUNC. Caller holds of.mu.
func (f *FS) openLocked(ctx context.Context, of *openFile, name string, flags uint32, known *metaapi.Attr) syscall.Errno {
	var a metaapi.Attr
	if known != nil {
		a = *known
	} else {
		var err error
		if a, err = f.cl.GetAttr(ctx, of.ino); err != nil {
			return f.errno("open", err)
		}
		// Close-to-open: chunks another mount replaced since the last
		// open must not be read through cached layouts.
		f.cl.ForgetLayouts(of.ino)
	}
	if of.f == nil {
		cf, err := f.cl.OpenAttr(a, name)
		if err != nil {
			return f.errno("open", err)
		}
		of.f = cf
	} else if cur := of.f.Attr(); len(of.buf) == 0 || a.Size > cur.Size {
		of.f.SetAttr(a)
	}
	if flags&syscall.O_TRUNC != 0 && (of.f.Size() > 0 || len(of.buf) > 0 || of.pending != nil) {
		of.waitLocked() // a send in flight must not land after the truncation
		of.buf = of.buf[:0]
		zero := int64(0)
		na, err := f.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: of.ino, Size: &zero})
		if err != nil {
			return f.errno("open", err)
		}
		of.f.SetAttr(na)
	}
	return 0
}

// openAccess is the access open(2) flags ask of a file, as the kernel
// computes it: the access mode, plus write for O_TRUNC.
func openAccess(flags uint32) uint32 {
	var want uint32
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		want = metaapi.MayRead
	case syscall.O_WRONLY:
		want = metaapi.MayWrite
	default:
		want = metaapi.MayRead | metaapi.MayWrite
	}
	if flags&syscall.O_TRUNC != 0 {
		want |= metaapi.MayWrite
	}
	return want
}

// pendingFlush is a buffer being sent in the background.
type pendingFlush struct {
	done chan struct{}
	buf  []byte
	end  int64
	err  error // set before done is closed
}

// flushLocked sends the buffered writes: durable on every replica and
// recorded with meta when it returns. It reports a background send's
// failure not yet reported. Caller holds of.mu.
func (of *openFile) flushLocked(ctx context.Context) error {
	of.waitLocked()
	var err error
	if len(of.buf) > 0 {
		_, err = of.f.WriteAtContext(ctx, of.buf, of.bufOff)
		of.buf = of.buf[:0]
	}
	if of.err != nil {
		err, of.err = of.err, nil
	}
	return err
}

// waitLocked waits for the background send, keeping its error for the
// next report. Caller holds of.mu.
func (of *openFile) waitLocked() {
	p := of.pending
	if p == nil {
		return
	}
	<-p.done
	of.pending = nil
	of.spare = p.buf[:0]
	if p.err != nil && of.err == nil {
		of.err = p.err
	}
}

// sendLocked starts sending the full buffer in the background (after the
// previous one: writes to one chunk go in order) and starts a new one.
// Caller holds of.mu.
func (of *openFile) sendLocked() {
	of.waitLocked()
	p := &pendingFlush{done: make(chan struct{}), buf: of.buf, end: of.bufOff + int64(len(of.buf))}
	off := of.bufOff
	of.pending = p
	of.buf = of.spare
	of.spare = nil
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), of.fsys.opts.OpTimeout)
		defer cancel()
		_, p.err = of.f.WriteAtContext(ctx, p.buf, off)
		close(p.done)
	}()
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	of := h.of
	fsys := of.fsys
	kill := fsys.killsPrivs(ctx)
	ctx, cancel := fsys.call(ctx)
	defer cancel()
	of.mu.Lock()
	defer of.mu.Unlock()
	if off < 0 || off+int64(len(data)) > metaapi.MaxFileSize {
		return 0, syscall.EFBIG
	}
	if of.err != nil {
		err := of.err
		of.err = nil
		return 0, fsys.errno("write", err)
	}
	if kill {
		if errno := of.killPrivsLocked(ctx); errno != 0 {
			return 0, errno
		}
	}
	max := fsys.opts.WriteBuffer
	continues := len(of.buf) > 0 && off == of.bufOff+int64(len(of.buf))
	switch {
	case continues && len(of.buf)+len(data) <= max:
		of.appendLocked(data)
		return uint32(len(data)), 0
	case continues:
		of.sendLocked() // full: on its way while the next buffer fills
	default:
		// Elsewhere in the file: what is buffered goes first.
		if err := of.flushLocked(ctx); err != nil {
			return 0, fsys.errno("write", err)
		}
		if len(data) >= max {
			if _, err := of.f.WriteAtContext(ctx, data, off); err != nil {
				return 0, fsys.errno("write", err)
			}
			return uint32(len(data)), 0
		}
	}
	of.buf = of.buf[:0]
	of.appendLocked(data)
	of.bufOff = off
	return uint32(len(data)), 0
}

// appendLocked adds data to the buffer. A buffer outgrowing 1 MiB is a
// large sequential writer's: it gets a whole write buffer at once (a
// spare one if the mount has it) rather than grow by doubling, which
// copies and, for each new file, allocates anew. Caller holds of.mu.
func (of *openFile) appendLocked(data []byte) {
	if n := len(of.buf) + len(data); n > cap(of.buf) && n > 1<<20 && n <= of.fsys.opts.WriteBuffer {
		of.buf = append(of.fsys.writeBuf(), of.buf...)
	}
	of.buf = append(of.buf, data...)
}

// writeBuf returns an empty write buffer of full size.
func (f *FS) writeBuf() []byte {
	select {
	case b := <-f.spareBufs:
		return b[:0]
	default:
		return make([]byte, 0, f.opts.WriteBuffer)
	}
}

// keepBuf keeps a full-size write buffer of a closed file for the next
// (a few: idle memory stays bounded).
func (f *FS) keepBuf(b []byte) {
	if cap(b) != f.opts.WriteBuffer {
		return
	}
	select {
	case f.spareBufs <- b[:0]:
	default:
	}
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	of := h.of
	fsys := of.fsys
	ctx, cancel := fsys.call(ctx)
	defer cancel()
	of.mu.Lock()
	err := of.flushLocked(ctx)
	of.mu.Unlock()
	if err != nil {
		return nil, fsys.errno("read", err)
	}
	n, err := of.f.ReadAtContext(ctx, dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fsys.errno("read", err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// sync makes everything written through this mount durable.
func (h *handle) sync(ctx context.Context, op string) syscall.Errno {
	of := h.of
	ctx, cancel := of.fsys.call(ctx)
	defer cancel()
	of.mu.Lock()
	defer of.mu.Unlock()
	return of.fsys.errno(op, of.flushLocked(ctx))
}

// Flush is close(2) (once per file descriptor, dup'd ones included):
// close-to-open consistency needs the data out before it returns.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	errno := h.sync(ctx, "close")
	h.unlockOnClose(ctx)
	return errno
}

// Fsync: data sent is durable on every replica once the write returns,
// so syncing is sending.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.sync(ctx, "fsync")
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	if errno := h.sync(ctx, "release"); errno != 0 {
		// Nobody is left to tell: the program has closed the file.
		h.of.fsys.opts.Logger.Error("fuse: writes lost at release", "ino", h.of.ino, "errno", errno)
	}
	h.unlockAtRelease(ctx)
	h.release()
	return 0
}

func (h *handle) release() {
	f, of := h.of.fsys, h.of
	f.mu.Lock()
	of.opens--
	last := of.opens == 0
	orphan := last && of.orphan
	forgotten := !orphan && f.forgetLocked(of)
	f.mu.Unlock()
	if forgotten {
		f.recycle(of)
	}
	if !orphan {
		return
	}
	// Closed for good: meta may now delete it. It stays registered, and
	// locked, meanwhile: an open racing with this (the kernel resolved
	// the name before the removal) waits, then finds it gone, instead of
	// opening a file about to be deleted.
	of.mu.Lock()
	defer of.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.OpTimeout)
	defer cancel()
	if err := f.cl.Release(ctx, of.ino, false); err != nil {
		f.opts.Logger.Warn("fuse: releasing a removed file (meta frees it when its lease lapses)", "ino", of.ino, "err", err)
	}
	f.mu.Lock()
	f.forgetLocked(of)
	f.mu.Unlock()
}

// forgetLocked drops of from the open files once nothing uses it, and
// reports whether it did.
// Caller holds f.mu.
func (f *FS) forgetLocked(of *openFile) bool {
	if of.opens == 0 && of.pins == 0 && f.files[of.ino] == of {
		delete(f.files, of.ino)
		return true
	}
	return false
}

// recycle hands a forgotten file's write buffers to the mount: no open
// can reach it any more. (Its last Flush waited for every send.)
func (f *FS) recycle(of *openFile) {
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.pending == nil && len(of.buf) == 0 {
		f.keepBuf(of.buf)
		f.keepBuf(of.spare)
		of.buf, of.spare = nil, nil
	}
}

// removal is the removal (unlink, or rename over it) of one name of a
// file. While it is at meta, opens of the file wait: an open either
// counts when the removal starts — the file is then kept as an orphan —
// or begins after it and finds the file gone.
type removal struct {
	f    *FS
	of   *openFile // nil: the kernel knows no file by that name
	keep bool      // the file is open here
}

// beginRemoval pins the file name names in dir, if the kernel knows it.
func (f *FS) beginRemoval(dir *fs.Inode, name string) *removal {
	r := &removal{f: f}
	ch := dir.GetChild(name)
	if ch == nil || ch.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return r
	}
	f.mu.Lock()
	of := f.fileLocked(ids.Ino(ch.StableAttr().Ino))
	of.pins++
	f.mu.Unlock()
	of.mu.Lock()
	f.mu.Lock()
	r.of, r.keep = of, of.opens > 0
	f.mu.Unlock()
	return r
}

// end unpins the file; removed says the removal took place at meta.
func (r *removal) end(removed bool) {
	if r.of == nil {
		return
	}
	f := r.f
	f.mu.Lock()
	if removed && r.keep {
		// It may have lost its last name: release it at meta on the
		// last close, and renew its lease until then.
		r.of.orphan = true
	}
	r.of.pins--
	f.forgetLocked(r.of)
	f.mu.Unlock()
	r.of.mu.Unlock()
}

// orphanRenewal is how often kept files' leases are renewed; meta's lease
// (10 minutes by default) must be several times longer.
const orphanRenewal = time.Minute

// renewOrphans keeps the files this mount holds open after their removal
// alive at meta until the mount ends.
func (f *FS) renewOrphans() {
	t := time.NewTicker(orphanRenewal)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		f.mu.Lock()
		var inos []ids.Ino
		for ino, of := range f.files {
			if of.orphan {
				inos = append(inos, ino)
			}
		}
		f.mu.Unlock()
		for _, ino := range inos {
			ctx, cancel := context.WithTimeout(context.Background(), orphanRenewal)
			if err := f.cl.Release(ctx, ino, true); err != nil {
				f.opts.Logger.Warn("fuse: renewing a removed, open file's lease", "ino", ino, "err", err)
			}
			cancel()
		}
	}
}

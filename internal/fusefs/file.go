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

	mu sync.Mutex
	f  *sdk.File
	// b is f's write-behind (set with f): one full
	// buffer may be on its way while the next fills, so the program's
	// copying overlaps the network.
	b *sdk.Buffered
}

// handle is one open(2) of a regular file.
type handle struct {
	of *openFile
	// lostSeen is the file's count of lost buffered writes (sdk.Buffered.Lost)
	// this descriptor was told of (or found at open), under of.mu: each
	// one's fsync and close report a loss since, whichever descriptor,
	// read or stat took the error first.
	lostSeen uint64

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
	b := of.b
	of.mu.Unlock()
	if b == nil {
		return
	}
	end, buffered := b.Buffered()
	if end >= 0 && uint64(end) > out.Size {
		grow := uint64(end) - out.Size
		if buffered > 0 {
			grow = min(grow, uint64(buffered)) // written past a hole: the hole takes nothing
		}
		out.Size = uint64(end)
		out.Blocks += (grow + 511) / 512
	}
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
	if errno == 0 {
		h.lostSeen, _ = of.b.Lost()
	}
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
		of.f, of.b = cf, sdk.NewBuffered(cf, f.bufOpts)
	} else if end, _ := of.b.Buffered(); end < 0 || a.Size > of.f.Attr().Size {
		of.f.SetAttr(a)
	}
	if end, _ := of.b.Buffered(); flags&syscall.O_TRUNC != 0 && (of.f.Size() > 0 || end >= 0) {
		// Other descriptors' buffered writes go out first (nothing may
		// land after the truncation), not dropped: should the truncation
		// fail, they must still be there, or be reported lost to those
		// descriptors (Flush records a failure as a loss; the opener is
		// not the one to be told).
		_ = of.b.Flush(ctx)
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

// flushLocked sends the buffered writes: durable on every replica and
// recorded with meta when it returns. It reports a background send's
// failure not yet reported. Caller holds of.mu.
func (of *openFile) flushLocked(ctx context.Context) error {
	if of.b == nil {
		return nil
	}
	return of.b.Flush(ctx)
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
	if kill {
		if errno := of.killPrivsLocked(ctx); errno != 0 {
			return 0, errno
		}
	}
	if _, err := of.b.WriteAtContext(ctx, data, off); err != nil {
		return 0, fsys.errno("write", err)
	}
	return uint32(len(data)), 0
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	of := h.of
	fsys := of.fsys
	ctx, cancel := fsys.call(ctx)
	defer cancel()
	of.mu.Lock()
	b := of.b
	of.mu.Unlock()
	// Sends what is buffered first; reads ahead of a sequential reader.
	n, err := b.ReadAtContext(ctx, dest, off)
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
	err := of.flushLocked(ctx)
	if of.b == nil {
		return of.fsys.errno(op, err)
	}
	if n, last := of.b.Lost(); n > h.lostSeen {
		h.lostSeen = n
		if err == nil {
			err = last
		}
	}
	return of.fsys.errno(op, err)
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
	if !orphan {
		f.forgetLocked(of)
	}
	f.mu.Unlock()
	if last {
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

// recycle gives a file's buffers (and what was read ahead) back to the
// mount once its last handle is closed. (Its last Flush waited for
// every send.)
func (f *FS) recycle(of *openFile) {
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.OpTimeout)
	defer cancel()
	if err := of.b.Close(ctx); err != nil {
		f.opts.Logger.Error("fuse: writes lost at release", "ino", of.ino, "err", err)
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

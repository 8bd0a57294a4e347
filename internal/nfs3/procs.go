package nfs3

import (
	"context"
	"errors"
	"io"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// nfs serves the NFS program. Arguments are decoded whole before
// anything is done: a call that does not decode is GARBAGE_ARGS and has
// no effect.
func (g *Gateway) nfs(ctx context.Context, c *oncrpc.Call, args *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
	ctx = g.admitCall(ctx, c, args)
	var h func(context.Context, *xdr.Reader, *xdr.Writer) bool
	switch c.Proc {
	case ProcNull:
		return oncrpc.Success
	case ProcGetattr:
		h = g.getattr
	case ProcSetattr:
		h = g.setattr
	case ProcLookup:
		h = g.lookup
	case ProcAccess:
		h = g.access
	case ProcReadlink:
		h = g.readlink
	case ProcRead:
		h = g.read
	case ProcWrite:
		h = g.write
	case ProcCreate:
		h = g.create
	case ProcMkdir:
		h = g.mkdir
	case ProcSymlink:
		h = g.symlink
	case ProcMknod:
		h = g.mknod
	case ProcRemove:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.remove(ctx, r, w, false) }
	case ProcRmdir:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.remove(ctx, r, w, true) }
	case ProcRename:
		h = g.rename
	case ProcLink:
		h = g.link
	case ProcReaddir:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.readdir(ctx, r, w, false) }
	case ProcReaddirplus:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.readdir(ctx, r, w, true) }
	case ProcFsstat:
		h = g.fsstat
	case ProcFsinfo:
		h = g.fsinfo
	case ProcPathconf:
		h = g.pathconf
	case ProcCommit:
		h = g.commit
	default:
		return oncrpc.ProcUnavail
	}
	if !h(ctx, args, res) {
		return oncrpc.GarbageArgs
	}
	return oncrpc.Success
}

// attrOf returns the attributes of ino, or nil (for post_op_attr).
func (g *Gateway) attrOf(ctx context.Context, ino ids.Ino) *metaapi.Attr {
	a, err := g.cl.GetAttr(ctx, ino)
	if err != nil {
		return nil
	}
	return &a
}

// handleStatus is the status of err met on the object a handle names:
// that object missing is STALE (the handle outlived it), not NOENT.
func handleStatus(err error) Status {
	if st := statusOf(err); st != ErrNoent {
		return st
	}
	return ErrStale
}

// getAttrErr is GetAttr with its status.
func (g *Gateway) getAttrErr(ctx context.Context, ino ids.Ino) (metaapi.Attr, Status) {
	a, err := g.cl.GetAttr(ctx, ino)
	return a, handleStatus(err)
}

// withHandle handles the procedures whose reply is status, post_op_attr
// and, on success, what body appends.
func (g *Gateway) withHandle(ctx context.Context, r *xdr.Reader, w *xdr.Writer, more func(*xdr.Reader), body func(*metaapi.Attr, *xdr.Writer) Status) bool {
	ino, herr := g.handleArg(ctx, r)
	if more != nil {
		more(r)
	}
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(handleErrStatus(herr)))
		putPostOp(w, nil)
		return true
	}
	a, st := g.getAttrErr(ctx, ino)
	if st != OK {
		w.Uint32(uint32(st))
		putPostOp(w, nil)
		return true
	}
	mark := len(w.B)
	w.Uint32(0)
	putPostOp(w, &a)
	if st := body(&a, w); st != OK {
		w.B = w.B[:mark]
		w.Uint32(uint32(st))
		putPostOp(w, &a)
	}
	return true
}

func (g *Gateway) getattr(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := g.handleArg(ctx, r)
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(handleErrStatus(herr)))
		return true
	}
	if err := g.settle(ctx, ino); err != nil { // the size must include them
		w.Uint32(uint32(statusOf(err)))
		return true
	}
	a, st := g.getAttrErr(ctx, ino)
	w.Uint32(uint32(st))
	if st == OK {
		putFattr(w, &a)
	}
	return true
}

func (g *Gateway) setattr(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := g.handleArg(ctx, r)
	s := readSattr(r)
	guard := r.Bool()
	var gsec, gnsec uint32
	if guard {
		gsec, gnsec = r.Uint32(), r.Uint32()
	}
	if r.Err() != nil {
		return false
	}
	fail := func(st Status, after *metaapi.Attr) bool {
		w.Uint32(uint32(st))
		putWcc(w, after)
		return true
	}
	if herr != nil {
		return fail(handleErrStatus(herr), nil)
	}
	if err := g.settle(ctx, ino); err != nil {
		return fail(statusOf(err), nil)
	}
	a, st := g.getAttrErr(ctx, ino)
	if st != OK {
		return fail(st, nil)
	}
	if guard && (uint32(a.Ctime/1e9) != gsec || uint32(a.Ctime%1e9) != gnsec) {
		return fail(10002, &a) // NFS3ERR_NOT_SYNC: the client's view is old
	}
	req := metaapi.SetAttrReq{Ino: ino, Mode: s.mode, UID: s.uid, GID: s.gid, Atime: s.atime, Mtime: s.mtime, AtimeNow: s.atimeNow, MtimeNow: s.mtimeNow}
	if s.size != nil {
		if *s.size > metaapi.MaxFileSize {
			return fail(ErrFbig, &a)
		}
		sz := int64(*s.size)
		req.Size = &sz
	}
	after, err := g.cl.SetAttr(ctx, req)
	g.forget(ino)
	if st := statusOf(err); st != OK {
		return fail(st, g.attrOf(ctx, ino))
	}
	return fail(OK, &after)
}

// diropArgs decodes diropargs3.
func (g *Gateway) diropArgs(ctx context.Context, r *xdr.Reader) (ids.Ino, string, error) {
	dir, herr := g.handleArg(ctx, r)
	name := r.String(r.Len()) // bounded by the record; too long is NAMETOOLONG, not garbage
	return dir, name, herr
}

// checkName answers the names NFS must refuse before meta sees them.
func checkName(name string) Status {
	switch {
	case len(name) > maxName:
		return ErrNametoolong
	case name == "" || name == "." || name == "..":
		return ErrInval // meta's namespace has no dot entries
	}
	for i := range len(name) {
		if name[i] == '/' || name[i] == 0 {
			return ErrInval
		}
	}
	return OK
}

func (g *Gateway) lookup(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	dir, name, herr := g.diropArgs(ctx, r)
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(handleErrStatus(herr)))
		putPostOp(w, nil)
		return true
	}
	var a metaapi.Attr
	var err error
	switch {
	case name == "":
		err = metaapi.Errorf(metaapi.ENOENT, "empty name")
	case name == ".":
		if a, err = g.cl.GetAttr(ctx, dir); err == nil && a.Type != metaapi.TypeDir {
			err = metaapi.Errorf(metaapi.ENOTDIR, "not a directory")
		}
	case name == "..":
		// The export's root is its own parent, as on any NFS server:
		// no walking out of the export.
		var top bool
		if top, err = g.exportRoot(ctx, dir); top {
			a, err = g.cl.GetAttr(ctx, dir)
		} else if err == nil {
			a, err = g.cl.Lookup(ctx, dir, name) // meta answers the parent
		}
	default:
		if st := checkName(name); st != OK {
			w.Uint32(uint32(st))
			putPostOp(w, g.attrOf(ctx, dir))
			return true
		}
		a, err = g.cl.Lookup(ctx, dir, name)
	}
	if err != nil {
		da := g.attrOf(ctx, dir)
		st := statusOf(err)
		if st == ErrNoent && da == nil {
			st = ErrStale // the directory itself is gone
		}
		w.Uint32(uint32(st))
		putPostOp(w, da)
		return true
	}
	w.Uint32(uint32(OK))
	w.Opaque(g.handle(ctx, a.Ino))
	putPostOp(w, &a)
	putPostOp(w, g.attrOf(ctx, dir))
	return true
}

// access reports the ACCESS3 bits the caller has on an object: what
// READ, WRITE and READDIR will allow (may), and meta's check for the
// rest.
func (g *Gateway) access(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	var want uint32
	return g.withHandle(ctx, r, w, func(r *xdr.Reader) { want = r.Uint32() }, func(a *metaapi.Attr, w *xdr.Writer) Status {
		dir := a.Type == metaapi.TypeDir
		var got uint32
		if may(ctx, a, metaapi.MayRead) {
			got |= accessRead
		}
		if may(ctx, a, metaapi.MayWrite) {
			got |= accessModify | accessExtend
			if dir {
				got |= accessDelete
			}
		}
		if may(ctx, a, metaapi.MayExec) {
			if dir {
				got |= accessLookup
			} else {
				got |= accessExecute
			}
		}
		if !accessOf(ctx).rw {
			got &^= accessModify | accessExtend | accessDelete // a read-only export
		}
		w.Uint32(got & want)
		return OK
	})
}

func (g *Gateway) readlink(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	return g.withHandle(ctx, r, w, nil, func(a *metaapi.Attr, w *xdr.Writer) Status {
		if a.Type != metaapi.TypeSymlink {
			return ErrInval
		}
		w.String(string(a.Target))
		return OK
	})
}

func (g *Gateway) read(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := g.handleArg(ctx, r)
	off, count := r.Uint64(), r.Uint32()
	if r.Err() != nil {
		return false
	}
	fail := func(st Status, a *metaapi.Attr) bool {
		w.Uint32(uint32(st))
		putPostOp(w, a)
		return true
	}
	if herr != nil {
		return fail(handleErrStatus(herr), nil)
	}
	if err := g.settle(ctx, ino); err != nil {
		return fail(statusOf(err), g.attrOf(ctx, ino))
	}
	of, err := g.file(ctx, ino)
	if err != nil {
		return fail(handleStatus(err), g.attrOf(ctx, ino))
	}
	f := of.b // reads ahead of a sequential reader
	a := of.f.Attr()
	if !mayData(ctx, &a, metaapi.MayRead) {
		return fail(ErrAcces, &a)
	}
	count = min(count, MaxData)
	// reply answers with data p; it reports whether the reply still
	// refers to p (a chunk the transport sends from p, over the fabric)
	// rather than holding a copy.
	reply := func(p []byte) bool {
		w.Uint32(uint32(OK))
		putPostOp(w, &a)
		w.Uint32(uint32(len(p)))
		w.Bool(off+uint64(len(p)) >= uint64(a.Size))
		chunks := len(w.Chunks)
		w.Opaque(p)
		return len(w.Chunks) > chunks
	}
	// replyPooled answers with (*bp)[:n], a pooled buffer, which goes
	// back to the pool once the reply no longer refers to it.
	replyPooled := func(bp *[]byte, n int) bool {
		if reply((*bp)[:n]) {
			w.Hold(func() { g.bufs.Put(bp) })
		} else {
			g.bufs.Put(bp)
		}
		return true
	}
	if g.cache == nil {
		bp := g.bufs.Get().(*[]byte)
		n := 0
		if off < uint64(a.Size) {
			n, err = f.ReadAtContext(ctx, (*bp)[:count], int64(off))
			if err != nil && !errors.Is(err, io.EOF) {
				g.bufs.Put(bp)
				return fail(statusOf(err), &a)
			}
		}
		return replyPooled(bp, n)
	}

	// From the read cache: [off, end) lies within one block or spans
	// two (count is at most MaxData, one block).
	end := min(off+uint64(count), uint64(a.Size))
	if off >= end {
		reply(nil)
		return true
	}
	ver := verOf(&a)
	first, last := int64(off/blockSize), int64((end-1)/blockSize)
	b, err := g.cache.get(ctx, f, ino, first, ver)
	if err != nil {
		return fail(statusOf(err), &a)
	}
	lo, hi := int(off-uint64(first)*blockSize), int(end-uint64(first)*blockSize)
	if first == last {
		// Straight from the block: pinned until the reply is sent (or
		// copied into it).
		hi = min(hi, len(b.data)) // shorter: the file shrank during the fill
		if reply(b.data[min(lo, hi):hi]) {
			w.Hold(b.release)
		} else {
			b.release()
		}
		return true
	}
	// Across two blocks: both parts copied into one buffer.
	bp := g.bufs.Get().(*[]byte)
	buf := (*bp)[:end-off]
	n := 0
	if lo < len(b.data) {
		n = copy(buf, b.data[lo:])
	}
	full := len(b.data) == blockSize
	b.release()
	if full {
		b, err = g.cache.get(ctx, f, ino, last, ver)
		if err != nil {
			g.bufs.Put(bp)
			return fail(statusOf(err), &a)
		}
		n += copy(buf[n:], b.data)
		b.release()
	}
	return replyPooled(bp, n)
}

// write: a lone WRITE is written through to every replica and recorded
// at meta before the reply, which says FILE_SYNC whatever the client
// asked (RFC 1813 allows committing more than asked). An UNSTABLE WRITE
// that continues the previous one to the file is buffered (write-behind,
// sdk.Buffered) and answered UNSTABLE: COMMIT, or a WRITE asking for
// more, makes it durable; should a background send fail, the write
// verifier changes and the client sends those writes again.
func (g *Gateway) write(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := g.handleArg(ctx, r)
	off, count, stable := r.Uint64(), r.Uint32(), r.Uint32()
	data := r.Opaque(MaxData)
	if r.Err() != nil {
		return false
	}
	fail := func(st Status, a *metaapi.Attr) bool {
		w.Uint32(uint32(st))
		putWcc(w, a)
		return true
	}
	switch {
	case herr != nil:
		return fail(handleErrStatus(herr), nil)
	case stable > FileSync || int(count) != len(data):
		return fail(ErrInval, nil)
	case off > metaapi.MaxFileSize || uint64(count) > metaapi.MaxFileSize-off:
		return fail(ErrFbig, nil)
	}
	of, err := g.file(ctx, ino)
	if err != nil {
		return fail(handleStatus(err), nil)
	}
	f := of.f
	if a := f.Attr(); !mayData(ctx, &a, metaapi.MayWrite) {
		return fail(ErrAcces, &a)
	}
	// The verifier before the write: a loss of this write's buffer, even
	// one that comes before the reply, changes it after.
	verf := g.verf.get()
	committed := uint32(FileSync)
	if count > 0 { // a zero-byte WRITE changes nothing, not even the size
		if st := g.killPrivs(ctx, f); st != OK {
			return fail(st, g.attrOf(ctx, ino))
		}
		_, buffered, err := of.b.WriteAtBuffered(ctx, data, int64(off))
		if err == nil && buffered && (stable != Unstable || !g.kept(ino, of)) {
			// Asked for more, or buffered in a handle the gateway dropped
			// meanwhile, which no COMMIT would wait for.
			err = of.b.Flush(ctx)
		} else if err == nil && buffered {
			committed = Unstable // from this write alone: not Pending's guess
		}
		if err != nil {
			// A loss of buffered writes (an earlier one's, or those sent
			// first) has changed the verifier (OnLost); this write's own
			// failure, written through, loses nothing acknowledged and
			// leaves it, or any client could make all resend at will.
			g.forget(ino)
			// The file removed meanwhile (by another client; its chunks
			// deleted under the write) is a stale handle, not NOENT.
			return fail(handleStatus(err), g.attrOf(ctx, ino))
		}
		// After the write: a fill in progress may have read the old
		// data, and is dropped too.
		g.invalidate(ino)
	}
	a := f.Attr()
	if end, _ := of.b.Buffered(); end > a.Size {
		a.Size = end // as the client expects after its write
	}
	w.Uint32(uint32(OK))
	putWcc(w, &a)
	w.Uint32(count)
	w.Uint32(committed)
	w.Fixed(verf[:])
	return true
}

func (g *Gateway) commit(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := g.handleArg(ctx, r)
	r.Uint64()
	r.Uint32()
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(handleErrStatus(herr)))
		putWcc(w, nil)
		return true
	}
	var a metaapi.Attr
	st := OK
	if err := g.settle(ctx, ino); err != nil {
		st = statusOf(err)
	} else {
		a, st = g.getAttrErr(ctx, ino)
	}
	// After the flush: a loss before or during it changed the verifier,
	// even one whose failure another call took (and this flush had
	// nothing left to send); read before, it would vouch for lost writes.
	verf := g.verf.get()
	switch {
	case st != OK:
	case a.Type == metaapi.TypeDir:
		st = ErrIsdir
	case a.Type != metaapi.TypeFile:
		st = ErrInval
	}
	w.Uint32(uint32(st))
	if st != OK {
		putWcc(w, nil)
		return true
	}
	g.invalidate(ino)
	putWcc(w, &a)
	w.Fixed(verf[:])
	return true
}

func (g *Gateway) fsstat(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	return g.withHandle(ctx, r, w, nil, func(_ *metaapi.Attr, w *xdr.Writer) Status {
		st, err := g.status(ctx)
		if err != nil {
			return statusOf(err)
		}
		capacity, avail := st.Space()
		free := uint64(min(avail, capacity))
		w.Uint64(uint64(max(capacity, 0)))
		w.Uint64(free)
		w.Uint64(free)
		files := uint64(st.Files + st.Dirs)
		w.Uint64(files + 1<<32)
		w.Uint64(1 << 32)
		w.Uint64(1 << 32)
		w.Uint32(0) // invarsec: may change at any time
		return OK
	})
}

func (g *Gateway) fsinfo(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	return g.withHandle(ctx, r, w, nil, func(_ *metaapi.Attr, w *xdr.Writer) Status {
		w.Uint32(MaxData) // rtmax
		w.Uint32(MaxData) // rtpref
		w.Uint32(4096)    // rtmult
		w.Uint32(MaxData) // wtmax
		w.Uint32(MaxData) // wtpref
		w.Uint32(4096)    // wtmult
		w.Uint32(64 << 10)
		w.Uint64(metaapi.MaxFileSize)
		w.Uint32(0) // time_delta: nanoseconds
		w.Uint32(1)
		w.Uint32(0x1b) // FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME
		return OK
	})
}

func (g *Gateway) pathconf(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	return g.withHandle(ctx, r, w, nil, func(_ *metaapi.Attr, w *xdr.Writer) Status {
		w.Uint32(65000) // linkmax
		w.Uint32(maxName)
		w.Bool(true)  // no_trunc
		w.Bool(true)  // chown_restricted
		w.Bool(false) // case_insensitive
		w.Bool(true)  // case_preserving
		return OK
	})
}

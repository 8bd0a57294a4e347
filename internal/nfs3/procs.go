package nfs3

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// nfs serves the NFS program. Arguments are decoded whole before
// anything is done: a call that does not decode is GARBAGE_ARGS and has
// no effect.
func (g *Gateway) nfs(ctx context.Context, c *oncrpc.Call, args *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
	ctx = as(ctx, c)
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
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.access(ctx, c, r, w) }
	case ProcReadlink:
		h = g.readlink
	case ProcRead:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.read(ctx, c, r, w) }
	case ProcWrite:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.write(ctx, c, r, w) }
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
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.readdir(ctx, c, r, w, false) }
	case ProcReaddirplus:
		h = func(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool { return g.readdir(ctx, c, r, w, true) }
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

// handleArg decodes a file handle argument. A malformed handle is an
// answer (BADHANDLE), not garbage.
func handleArg(r *xdr.Reader) (ids.Ino, error) {
	h := readHandle(r)
	if r.Err() != nil {
		return 0, nil
	}
	return parseHandle(h)
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
	ino, herr := handleArg(r)
	if more != nil {
		more(r)
	}
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(ErrBadhandle))
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
	ino, herr := handleArg(r)
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(ErrBadhandle))
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
	ino, herr := handleArg(r)
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
		return fail(ErrBadhandle, nil)
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
func diropArgs(r *xdr.Reader) (ids.Ino, string, error) {
	dir, herr := handleArg(r)
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
	dir, name, herr := diropArgs(r)
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(ErrBadhandle))
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
		a, err = g.cl.Lookup(ctx, dir, name) // meta answers the parent
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
	w.Opaque(Handle(a.Ino))
	putPostOp(w, &a)
	putPostOp(w, g.attrOf(ctx, dir))
	return true
}

// access reports the ACCESS3 bits the caller has on an object: what
// READ, WRITE and READDIR will allow (may), and meta's check for the
// rest.
func (g *Gateway) access(ctx context.Context, c *oncrpc.Call, r *xdr.Reader, w *xdr.Writer) bool {
	var want uint32
	return g.withHandle(ctx, r, w, func(r *xdr.Reader) { want = r.Uint32() }, func(a *metaapi.Attr, w *xdr.Writer) Status {
		dir := a.Type == metaapi.TypeDir
		var got uint32
		if may(c, a, metaapi.MayRead) {
			got |= accessRead
		}
		if may(c, a, metaapi.MayWrite) {
			got |= accessModify | accessExtend
			if dir {
				got |= accessDelete
			}
		}
		if may(c, a, metaapi.MayExec) {
			if dir {
				got |= accessLookup
			} else {
				got |= accessExecute
			}
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

func (g *Gateway) read(ctx context.Context, c *oncrpc.Call, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := handleArg(r)
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
		return fail(ErrBadhandle, nil)
	}
	f, err := g.file(ctx, ino)
	if err != nil {
		return fail(handleStatus(err), g.attrOf(ctx, ino))
	}
	a := f.Attr()
	if !may(c, &a, metaapi.MayRead) {
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

// write is durable when it returns: every WRITE is written through to
// every replica and recorded at meta, so the reply says FILE_SYNC
// whatever the client asked (RFC 1813 allows committing more than asked)
// and COMMIT has nothing left to do.
func (g *Gateway) write(ctx context.Context, c *oncrpc.Call, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := handleArg(r)
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
		return fail(ErrBadhandle, nil)
	case stable > FileSync || int(count) != len(data):
		return fail(ErrInval, nil)
	case off > metaapi.MaxFileSize || uint64(count) > metaapi.MaxFileSize-off:
		return fail(ErrFbig, nil)
	}
	f, err := g.file(ctx, ino)
	if err != nil {
		return fail(handleStatus(err), nil)
	}
	if a := f.Attr(); !may(c, &a, metaapi.MayWrite) {
		return fail(ErrAcces, &a)
	}
	if count > 0 { // a zero-byte WRITE changes nothing, not even the size
		_, err := f.WriteAtContext(ctx, data, int64(off))
		if err != nil {
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
	w.Uint32(uint32(OK))
	putWcc(w, &a)
	w.Uint32(count)
	w.Uint32(FileSync)
	w.Fixed(g.verf[:])
	return true
}

func (g *Gateway) commit(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := handleArg(r)
	r.Uint64()
	r.Uint32()
	if r.Err() != nil {
		return false
	}
	if herr != nil {
		w.Uint32(uint32(ErrBadhandle))
		putWcc(w, nil)
		return true
	}
	a, st := g.getAttrErr(ctx, ino)
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
	w.Fixed(g.verf[:])
	return true
}

// created appends the reply of CREATE, MKDIR, SYMLINK and MKNOD.
func (g *Gateway) created(ctx context.Context, w *xdr.Writer, dir ids.Ino, resp metaapi.AttrResp, err error) {
	st := g.dirStatus(ctx, dir, err)
	w.Uint32(uint32(st))
	if st != OK {
		putWcc(w, g.attrOf(ctx, dir))
		return
	}
	putPostFH(w, resp.Attr.Ino)
	putPostOp(w, &resp.Attr)
	putWcc(w, g.dirAfter(ctx, dir, resp.Dirs))
}

// dirAfter is directory dir's attributes after a change: from those the
// change returned (meta answers with the directories it changed), else
// asked for.
func (g *Gateway) dirAfter(ctx context.Context, dir ids.Ino, dirs []metaapi.Attr) *metaapi.Attr {
	for i := range dirs {
		if dirs[i].Ino == dir {
			return &dirs[i]
		}
	}
	return g.attrOf(ctx, dir)
}

// dirStatus is err's status for an operation in directory dir: ENOENT
// of the directory itself (its handle outlived it) is STALE.
func (g *Gateway) dirStatus(ctx context.Context, dir ids.Ino, err error) Status {
	st := statusOf(err)
	if st == ErrNoent && g.attrOf(ctx, dir) == nil {
		st = ErrStale
	}
	return st
}

// createPrecheck answers a bad directory handle or name (and returns
// false), or returns true: the procedure goes on.
func (g *Gateway) createPrecheck(ctx context.Context, w *xdr.Writer, dir ids.Ino, name string, herr error) bool {
	st := OK
	if herr != nil {
		st = ErrBadhandle
	} else {
		st = checkName(name)
	}
	if st != OK {
		w.Uint32(uint32(st))
		if herr != nil {
			putWcc(w, nil)
		} else {
			putWcc(w, g.attrOf(ctx, dir))
		}
		return false
	}
	return true
}

// applySattr sets what a create's sattr3 asks beyond the mode.
func (g *Gateway) applySattr(ctx context.Context, ino ids.Ino, s sattr) (metaapi.Attr, error) {
	req := metaapi.SetAttrReq{Ino: ino, UID: s.uid, GID: s.gid, Atime: s.atime, Mtime: s.mtime, AtimeNow: s.atimeNow, MtimeNow: s.mtimeNow}
	if s.size != nil {
		sz := int64(min(*s.size, metaapi.MaxFileSize))
		req.Size = &sz
	}
	if req.UID == nil && req.GID == nil && req.Atime == nil && req.Mtime == nil && !req.AtimeNow && !req.MtimeNow && req.Size == nil {
		return g.cl.GetAttr(ctx, ino)
	}
	return g.cl.SetAttr(ctx, req)
}

func modeOr(m *uint32, def uint32) uint32 {
	if m != nil {
		return *m & 07777
	}
	return def
}

func (g *Gateway) create(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	dir, name, herr := diropArgs(r)
	how := r.Uint32()
	var s sattr
	var verf []byte
	switch how {
	case 0, 1: // UNCHECKED, GUARDED
		s = readSattr(r)
	case 2: // EXCLUSIVE
		verf = r.Fixed(8)
	default:
		r.Fail(errors.New("nfs3: bad createmode"))
	}
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	req := metaapi.CreateReq{Parent: dir, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Mode: modeOr(s.mode, 0o644), Exclusive: how != 0}
	if how == 0 {
		req.Open = metaapi.MayWrite // an existing file is opened for writing
	}
	resp, err := g.cl.CreateIn(ctx, req)
	if how == 2 {
		// The verifier lives in the new file's times until the client
		// sets them: a retransmitted create finds its own file.
		t := int64(binary.BigEndian.Uint32(verf[:4]))*1e9 + int64(binary.BigEndian.Uint32(verf[4:])%1e9)
		if metaapi.IsCode(err, metaapi.EEXIST) {
			if a, lerr := g.cl.Lookup(ctx, dir, name); lerr == nil && a.Type == metaapi.TypeFile && a.Mtime == t && a.Atime == t {
				resp, err = metaapi.AttrResp{Attr: a}, nil
			}
		} else if err == nil {
			resp.Attr, err = g.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: resp.Attr.Ino, Atime: &t, Mtime: &t})
		}
	} else if err == nil {
		resp.Attr, err = g.applySattr(ctx, resp.Attr.Ino, s)
		g.forget(resp.Attr.Ino)
	}
	g.created(ctx, w, dir, resp, err)
	return true
}

func (g *Gateway) mkdir(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	dir, name, herr := diropArgs(r)
	s := readSattr(r)
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	resp, err := g.cl.CreateIn(ctx, metaapi.CreateReq{Parent: dir, Name: metaapi.ByteString(name), Type: metaapi.TypeDir, Mode: modeOr(s.mode, 0o755), Exclusive: true})
	if err == nil {
		resp.Attr, err = g.applySattr(ctx, resp.Attr.Ino, sattr{uid: s.uid, gid: s.gid, atime: s.atime, mtime: s.mtime, atimeNow: s.atimeNow, mtimeNow: s.mtimeNow})
	}
	g.created(ctx, w, dir, resp, err)
	return true
}

func (g *Gateway) symlink(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	dir, name, herr := diropArgs(r)
	readSattr(r) // a symlink's mode is always 0777
	target := r.String(r.Len())
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	if len(target) > maxPath {
		w.Uint32(uint32(ErrNametoolong))
		putWcc(w, g.attrOf(ctx, dir))
		return true
	}
	resp, err := g.cl.CreateIn(ctx, metaapi.CreateReq{Parent: dir, Name: metaapi.ByteString(name), Type: metaapi.TypeSymlink, Mode: 0o777, Target: metaapi.ByteString(target), Exclusive: true})
	g.created(ctx, w, dir, resp, err)
	return true
}

// mknod makes FIFOs; device and socket nodes are not supported
// (NFS3ERR_BADTYPE, the status RFC 1813 names for an unsupported type).
func (g *Gateway) mknod(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	dir, name, herr := diropArgs(r)
	typ := r.Uint32()
	var s sattr
	switch typ {
	case typeChr, typeBlk:
		s = readSattr(r)
		r.Uint32() // specdata3
		r.Uint32()
	case typeSock, typeFifo:
		s = readSattr(r)
	}
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	if typ != typeFifo {
		st := ErrBadtype
		if typ < typeReg || typ > typeFifo {
			st = ErrInval
		}
		w.Uint32(uint32(st))
		putWcc(w, g.attrOf(ctx, dir))
		return true
	}
	resp, err := g.cl.CreateIn(ctx, metaapi.CreateReq{Parent: dir, Name: metaapi.ByteString(name), Type: metaapi.TypeFIFO, Mode: modeOr(s.mode, 0o644), Exclusive: true})
	g.created(ctx, w, dir, resp, err)
	return true
}

func (g *Gateway) remove(ctx context.Context, r *xdr.Reader, w *xdr.Writer, isDir bool) bool {
	dir, name, herr := diropArgs(r)
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	victim, _ := g.cl.Lookup(ctx, dir, name)
	dirs, err := g.cl.RemoveIn(ctx, dir, name, isDir, false)
	if victim.Ino != 0 {
		g.forget(victim.Ino)
	}
	w.Uint32(uint32(g.dirStatus(ctx, dir, err)))
	putWcc(w, g.dirAfter(ctx, dir, dirs))
	return true
}

func (g *Gateway) rename(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	from, fname, ferr := diropArgs(r)
	to, tname, terr := diropArgs(r)
	if r.Err() != nil {
		return false
	}
	st := OK
	switch {
	case ferr != nil || terr != nil:
		st = ErrBadhandle
	case checkName(fname) != OK:
		st = checkName(fname)
	case checkName(tname) != OK:
		st = checkName(tname)
	}
	var dirs []metaapi.Attr
	if st == OK {
		if victim, err := g.cl.Lookup(ctx, to, tname); err == nil {
			g.forget(victim.Ino)
		}
		var err error
		dirs, err = g.cl.RenameIn(ctx, from, fname, to, tname, false, false)
		st = statusOf(err)
	}
	w.Uint32(uint32(st))
	if ferr != nil || terr != nil {
		putWcc(w, nil)
		putWcc(w, nil)
		return true
	}
	putWcc(w, g.dirAfter(ctx, from, dirs))
	putWcc(w, g.dirAfter(ctx, to, dirs))
	return true
}

func (g *Gateway) link(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	ino, herr := handleArg(r)
	dir, name, derr := diropArgs(r)
	if r.Err() != nil {
		return false
	}
	st := OK
	switch {
	case herr != nil || derr != nil:
		st = ErrBadhandle
	default:
		st = checkName(name)
	}
	var resp metaapi.AttrResp
	if st == OK {
		var err error
		resp, err = g.cl.LinkIn(ctx, ino, dir, name)
		st = statusOf(err)
	}
	w.Uint32(uint32(st))
	if herr != nil || derr != nil {
		putPostOp(w, nil)
		putWcc(w, nil)
		return true
	}
	if st == OK {
		putPostOp(w, &resp.Attr)
	} else {
		putPostOp(w, g.attrOf(ctx, ino))
	}
	putWcc(w, g.dirAfter(ctx, dir, resp.Dirs))
	return true
}

// readdir serves READDIR and (plus) READDIRPLUS.
func (g *Gateway) readdir(ctx context.Context, c *oncrpc.Call, r *xdr.Reader, w *xdr.Writer, plus bool) bool {
	ino, herr := handleArg(r)
	cookie := r.Uint64()
	verf := r.Uint64()  // cookieverf3: 8 opaque bytes, read as a number
	count := r.Uint32() // READDIR: count; READDIRPLUS: dircount
	if plus {
		count = r.Uint32() // maxcount bounds the whole reply
	}
	if r.Err() != nil {
		return false
	}
	fail := func(st Status, a *metaapi.Attr) bool {
		w.Uint32(uint32(st))
		putPostOp(w, a)
		return true
	}
	if herr != nil {
		return fail(ErrBadhandle, nil)
	}
	a, st := g.getAttrErr(ctx, ino)
	if st != OK {
		return fail(st, nil)
	}
	if a.Type != metaapi.TypeDir {
		return fail(ErrNotdir, &a)
	}
	// Every call, not only the first: entries a listing holds are served
	// without asking meta.
	if !may(c, &a, metaapi.MayRead) {
		return fail(ErrAcces, &a)
	}
	var ls *listing
	if cookie == 0 {
		verf, ls = g.lists.start(ino)
	} else if ls = g.lists.get(verf, ino); ls == nil {
		// A listing the gateway no longer holds (evicted, or a restart):
		// list again up to the cookie's place, under a new verifier,
		// rather than make the client start over. (Entries added or
		// removed meanwhile shift places, as on any NFS server.)
		verf, ls = g.lists.start(ino)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for uint64(len(ls.ents)) < cookie && !ls.done {
		if err := g.nextPage(ctx, ls); err != nil {
			return fail(statusOf(err), &a)
		}
	}
	if cookie > uint64(len(ls.ents)) {
		return fail(ErrBadCookie, &a) // past the end of the directory
	}
	// Entries from the listing, fetching pages from meta as it runs
	// out, until the reply is full or the directory ends.
	budget := int(min(count, MaxData)) - 128 // less the reply's fixed part
	if budget <= 0 {
		return fail(ErrToosmall, &a)
	}
	// READDIRPLUS asks meta for each entry's attributes: bound how many
	// one call may cost.
	maxEntries := 4096
	if plus {
		maxEntries = 512
	}
	perEntry := func(name string) int {
		n := 4 + 8 + 4 + len(name) + xdr.Pad(len(name)) + 8
		if plus {
			n += 4 + 84 + 4 + 4 + handleLen
		}
		return n
	}
	type entry struct {
		d    metaapi.Dirent
		attr *metaapi.Attr
	}
	var entries []entry
	used, pos, eof := 0, int(cookie), false
	for {
		if pos == len(ls.ents) {
			if ls.done {
				eof = true
				break
			}
			if err := g.nextPage(ctx, ls); err != nil {
				return fail(statusOf(err), &a)
			}
			continue
		}
		d := ls.ents[pos]
		if used+perEntry(string(d.Name)) > budget || len(entries) == maxEntries {
			break
		}
		used += perEntry(string(d.Name))
		entries = append(entries, entry{d: d})
		pos++
	}
	if len(entries) == 0 && !eof {
		return fail(ErrToosmall, &a)
	}
	if plus {
		// Attributes of the entries, a few at a time.
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for i := range entries {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				entries[i].attr = g.attrOf(ctx, entries[i].d.Ino)
			}()
		}
		wg.Wait()
	}
	w.Uint32(uint32(OK))
	putPostOp(w, &a)
	var vb [8]byte
	binary.BigEndian.PutUint64(vb[:], verf)
	w.Fixed(vb[:])
	first := int(cookie)
	for i, e := range entries {
		w.Bool(true)
		w.Uint64(uint64(e.d.Ino))
		w.String(string(e.d.Name))
		w.Uint64(uint64(first + i + 1)) // its place in the listing
		if plus {
			putPostOp(w, e.attr)
			putPostFH(w, e.d.Ino)
		}
	}
	w.Bool(false)
	w.Bool(eof)
	return true
}

// nextPage extends listing ls (whose mu the caller holds) by the next
// page meta lists.
func (g *Gateway) nextPage(ctx context.Context, ls *listing) error {
	after := ""
	if len(ls.ents) > 0 {
		after = string(ls.ents[len(ls.ents)-1].Name)
	}
	page, more, err := g.cl.ReadDirPage(ctx, ls.dir, after)
	if err == nil {
		g.lists.add(ls, page, !more)
	}
	return err
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

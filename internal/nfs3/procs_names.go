package nfs3

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/xdr"
)

// The procedures that change names: CREATE, MKDIR, SYMLINK, MKNOD,
// REMOVE, RMDIR, RENAME and LINK.

// created appends the reply of CREATE, MKDIR, SYMLINK and MKNOD.
func (g *Gateway) created(ctx context.Context, w *xdr.Writer, dir ids.Ino, resp metaapi.AttrResp, err error) {
	st := g.dirStatus(ctx, dir, err)
	w.Uint32(uint32(st))
	if st != OK {
		putWcc(w, g.attrOf(ctx, dir))
		return
	}
	g.putPostFH(ctx, w, resp.Attr.Ino)
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
		st = handleErrStatus(herr)
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
	dir, name, herr := g.diropArgs(ctx, r)
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
	dir, name, herr := g.diropArgs(ctx, r)
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
	dir, name, herr := g.diropArgs(ctx, r)
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

// nodeType is the inode type MKNOD makes of an ftype3.
func nodeType(typ uint32) (metaapi.FileType, bool) {
	switch typ {
	case typeChr:
		return metaapi.TypeChar, true
	case typeBlk:
		return metaapi.TypeBlock, true
	case typeSock:
		return metaapi.TypeSocket, true
	case typeFifo:
		return metaapi.TypeFIFO, true
	}
	return "", false
}

// mknod makes device nodes, sockets and FIFOs, as the mount's mknod(2)
// does (meta lets only root make devices); other types are
// NFS3ERR_BADTYPE, the status RFC 1813 names for them.
func (g *Gateway) mknod(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	dir, name, herr := g.diropArgs(ctx, r)
	typ := r.Uint32()
	var s sattr
	var rdev uint64
	switch typ {
	case typeChr, typeBlk:
		s = readSattr(r)
		major, minor := r.Uint32(), r.Uint32() // specdata3
		rdev = metaapi.Mkdev(major, minor)
		if major > metaapi.MaxDevMajor || minor > metaapi.MaxDevMinor {
			rdev = ^uint64(0) // not a Linux device number: meta refuses it
		}
	case typeSock, typeFifo:
		s = readSattr(r)
	}
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	ft, ok := nodeType(typ)
	if !ok {
		st := ErrBadtype
		if typ < typeReg || typ > typeFifo {
			st = ErrInval
		}
		w.Uint32(uint32(st))
		putWcc(w, g.attrOf(ctx, dir))
		return true
	}
	resp, err := g.cl.CreateIn(ctx, metaapi.CreateReq{Parent: dir, Name: metaapi.ByteString(name), Type: ft, Mode: modeOr(s.mode, 0o644), Rdev: rdev, Exclusive: true})
	if err == nil {
		resp.Attr, err = g.applySattr(ctx, resp.Attr.Ino, sattr{uid: s.uid, gid: s.gid, atime: s.atime, mtime: s.mtime, atimeNow: s.atimeNow, mtimeNow: s.mtimeNow})
	}
	g.created(ctx, w, dir, resp, err)
	return true
}

func (g *Gateway) remove(ctx context.Context, r *xdr.Reader, w *xdr.Writer, isDir bool) bool {
	dir, name, herr := g.diropArgs(ctx, r)
	if r.Err() != nil {
		return false
	}
	if !g.createPrecheck(ctx, w, dir, name, herr) {
		return true
	}
	victim, _ := g.cl.Lookup(ctx, dir, name)
	dirs, err := g.cl.RemoveIn(ctx, dir, name, isDir, false)
	if victim.Ino != 0 {
		if err == nil {
			g.forgetGone(ctx, victim.Ino)
		} else {
			g.forget(victim.Ino)
		}
	}
	w.Uint32(uint32(g.dirStatus(ctx, dir, err)))
	putWcc(w, g.dirAfter(ctx, dir, dirs))
	return true
}

func (g *Gateway) rename(ctx context.Context, r *xdr.Reader, w *xdr.Writer) bool {
	from, fname, ferr := g.diropArgs(ctx, r)
	to, tname, terr := g.diropArgs(ctx, r)
	if r.Err() != nil {
		return false
	}
	st := OK
	switch {
	case ferr != nil:
		st = handleErrStatus(ferr)
	case terr != nil:
		st = handleErrStatus(terr)
	case checkName(fname) != OK:
		st = checkName(fname)
	case checkName(tname) != OK:
		st = checkName(tname)
	}
	var dirs []metaapi.Attr
	if st == OK {
		// A file renamed over is forgotten after: if that was its last
		// name, its buffered writes are dropped (forgetGone), not sent
		// while it goes and failing.
		victim, verr := g.cl.Lookup(ctx, to, tname)
		var err error
		dirs, err = g.cl.RenameIn(ctx, from, fname, to, tname, false, false)
		st = statusOf(err)
		switch {
		case verr != nil:
		case err == nil:
			g.forgetGone(ctx, victim.Ino)
		default:
			g.forget(victim.Ino)
		}
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
	ino, herr := g.handleArg(ctx, r)
	dir, name, derr := g.diropArgs(ctx, r)
	if r.Err() != nil {
		return false
	}
	st := OK
	switch {
	case herr != nil:
		st = handleErrStatus(herr)
	case derr != nil:
		st = handleErrStatus(derr)
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

package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// node is one inode the kernel knows of. It holds no attributes: the
// kernel caches them for AttrTimeout and asks again.
type node struct {
	fs.Inode
	fsys *FS
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
	_ fs.NodeAllocater  = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
)

// Fsync of a file syncs its handle; of a directory it succeeds at once:
// namespace changes are durable at meta when they return. (go-fuse asks
// the node before the handle, so the node must pass it on.)
func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := fh.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	return 0
}

func (n *node) ino() ids.Ino { return ids.Ino(n.StableAttr().Ino) }

// child returns the kernel inode for a, reusing the one it already knows
// for that inode number (hard links).
func (n *node) child(ctx context.Context, a *metaapi.Attr, out *fuse.EntryOut) *fs.Inode {
	fillAttr(a, &out.Attr)
	n.fsys.adjustSize(a.Ino, &out.Attr)
	return n.NewInode(ctx, &node{fsys: n.fsys}, fs.StableAttr{Mode: typeMode(a.Type), Ino: uint64(a.Ino)})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	a, err := n.fsys.cl.Lookup(ctx, n.ino(), name)
	if err != nil {
		return nil, n.fsys.errno("lookup", err)
	}
	return n.child(ctx, &a, out), 0
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if a, left, ok := n.fsys.dirs.get(n.ino()); ok {
		fillAttr(&a, &out.Attr)
		out.SetTimeout(left)
		return 0
	}
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	a, err := n.fsys.cl.GetAttr(ctx, n.ino())
	if err != nil {
		return n.fsys.errno("getattr", err)
	}
	fillAttr(&a, &out.Attr)
	n.fsys.adjustSize(a.Ino, &out.Attr)
	return 0
}

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	req := metaapi.SetAttrReq{Ino: n.ino()}
	if m, ok := in.GetMode(); ok {
		m &= 07777
		req.Mode = &m
	}
	if u, ok := in.GetUID(); ok {
		req.UID = &u
	}
	if g, ok := in.GetGID(); ok {
		req.GID = &g
	}
	// "Now" is meta's to say: it needs only write permission, where an
	// explicit time needs ownership.
	req.AtimeNow = in.Valid&fuse.FATTR_ATIME_NOW != 0
	req.MtimeNow = in.Valid&fuse.FATTR_MTIME_NOW != 0
	if t, ok := in.GetATime(); ok && !req.AtimeNow {
		ns := t.UnixNano()
		req.Atime = &ns
	}
	if t, ok := in.GetMTime(); ok && !req.MtimeNow {
		ns := t.UnixNano()
		req.Mtime = &ns
	}
	if sz, ok := in.GetSize(); ok {
		s := int64(sz)
		req.Size = &s
	}
	// A truncation by an unprivileged process, or a chown (killpriv.go).
	req.KillSuidgid = in.Valid&fuse.FATTR_KILL_SUIDGID != 0
	of, unlock, err := n.fsys.lockFlushed(ctx, n.ino())
	defer unlock()
	if err != nil {
		return n.fsys.errno("setattr", err)
	}
	n.fsys.dirs.forget(n.ino()) // if the reply is lost, the change may have happened
	a, err := n.fsys.cl.SetAttr(ctx, req)
	if err != nil {
		return n.fsys.errno("setattr", err)
	}
	of.learn(a)
	n.fsys.dirs.note([]metaapi.Attr{a})
	fillAttr(&a, &out.Attr)
	return 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	r, err := n.fsys.cl.CreateIn(ctx, metaapi.CreateReq{
		Parent: n.ino(), Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Mode: mode & 07777,
		Exclusive: flags&syscall.O_EXCL != 0, Open: openAccess(flags),
	})
	if err != nil {
		return nil, nil, 0, n.fsys.errno("create", err)
	}
	n.fsys.dirs.note(r.Dirs)
	a := r.Attr
	if a.Type != metaapi.TypeFile {
		return nil, nil, 0, syscall.EISDIR
	}
	h, errno := n.fsys.open(ctx, a.Ino, name, flags, &a)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	a = h.of.f.Attr()
	return n.child(ctx, &a, out), h, 0, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	if n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, 0, syscall.EINVAL
	}
	// Close-to-open: every open reads the attributes afresh.
	h, errno := n.fsys.open(ctx, n.ino(), "", flags, nil)
	if errno != 0 {
		return nil, 0, errno
	}
	// No FOPEN_KEEP_CACHE: the kernel drops this file's cached pages,
	// so the open sees what other mounts closed before it; and its cached
	// attributes go too (offset -1: attributes only), or it would read
	// up to the size it knew rather than the file's.
	n.NotifyContent(-1, 0)
	return h, 0, 0
}

func (n *node) mknode(ctx context.Context, name string, typ metaapi.FileType, mode, rdev uint32, target string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	r, err := n.fsys.cl.CreateIn(ctx, metaapi.CreateReq{Parent: n.ino(), Name: metaapi.ByteString(name), Type: typ, Mode: mode & 07777, Rdev: uint64(rdev), Target: metaapi.ByteString(target), Exclusive: true})
	if err != nil {
		return nil, n.fsys.errno("create", err)
	}
	n.fsys.dirs.note(r.Dirs)
	return n.child(ctx, &r.Attr, out), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.mknode(ctx, name, metaapi.TypeDir, mode, 0, "", out)
}

// Mknod makes regular files, FIFOs, sockets (bind(2) of a Unix socket)
// and device nodes (the number in the kernel's 32-bit encoding, which is
// glibc's for Linux's numbers). The kernel has checked the privilege a
// device needs; meta checks it again.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	typ, ok := fileType(mode)
	if !ok {
		return nil, syscall.EINVAL
	}
	if !typ.IsDevice() {
		dev = 0 // mknod(2) ignores it
	}
	return n.mknode(ctx, name, typ, mode, dev, "", out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.mknode(ctx, name, metaapi.TypeSymlink, 0o777, 0, target, out)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	a, err := n.fsys.cl.GetAttr(ctx, n.ino())
	if err != nil {
		return nil, n.fsys.errno("readlink", err)
	}
	if a.Type != metaapi.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(a.Target), 0
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	r, err := n.fsys.cl.LinkIn(ctx, ids.Ino(target.EmbeddedInode().StableAttr().Ino), n.ino(), name)
	if err != nil {
		return nil, n.fsys.errno("link", err)
	}
	n.fsys.dirs.note(r.Dirs)
	return n.child(ctx, &r.Attr, out), 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	r := n.fsys.beginRemoval(&n.Inode, name)
	dirs, err := n.fsys.cl.RemoveIn(ctx, n.ino(), name, false, r.keep)
	r.end(err == nil)
	n.fsys.dirs.note(dirs)
	return n.fsys.errno("unlink", err)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	n.forgetChild(name)
	dirs, err := n.fsys.cl.RemoveIn(ctx, n.ino(), name, true, false)
	n.fsys.dirs.note(dirs)
	return n.fsys.errno("rmdir", err)
}

// forgetChild drops what the mount noted of child name's attributes: an
// operation is about to change them without saying how (a directory
// renamed gets a new ctime).
func (n *node) forgetChild(name string) {
	if c := n.GetChild(name); c != nil {
		n.fsys.dirs.forget(ids.Ino(c.StableAttr().Ino))
	}
}

// Rename supports RENAME_NOREPLACE; RENAME_EXCHANGE and RENAME_WHITEOUT
// are refused with EINVAL, as by file systems without them.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	const noReplace = 1 // RENAME_NOREPLACE
	if flags&^noReplace != 0 {
		return syscall.EINVAL
	}
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	npn := newParent.EmbeddedInode()
	r := n.fsys.beginRemoval(npn, newName) // the file it replaces, if any
	n.forgetChild(name)
	dirs, err := n.fsys.cl.RenameIn(ctx, n.ino(), name, ids.Ino(npn.StableAttr().Ino), newName, flags&noReplace != 0, r.keep)
	r.end(err == nil)
	n.fsys.dirs.note(dirs)
	return n.fsys.errno("rename", err)
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	// "." and ".." are the file system's to list; the parent is the one
	// the kernel reached this directory by (the root is its own).
	parent := n.ino()
	if _, p := n.Parent(); p != nil {
		parent = ids.Ino(p.StableAttr().Ino)
	}
	out := []fuse.DirEntry{
		{Name: ".", Ino: uint64(n.ino()), Mode: syscall.S_IFDIR},
		{Name: "..", Ino: uint64(parent), Mode: syscall.S_IFDIR},
	}
	after := ""
	for {
		ents, more, err := n.fsys.cl.ReadDirPage(ctx, n.ino(), after)
		if err != nil {
			return nil, n.fsys.errno("readdir", err)
		}
		for _, e := range ents {
			out = append(out, fuse.DirEntry{Name: string(e.Name), Ino: uint64(e.Ino), Mode: typeMode(e.Type)})
		}
		if !more || len(ents) == 0 {
			return fs.NewListDirStream(out), 0
		}
		after = string(ents[len(ents)-1].Name)
	}
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	return n.fsys.errno("statfs", n.fsys.statfs(ctx, out))
}

// Allocate supports plain fallocate (the file grows to cover the range;
// Sluice stores no blocks ahead of data, so nothing is reserved) and
// FALLOC_FL_KEEP_SIZE (nothing to do). Punching and collapsing holes are
// refused with EOPNOTSUPP.
func (n *node) Allocate(ctx context.Context, fh fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	const keepSize = 1 // FALLOC_FL_KEEP_SIZE
	switch mode {
	case keepSize:
		return 0
	case 0:
	default:
		return syscall.EOPNOTSUPP
	}
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	end := int64(off + size)
	if end < 0 || end > metaapi.MaxFileSize {
		return syscall.EFBIG
	}
	// The file stays locked until its new size is known here.
	of, unlock, err := n.fsys.lockFlushed(ctx, n.ino())
	defer unlock()
	if err != nil {
		return n.fsys.errno("fallocate", err)
	}
	a, err := n.fsys.cl.GetAttr(ctx, n.ino())
	if err != nil {
		return n.fsys.errno("fallocate", err)
	}
	if end <= a.Size {
		return 0
	}
	na, err := n.fsys.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: n.ino(), Size: &end})
	if err != nil {
		return n.fsys.errno("fallocate", err)
	}
	of.learn(na)
	return 0
}

var _ fs.NodeTmpfiler = (*node)(nil)

// Tmpfile is open(2) with O_TMPFILE: a file with no name, which meta keeps
// as it keeps a removed open file — released at the last close, its
// lease renewed meanwhile — unless linkat(2) names it first (not with
// O_EXCL).
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	r, err := n.fsys.cl.CreateIn(ctx, metaapi.CreateReq{
		Parent: n.ino(), Type: metaapi.TypeFile, Mode: mode & 07777, Tmpfile: true, Exclusive: flags&syscall.O_EXCL != 0,
	})
	if err != nil {
		return nil, nil, 0, n.fsys.errno("tmpfile", err)
	}
	a := r.Attr
	h, errno := n.fsys.open(ctx, a.Ino, "", flags, &a)
	if errno != 0 {
		// Nobody holds it: free it now, not at the lease's end.
		if err := n.fsys.cl.Release(ctx, a.Ino, false); err != nil {
			n.fsys.opts.Logger.Warn("fuse: freeing a tmpfile whose open failed (meta frees it when its lease lapses)", "ino", a.Ino, "err", err)
		}
		return nil, nil, 0, errno
	}
	// A release at the last close frees it if it is still nameless (meta
	// ignores the release of a file that has a name by then).
	n.fsys.mu.Lock()
	h.of.orphan = true
	n.fsys.mu.Unlock()
	return n.child(ctx, &a, out), h, 0, 0
}

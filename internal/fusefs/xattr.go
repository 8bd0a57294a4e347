package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Extended attributes are meta's (see metaapi: namespaces, permissions,
// limits); the mount passes them through.

// maxXattrList is the most listxattr(2) returns (XATTR_LIST_MAX).
const maxXattrList = 64 << 10

var (
	_ fs.NodeGetxattrer    = (*node)(nil)
	_ fs.NodeSetxattrer    = (*node)(nil)
	_ fs.NodeListxattrer   = (*node)(nil)
	_ fs.NodeRemovexattrer = (*node)(nil)
)

// Getxattr copies the value into dest; a dest too small (the size query
// has none) gets ERANGE and the size.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr == metaapi.XattrCaps {
		return 0, syscall.ENODATA // the kernel's question before every write: never set
	}
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	v, err := n.fsys.cl.GetXattr(ctx, n.ino(), attr)
	if err != nil {
		return 0, n.fsys.errno("getxattr", err)
	}
	if len(v) > len(dest) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	n.fsys.dirs.forget(n.ino()) // its ctime changes
	return n.fsys.errno("setxattr", n.fsys.cl.SetXattr(ctx, n.ino(), attr, data, flags))
}

// Listxattr writes the names, each NUL-terminated, into dest (ERANGE and
// the size if they do not fit).
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	names, err := n.fsys.cl.ListXattr(ctx, n.ino())
	if err != nil {
		return 0, n.fsys.errno("listxattr", err)
	}
	size := 0
	for _, name := range names {
		size += len(name) + 1
	}
	if size > maxXattrList {
		return 0, syscall.E2BIG // as Linux: more than listxattr(2) can return
	}
	if size > len(dest) {
		return uint32(size), syscall.ERANGE
	}
	off := 0
	for _, name := range names {
		off += copy(dest[off:], name)
		dest[off] = 0
		off++
	}
	return uint32(size), 0
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if attr == metaapi.XattrCaps {
		return syscall.ENODATA // the kernel drops capabilities on chown and truncate: none to drop
	}
	ctx, cancel := n.fsys.call(ctx)
	defer cancel()
	n.fsys.dirs.forget(n.ino()) // its ctime changes
	return n.fsys.errno("removexattr", n.fsys.cl.RemoveXattr(ctx, n.ino(), attr))
}

package sdk

import (
	"context"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// This file is the SDK's inode-level interface, for front ends that name
// things by inode and name as the kernel does (the FUSE mount, the NFS
// gateway): no path resolution, one meta call each.

type whoKey struct{}

// WithWho returns a context whose calls are made as who (permission checks
// at meta) instead of the client's default identity: a front end serving
// many users passes each request's caller.
func WithWho(ctx context.Context, who Who) context.Context {
	return context.WithValue(ctx, whoKey{}, who)
}

// whoOf is the identity calls made with ctx act as.
func (c *Client) whoOf(ctx context.Context) metaapi.Who {
	if w, ok := ctx.Value(whoKey{}).(metaapi.Who); ok {
		return w
	}
	return c.who
}

// Lookup returns the attributes of name in directory parent.
func (c *Client) Lookup(ctx context.Context, parent ids.Ino, name string) (metaapi.Attr, error) {
	var resp metaapi.AttrResp
	err := c.meta.Call(ctx, metaapi.OpLookup, metaapi.LookupReq{Parent: parent, Name: metaapi.ByteString(name), Who: c.whoOf(ctx)}, &resp)
	return resp.Attr, err
}

// CreateIn creates req.Name in directory req.Parent: a file, directory,
// symlink or FIFO (see metaapi.CreateReq). It acts as ctx's identity.
// The reply carries the directory's attributes after the change, as do
// those of LinkIn, RemoveIn and RenameIn.
func (c *Client) CreateIn(ctx context.Context, req metaapi.CreateReq) (metaapi.AttrResp, error) {
	var resp metaapi.AttrResp
	req.Who = c.whoOf(ctx)
	err := c.meta.Call(ctx, metaapi.OpCreate, req, &resp)
	return resp, err
}

// LinkIn gives inode ino another name, newName in directory newParent.
func (c *Client) LinkIn(ctx context.Context, ino, newParent ids.Ino, newName string) (metaapi.AttrResp, error) {
	var resp metaapi.AttrResp
	err := c.meta.Call(ctx, metaapi.OpLink, metaapi.LinkReq{Ino: ino, NewParent: newParent, NewName: metaapi.ByteString(newName), Who: c.whoOf(ctx)}, &resp)
	return resp, err
}

// RemoveIn unlinks name from directory parent (dir: rmdir semantics).
// With keep (the caller holds the file open), a file losing its last name
// is kept until Release (see metaapi.RemoveReq).
func (c *Client) RemoveIn(ctx context.Context, parent ids.Ino, name string, dir, keep bool) ([]metaapi.Attr, error) {
	var resp metaapi.DirsResp
	err := c.meta.Call(ctx, metaapi.OpRemove, metaapi.RemoveReq{Parent: parent, Name: metaapi.ByteString(name), Dir: dir, Keep: keep, Who: c.whoOf(ctx)}, &resp)
	return resp.Dirs, err
}

// RenameIn moves oldName in oldParent to newName in newParent atomically,
// replacing what is there if POSIX allows (noReplace: EEXIST instead;
// keep: a replaced file the caller holds open is kept until Release).
func (c *Client) RenameIn(ctx context.Context, oldParent ids.Ino, oldName string, newParent ids.Ino, newName string, noReplace, keep bool) ([]metaapi.Attr, error) {
	var resp metaapi.DirsResp
	err := c.meta.Call(ctx, metaapi.OpRename, metaapi.RenameReq{
		OldParent: oldParent, OldName: metaapi.ByteString(oldName), NewParent: newParent, NewName: metaapi.ByteString(newName), NoReplace: noReplace, Keep: keep, Who: c.whoOf(ctx),
	}, &resp)
	return resp.Dirs, err
}

// Release frees a file kept by RemoveIn or RenameIn with keep once it is
// closed (renew: extends the lease instead, while it stays open).
func (c *Client) Release(ctx context.Context, ino ids.Ino, renew bool) error {
	return c.meta.Call(ctx, metaapi.OpRelease, metaapi.ReleaseReq{Ino: ino, Renew: renew, Who: c.whoOf(ctx)}, nil)
}

// Lock sets, tests or releases a file lock (see metaapi.LockReq; its Who
// is filled in). A conflict is an answer, not an error.
func (c *Client) Lock(ctx context.Context, req metaapi.LockReq) (metaapi.LockResp, error) {
	req.Who = c.whoOf(ctx)
	var resp metaapi.LockResp
	err := c.meta.Call(ctx, metaapi.OpLock, req, &resp)
	return resp, err
}

// LockSession renews a lock session, or ends it with end.
func (c *Client) LockSession(ctx context.Context, session uint64, end bool) (metaapi.LockSessionResp, error) {
	var resp metaapi.LockSessionResp
	err := c.meta.Call(ctx, metaapi.OpLockSess, metaapi.LockSessionReq{Session: session, End: end}, &resp)
	return resp, err
}

// ReadDirPage returns the entries of directory ino after the name after
// (in name order), at most metaapi.MaxReaddirLimit, and whether more
// follow.
func (c *Client) ReadDirPage(ctx context.Context, ino ids.Ino, after string) ([]metaapi.Dirent, bool, error) {
	var resp metaapi.ReaddirResp
	err := c.meta.Call(ctx, metaapi.OpReaddir, metaapi.ReaddirReq{Ino: ino, After: metaapi.ByteString(after), Who: c.whoOf(ctx)}, &resp)
	return resp.Entries, resp.More, err
}

// SetAttr changes the attributes req names (its Who is filled in) and
// returns the new ones. A size change drops the cached layouts, whose
// truncation state it changes.
func (c *Client) SetAttr(ctx context.Context, req metaapi.SetAttrReq) (metaapi.Attr, error) {
	req.Who = c.whoOf(ctx)
	var resp metaapi.AttrResp
	err := c.meta.Call(ctx, metaapi.OpSetAttr, req, &resp)
	if err == nil && req.Size != nil {
		c.layouts.drop(req.Ino)
	}
	return resp.Attr, err
}

// OpenAttr opens the regular file a has the attributes of (from Lookup or
// GetAttr); name is for error messages.
func (c *Client) OpenAttr(a metaapi.Attr, name string) (*File, error) {
	switch a.Type {
	case metaapi.TypeFile:
		return &File{c: c, path: name, attr: a}, nil
	case metaapi.TypeDir:
		return nil, pathErr("open", name, metaapi.Errorf(metaapi.EISDIR, "is a directory"))
	}
	return nil, pathErr("open", name, metaapi.Errorf(metaapi.EINVAL, "not a regular file (%s)", a.Type))
}

// ForgetLayouts drops what the client has cached of ino's chunk layouts:
// a front end opening a file afresh (close-to-open) must not read through
// chunks another client has since replaced (a truncation, an overwrite).
func (c *Client) ForgetLayouts(ino ids.Ino) { c.layouts.drop(ino) }

// SetAttr updates what the handle knows of the file (a front end that
// learnt of a truncation or another writer, say).
func (f *File) SetAttr(a metaapi.Attr) {
	f.mu.Lock()
	f.attr = a
	f.mu.Unlock()
}

// SetXattr sets extended attribute name of ino (flags: metaapi.XattrCreate
// or XattrReplace, or 0).
func (c *Client) SetXattr(ctx context.Context, ino ids.Ino, name string, value []byte, flags uint32) error {
	return c.meta.Call(ctx, metaapi.OpSetXattr, metaapi.SetXattrReq{Ino: ino, Name: metaapi.ByteString(name), Value: value, Flags: flags, Who: c.whoOf(ctx)}, nil)
}

// GetXattr returns extended attribute name of ino.
func (c *Client) GetXattr(ctx context.Context, ino ids.Ino, name string) ([]byte, error) {
	var resp metaapi.XattrResp
	err := c.meta.Call(ctx, metaapi.OpGetXattr, metaapi.XattrReq{Ino: ino, Name: metaapi.ByteString(name), Who: c.whoOf(ctx)}, &resp)
	return resp.Value, err
}

// ListXattr returns the names of ino's extended attributes the caller may
// see.
func (c *Client) ListXattr(ctx context.Context, ino ids.Ino) ([]string, error) {
	var resp metaapi.ListXattrResp
	err := c.meta.Call(ctx, metaapi.OpListXattr, metaapi.ListXattrReq{Ino: ino, Who: c.whoOf(ctx)}, &resp)
	names := make([]string, len(resp.Names))
	for i, n := range resp.Names {
		names[i] = string(n)
	}
	return names, err
}

// RemoveXattr deletes extended attribute name of ino.
func (c *Client) RemoveXattr(ctx context.Context, ino ids.Ino, name string) error {
	return c.meta.Call(ctx, metaapi.OpRmXattr, metaapi.XattrReq{Ino: ino, Name: metaapi.ByteString(name), Who: c.whoOf(ctx)}, nil)
}

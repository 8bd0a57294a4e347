package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Set-user-ID and set-group-ID bits are dropped when an unprivileged
// process writes, truncates or chowns a file. The mount negotiates
// FUSE_HANDLE_KILLPRIV_V2: the kernel, which knows whether the process
// holds CAP_FSETID, marks such a WRITE (and a SETATTR) and meta clears
// the bits, by one rule for every front end (SetAttrReq.KillSuidgid).
// Without it the kernel would clear them itself with a chmod in the
// writer's name, which meta must refuse a non-owner.

// killCaps are the FUSE capabilities asked for.
const killCaps = fuse.CAP_HANDLE_KILLPRIV_V2

// privRaw passes a WRITE's request to drop privileges to the handle,
// keyed by the request's cancel channel as lockRaw passes a FLUSH's
// owner: go-fuse's node API does not pass write flags.
type privRaw struct {
	fuse.RawFileSystem
	f *FS
}

func (r *privRaw) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		r.f.killWrites.Store(cancel, struct{}{})
		defer r.f.killWrites.Delete(cancel)
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *privRaw) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		r.f.killWrites.Store(cancel, struct{}{})
		defer r.f.killWrites.Delete(cancel)
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

// killsPrivs reports whether the write ctx (as go-fuse passed it) belongs
// to asks for the file's privileges to be dropped.
func (f *FS) killsPrivs(ctx context.Context) bool {
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return false
	}
	_, kill := f.killWrites.Load(fc.Cancel)
	return kill
}

// killPrivsLocked drops the file's set-user-ID and set-group-ID bits
// before a write by an unprivileged process, if it has them: once, then
// the file's attributes say there is nothing left to drop. What is
// buffered goes first, so that the attributes meta returns are the
// file's. Caller holds of.mu.
func (of *openFile) killPrivsLocked(ctx context.Context) syscall.Errno {
	if a := of.f.Attr(); metaapi.KillSuidgid(a.Type, a.Mode) == a.Mode {
		return 0
	}
	fsys := of.fsys
	if err := of.flushLocked(ctx); err != nil {
		return fsys.errno("write", err)
	}
	a, err := fsys.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: of.ino, KillSuidgid: true})
	if err != nil {
		return fsys.errno("write", err)
	}
	of.learn(a)
	return 0
}

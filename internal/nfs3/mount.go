package nfs3

import (
	"context"
	"strings"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// mountstat3 values.
const (
	mntOK          = 0
	mntErrNoent    = 2
	mntErrAcces    = 13
	mntErrNotdir   = 20
	mntErrInval    = 22
	mntErrNameLong = 63
	mntErrIO       = 5
)

// maxMountPath is MNTPATHLEN.
const maxMountPath = 1024

// mount serves the MOUNT program. The export is the cluster's root, "/";
// MNT also accepts any directory below it (clients such as libnfs mount
// the directory holding the file they name). Mounts are not recorded:
// DUMP lists none and UMNT has nothing to undo.
func (g *Gateway) mount(ctx context.Context, c *oncrpc.Call, args *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
	ctx = as(ctx, c)
	switch c.Proc {
	case MountNull, MountUmntall:
		return oncrpc.Success
	case MountUmnt:
		args.String(maxMountPath)
		if args.Err() != nil {
			return oncrpc.GarbageArgs
		}
		return oncrpc.Success
	case MountDump:
		res.Bool(false)
		return oncrpc.Success
	case MountExport:
		res.Bool(true)
		res.String("/")
		res.Bool(false) // no groups: every host
		res.Bool(false)
		return oncrpc.Success
	case MountMnt:
		p := args.String(args.Len()) // too long is MNT3ERR_NAMETOOLONG
		if args.Err() != nil {
			return oncrpc.GarbageArgs
		}
		st, ino := g.mnt(ctx, p)
		res.Uint32(st)
		if st == mntOK {
			res.Opaque(Handle(ino))
			res.Uint32(1) // auth flavors: AUTH_SYS
			res.Uint32(oncrpc.AuthSys)
		}
		return oncrpc.Success
	}
	return oncrpc.ProcUnavail
}

// mnt resolves a mount path as the caller.
func (g *Gateway) mnt(ctx context.Context, p string) (uint32, ids.Ino) {
	switch {
	case len(p) > maxMountPath:
		return mntErrNameLong, 0
	case !strings.HasPrefix(p, "/"):
		return mntErrInval, 0
	}
	a, err := g.cl.Stat(ctx, p)
	switch st := statusOf(err); st {
	case OK:
	case ErrNoent:
		return mntErrNoent, 0
	case ErrAcces, ErrPerm:
		return mntErrAcces, 0
	case ErrNotdir:
		return mntErrNotdir, 0
	case ErrNametoolong:
		return mntErrNameLong, 0
	case ErrInval:
		return mntErrInval, 0
	default:
		return mntErrIO, 0
	}
	if a.Type != metaapi.TypeDir {
		return mntErrNotdir, 0
	}
	return mntOK, a.Ino
}

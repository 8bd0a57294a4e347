package nfs3

import (
	"context"
	"path"
	"strings"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/sdk"
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

// mount serves the MOUNT program. MNT mounts an export or any directory
// below it (clients such as libnfs mount the directory holding the file
// they name), if the export admits the caller (nfsexport.Find); the
// handle it returns belongs to that export. Mounts are not recorded:
// DUMP lists none and UMNT has nothing to undo.
func (g *Gateway) mount(ctx context.Context, c *oncrpc.Call, args *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
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
		// Every export and its clients, as showmount -e shows them.
		for _, e := range g.exports {
			res.Bool(true)
			res.String(e.Path)
			for _, cl := range e.Clients {
				res.Bool(true)
				if cl.Any {
					res.String("*")
				} else {
					res.String(cl.Net.String())
				}
			}
			res.Bool(false)
		}
		res.Bool(false)
		return oncrpc.Success
	case MountMnt:
		p := args.String(args.Len()) // too long is MNT3ERR_NAMETOOLONG
		if args.Err() != nil {
			return oncrpc.GarbageArgs
		}
		st, exp, ino := g.mnt(ctx, c, p)
		res.Uint32(st)
		if st == mntOK {
			res.Opaque(g.handles.make(exp.id, ino))
			res.Uint32(1) // auth flavors: AUTH_SYS
			res.Uint32(oncrpc.AuthSys)
		}
		return oncrpc.Success
	}
	return oncrpc.ProcUnavail
}

// mnt finds the export of a mount path for the caller and resolves the
// path as the identity the export gives it.
func (g *Gateway) mnt(ctx context.Context, c *oncrpc.Call, p string) (uint32, *export, ids.Ino) {
	switch {
	case len(p) > maxMountPath:
		return mntErrNameLong, nil, 0
	case !strings.HasPrefix(p, "/"):
		return mntErrInval, nil, 0
	}
	p = path.Clean(p) // the export table's paths are clean; meta resolves the same
	e, acc, err := nfsexport.Find(g.exportTable, p, callerOf(c))
	if err != nil {
		g.log.Info("nfs3: mount refused", "remote", c.Remote, "path", p, "err", err)
		return mntErrAcces, nil, 0
	}
	exp := g.exportByID[exportID(e.Path)]
	ctx = sdk.WithWho(ctx, acc.Who)
	// From the export's root, one name at a time: a symbolic link below
	// it could lead out of the export (mountd resolves the path before
	// it looks for its export; here such a mount is refused).
	a, err := g.cl.Stat(ctx, e.Path)
	for _, name := range strings.Split(strings.TrimPrefix(p[len(e.Path):], "/"), "/") {
		if err != nil || name == "" {
			break
		}
		if a.Type != metaapi.TypeDir {
			return mntErrNotdir, nil, 0
		}
		if a, err = g.cl.Lookup(ctx, a.Ino, name); err == nil && a.Type == metaapi.TypeSymlink {
			g.log.Info("nfs3: mount refused: a symbolic link in the path below the export", "remote", c.Remote, "path", p, "export", e.Path)
			return mntErrAcces, nil, 0
		}
	}
	switch st := statusOf(err); st {
	case OK:
	case ErrNoent:
		return mntErrNoent, nil, 0
	case ErrAcces, ErrPerm:
		return mntErrAcces, nil, 0
	case ErrNotdir:
		return mntErrNotdir, nil, 0
	case ErrNametoolong:
		return mntErrNameLong, nil, 0
	case ErrInval:
		return mntErrInval, nil, 0
	default:
		return mntErrIO, nil, 0
	}
	if a.Type != metaapi.TypeDir {
		return mntErrNotdir, nil, 0
	}
	return mntOK, exp, a.Ino
}

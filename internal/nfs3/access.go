package nfs3

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/netip"
	"sync"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// Who may do what: each MOUNT finds its export (nfsexport.Find), and
// each NFS call re-checks its caller against the export its file handle
// names (nfsexport.Export.Admit), so a client that skips MOUNT gets no
// further than one that mounts. A file handle names its export and is
// MACed under the gateway's handle key: a client cannot make the handle
// of a file it has not reached from its export's root by LOOKUP or
// READDIRPLUS, nor move a handle into another export.

// A file handle: the magic, the export's id, the inode number, and a
// MAC of the three. Inode numbers are never reused, so handles stay
// valid across gateway and meta restarts (under the same key), and a
// removed file's handle is stale, never another file's.
var handleMagic = [4]byte{'S', 'L', 'U', '2'}

const (
	handleLen    = 24
	handleMACLen = 8
)

// export is an export and its id in file handles.
type export struct {
	nfsexport.Export
	id uint32
}

// exportID is the id of the export of path p: stable across restarts
// and changes to the export table other than p's own removal.
func exportID(p string) uint32 {
	s := sha256.Sum256([]byte("sluice nfs export\x00" + p))
	return binary.BigEndian.Uint32(s[:4])
}

// handles mints and checks file handles.
type handles struct {
	key  []byte
	macs sync.Pool // hash.Hash: HMAC-SHA256 under key
}

func newHandles(key []byte) (*handles, error) {
	if len(key) == 0 {
		// Handles last as long as this gateway.
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("nfs3: handle key: %w", err)
		}
	}
	h := &handles{key: append([]byte(nil), key...)}
	h.macs.New = func() any { return hmac.New(sha256.New, h.key) }
	return h, nil
}

func (h *handles) mac(b []byte) [handleMACLen]byte {
	m := h.macs.Get().(hash.Hash)
	m.Reset()
	m.Write(b)
	var sum [sha256.Size]byte
	m.Sum(sum[:0])
	h.macs.Put(m)
	return [handleMACLen]byte(sum[:handleMACLen])
}

func (h *handles) make(exp uint32, ino ids.Ino) []byte {
	b := make([]byte, handleLen)
	copy(b, handleMagic[:])
	binary.BigEndian.PutUint32(b[4:], exp)
	binary.BigEndian.PutUint64(b[8:], uint64(ino))
	mac := h.mac(b[:16])
	copy(b[16:], mac[:])
	return b
}

// Handle errors, each answered with its status.
var (
	errBadHandle   = &handleError{ErrBadhandle, "nfs3: malformed file handle"}
	errStaleHandle = &handleError{ErrStale, "nfs3: file handle not issued by this gateway"}
	errNotExported = &handleError{ErrAcces, "nfs3: export not exported to the caller's address"}
	errInsecure    = &handleError{ErrPerm, "nfs3: call from an unprivileged port to a secure export"}
	errReadOnly    = &handleError{ErrRofs, "nfs3: export is read-only to the caller"}
	errOtherExport = &handleError{ErrXdev, "nfs3: file handles of two exports"}
)

type handleError struct {
	st  Status
	msg string
}

func (e *handleError) Error() string { return e.msg }

// handleErrStatus is the status answering a handle argument's error.
func handleErrStatus(err error) Status {
	var he *handleError
	if errors.As(err, &he) {
		return he.st
	}
	return ErrBadhandle
}

// parse checks a handle: errBadHandle if malformed, errStaleHandle if
// its MAC is not this gateway's.
func (h *handles) parse(b []byte) (uint32, ids.Ino, error) {
	if len(b) == 12 && string(b[:4]) == "SLU1" {
		return 0, 0, errStaleHandle // from before exports: the client mounts again
	}
	if len(b) != handleLen || [4]byte(b[:4]) != handleMagic {
		return 0, 0, errBadHandle
	}
	ino := ids.Ino(binary.BigEndian.Uint64(b[8:]))
	if ino == 0 {
		return 0, 0, errBadHandle
	}
	mac := h.mac(b[:16])
	if subtle.ConstantTimeCompare(mac[:], b[16:]) != 1 {
		return 0, 0, errStaleHandle
	}
	return binary.BigEndian.Uint32(b[4:]), ino, nil
}

// access is what one NFS call may do, decided before its procedure runs
// from its first file handle's export (every procedure but NULL begins
// with one).
type access struct {
	exp  *export // nil: the first handle did not check out
	who  metaapi.Who
	rw   bool
	err  error // the export's refusal of the caller, answered by handleArg
	proc uint32
	// The first handle as checked (aliasing the call's arguments), so
	// handleArg does not compute its MAC again.
	first    []byte
	firstIno ids.Ino
}

type accessKey struct{}

func accessOf(ctx context.Context) *access {
	if a, ok := ctx.Value(accessKey{}).(*access); ok {
		return a
	}
	return &access{who: anonymous}
}

// anonymous is the identity of a call no export admitted (it gets no
// further than its handle, but meta is never asked as anyone more).
var anonymous = metaapi.Who{UID: nfsexport.Nobody, GID: nfsexport.Nobody}

// callerOf is the caller as the export table sees it: the peer address
// the transport saw (for RPC over the fabric, the fabric connection's
// peer) and the credential's identity.
func callerOf(c *oncrpc.Call) nfsexport.Caller {
	peer, _ := netip.ParseAddrPort(c.Remote) // unparsable: invalid, admitted nowhere
	nc := nfsexport.Caller{Peer: peer, AuthNone: c.CredFlavor != oncrpc.AuthSys}
	if !nc.AuthNone {
		nc.Who = metaapi.Who{UID: c.Cred.UID, GID: c.Cred.GID, GIDs: c.Cred.GIDs}
	}
	return nc
}

// admitCall decides an NFS call's access from its first file handle
// (read from a copy of args: the procedure reads it again).
func (g *Gateway) admitCall(ctx context.Context, c *oncrpc.Call, args *xdr.Reader) context.Context {
	acc := &access{who: anonymous, proc: c.Proc}
	if c.Proc != ProcNull {
		peek := *args
		if b := readHandle(&peek); peek.Err() == nil {
			if id, ino, err := g.handles.parse(b); err == nil {
				acc.exp = g.exportByID[id]
				acc.first, acc.firstIno = b, ino
			}
		}
	}
	if acc.exp != nil {
		a, err := acc.exp.Admit(callerOf(c))
		if err == nil {
			acc.who, acc.rw = a.Who, a.ReadWrite
		} else {
			acc.err = errNotExported
			if errors.Is(err, nfsexport.ErrInsecurePort) {
				acc.err = errInsecure
			}
			g.log.Debug("nfs3: call refused", "remote", c.Remote, "export", acc.exp.Path, "proc", c.Proc, "err", err)
		}
	}
	return context.WithValue(sdk.WithWho(ctx, acc.who), accessKey{}, acc)
}

// modifies reports whether NFS procedure proc changes the file system
// (refused on a read-only export with NFS3ERR_ROFS).
func modifies(proc uint32) bool {
	switch proc {
	case ProcSetattr, ProcWrite, ProcCreate, ProcMkdir, ProcSymlink, ProcMknod, ProcRemove, ProcRmdir, ProcRename, ProcLink:
		return true
	}
	return false
}

// handleArg decodes a file handle argument and checks it: well formed,
// issued by this gateway, of the call's export, and that export admits
// the caller to do what the procedure does. Its error is an answer
// (handleErrStatus), not garbage; after a decoding error (r.Err()) the
// call is GARBAGE_ARGS and the error is meaningless.
func (g *Gateway) handleArg(ctx context.Context, r *xdr.Reader) (ids.Ino, error) {
	b := readHandle(r)
	if r.Err() != nil {
		return 0, nil
	}
	acc := accessOf(ctx)
	var id uint32
	var ino ids.Ino
	if acc.exp != nil && bytes.Equal(b, acc.first) {
		id, ino = acc.exp.id, acc.firstIno
	} else {
		var err error
		if id, ino, err = g.handles.parse(b); err != nil {
			return 0, err
		}
	}
	switch {
	case acc.exp == nil || g.exportByID[id] == nil:
		return 0, errStaleHandle // an export no longer in the table
	case acc.exp.id != id:
		return 0, errOtherExport
	case acc.err != nil:
		return 0, acc.err
	case !acc.rw && modifies(acc.proc):
		return 0, errReadOnly
	}
	return ino, nil
}

// handle is the file handle of ino in the call's export.
func (g *Gateway) handle(ctx context.Context, ino ids.Ino) []byte {
	var id uint32
	if exp := accessOf(ctx).exp; exp != nil {
		id = exp.id
	}
	return g.handles.make(id, ino)
}

// putPostFH appends a post_op_fh3.
func (g *Gateway) putPostFH(ctx context.Context, w *xdr.Writer, ino ids.Ino) {
	w.Bool(true)
	w.Opaque(g.handle(ctx, ino))
}

// Handle returns the file handle of ino in the export of path p (for
// tests and tools on the gateway's side; clients get handles from MOUNT
// and LOOKUP).
func (g *Gateway) Handle(p string, ino ids.Ino) []byte {
	return g.handles.make(exportID(p), ino)
}

// exportRoot reports whether dir is the root of the call's export, whose
// parent ("..") is itself: no walking out of an export.
func (g *Gateway) exportRoot(ctx context.Context, dir ids.Ino) (bool, error) {
	exp := accessOf(ctx).exp
	if exp == nil || exp.Path == "/" {
		return dir == ids.RootIno, nil
	}
	a, err := g.cl.Stat(ctx, exp.Path)
	if err != nil {
		return false, err
	}
	return a.Ino == dir, nil
}

// may reports whether the call's identity may do want (metaapi.MayRead,
// MayWrite, MayExec) to an object with attributes a: meta's own check on
// its mode bits, applied by the gateway to each READDIR (and READ and
// WRITE, see mayData), as knfsd does, because NFS has no open and the
// SDK's cached capabilities are the gateway's, not the caller's.
func may(ctx context.Context, a *metaapi.Attr, want uint32) bool {
	return a.Allows(accessOf(ctx).who, want)
}

// mayData is may for READ and WRITE of a file's data, which its owner
// may whatever the mode, as knfsd lets it (metaapi.Attr.AllowsData):
// meta checks a write again when it is recorded, by the same rule.
func mayData(ctx context.Context, a *metaapi.Attr, want uint32) bool {
	return a.AllowsData(accessOf(ctx).who, want)
}

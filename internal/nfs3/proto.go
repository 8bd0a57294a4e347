// Package nfs3 is Sluice's NFSv3 gateway (RFC 1813): the NFS and MOUNT
// version 3 programs served over ONC RPC, each procedure mapped onto the
// SDK's inode-level calls and acting as the identity the caller's export
// gives its AUTH_SYS credential (package nfsexport: root squashed by
// default), so meta checks permissions as for the FUSE mount. This file
// holds the protocol's constants and its XDR structures; gateway.go the
// state (open files, directory cookies); access.go file handles and
// who may do what; procs.go and mount.go the procedures.
package nfs3

import (
	"context"
	"errors"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// Program numbers and versions.
const (
	ProgNFS   = 100003
	ProgMount = 100005
	Version   = 3
)

// NFSv3 procedures.
const (
	ProcNull = iota
	ProcGetattr
	ProcSetattr
	ProcLookup
	ProcAccess
	ProcReadlink
	ProcRead
	ProcWrite
	ProcCreate
	ProcMkdir
	ProcSymlink
	ProcMknod
	ProcRemove
	ProcRmdir
	ProcRename
	ProcLink
	ProcReaddir
	ProcReaddirplus
	ProcFsstat
	ProcFsinfo
	ProcPathconf
	ProcCommit
)

// MOUNT v3 procedures.
const (
	MountNull = iota
	MountMnt
	MountDump
	MountUmnt
	MountUmntall
	MountExport
)

// Status is nfsstat3.
type Status uint32

const (
	OK             Status = 0
	ErrPerm        Status = 1
	ErrNoent       Status = 2
	ErrIO          Status = 5
	ErrNxio        Status = 6
	ErrAcces       Status = 13
	ErrExist       Status = 17
	ErrXdev        Status = 18
	ErrNotdir      Status = 20
	ErrIsdir       Status = 21
	ErrInval       Status = 22
	ErrFbig        Status = 27
	ErrNospc       Status = 28
	ErrRofs        Status = 30
	ErrMlink       Status = 31
	ErrNametoolong Status = 63
	ErrNotempty    Status = 66
	ErrStale       Status = 70
	ErrBadhandle   Status = 10001
	ErrBadCookie   Status = 10003
	ErrNotsupp     Status = 10004
	ErrToosmall    Status = 10005
	ErrServerfault Status = 10006
	ErrBadtype     Status = 10007
	ErrJukebox     Status = 10008
)

// ftype3.
const (
	typeReg  = 1
	typeDir  = 2
	typeBlk  = 3
	typeChr  = 4
	typeLnk  = 5
	typeSock = 6
	typeFifo = 7
)

// Write stability (stable_how).
const (
	Unstable = 0
	DataSync = 1
	FileSync = 2
)

// ACCESS3 bits.
const (
	accessRead    = 0x01
	accessLookup  = 0x02
	accessModify  = 0x04
	accessExtend  = 0x08
	accessDelete  = 0x10
	accessExecute = 0x20
)

// Limits the gateway announces and enforces.
const (
	// MaxData bounds READ and WRITE counts (FSINFO rtmax, wtmax).
	MaxData = 1 << 20
	// maxHandle is NFS3_FHSIZE.
	maxHandle = 64
	maxPath   = metaapi.MaxPathLen
	maxName   = metaapi.MaxNameLen
)

// readHandle reads an nfs_fh3.
func readHandle(r *xdr.Reader) []byte { return r.Opaque(maxHandle) }

// fsid is the file system id every attribute carries (one export).
const fsid = 0x5111ce

// putFattr appends a fattr3 for a (with size the gateway knows, which
// may be past meta's while unstable writes wait for COMMIT).
func putFattr(w *xdr.Writer, a *metaapi.Attr) {
	typ, size := uint32(typeReg), uint64(max(a.Size, 0))
	switch a.Type {
	case metaapi.TypeDir:
		typ = typeDir
	case metaapi.TypeSymlink:
		typ, size = typeLnk, uint64(len(a.Target))
	case metaapi.TypeFIFO:
		typ = typeFifo
	case metaapi.TypeSocket:
		typ = typeSock
	case metaapi.TypeBlock:
		typ = typeBlk
	case metaapi.TypeChar:
		typ = typeChr
	}
	w.Uint32(typ)
	w.Uint32(a.Mode & 07777)
	w.Uint32(a.Nlink)
	w.Uint32(a.UID)
	w.Uint32(a.GID)
	w.Uint64(size)
	used := size
	if a.Type == metaapi.TypeFile {
		used = uint64(a.Allocated()) // holes take nothing
	}
	w.Uint64((used + 4095) &^ 4095)    // used
	w.Uint32(metaapi.DevMajor(a.Rdev)) // rdev (specdata3)
	w.Uint32(metaapi.DevMinor(a.Rdev))
	w.Uint64(fsid)
	w.Uint64(uint64(a.Ino))
	putTime(w, a.Atime)
	putTime(w, a.Mtime)
	putTime(w, a.Ctime)
}

func putTime(w *xdr.Writer, ns int64) {
	ns = max(ns, 0) // nfstime3 is unsigned: no time before 1970
	w.Uint32(uint32(ns / 1e9))
	w.Uint32(uint32(ns % 1e9))
}

// putPostOp appends a post_op_attr: the attributes if a is known.
func putPostOp(w *xdr.Writer, a *metaapi.Attr) {
	w.Bool(a != nil)
	if a != nil {
		putFattr(w, a)
	}
}

// putWcc appends wcc_data. The gateway does not hold the pre-operation
// attributes atomically with the change, so it sends none (allowed:
// clients then revalidate), and the post-operation ones if known.
func putWcc(w *xdr.Writer, after *metaapi.Attr) {
	w.Bool(false)
	putPostOp(w, after)
}

// fattrSize and wccAttrSize are the encoded sizes of a fattr3 and a
// wcc_attr.
const (
	fattrSize   = 84
	wccAttrSize = 24
)

// SkipPostOp reads past a post_op_attr (for clients, which take their
// sizes from GETATTR).
func SkipPostOp(r *xdr.Reader) {
	if r.Bool() {
		r.Fixed(fattrSize)
	}
}

// SkipWcc reads past wcc_data.
func SkipWcc(r *xdr.Reader) {
	if r.Bool() {
		r.Fixed(wccAttrSize)
	}
	SkipPostOp(r)
}

// sattr is a decoded sattr3.
type sattr struct {
	mode, uid, gid     *uint32
	size               *uint64
	atime, mtime       *int64 // explicit times (ns)
	atimeNow, mtimeNow bool
}

func readSattr(r *xdr.Reader) sattr {
	var s sattr
	opt32 := func() *uint32 {
		if r.Bool() {
			v := r.Uint32()
			return &v
		}
		return nil
	}
	s.mode, s.uid, s.gid = opt32(), opt32(), opt32()
	if r.Bool() {
		v := r.Uint64()
		s.size = &v
	}
	readTime := func(now *bool) *int64 {
		switch how := r.Uint32(); how {
		case 0: // DONT_CHANGE
		case 1: // SET_TO_SERVER_TIME
			*now = true
		case 2: // SET_TO_CLIENT_TIME
			sec, nsec := r.Uint32(), r.Uint32()
			if nsec >= 1e9 {
				r.Fail(errors.New("nfs3: nanoseconds over a second"))
			}
			v := int64(sec)*1e9 + int64(nsec)
			return &v
		default:
			r.Fail(errors.New("nfs3: bad time_how"))
		}
		return nil
	}
	s.atime = readTime(&s.atimeNow)
	s.mtime = readTime(&s.mtimeNow)
	return s
}

// statusOf maps an SDK error to nfsstat3.
func statusOf(err error) Status {
	if err == nil {
		return OK
	}
	if errors.Is(err, errBadHandle) {
		return ErrBadhandle
	}
	var me *metaapi.Error
	if !errors.As(err, &me) {
		var ne *sdk.NodeError
		if errors.As(err, &ne) || errors.Is(err, context.Canceled) {
			return ErrIO // a storage node failed the data, or the gateway is stopping
		}
		// Meta unreachable past the SDK's retries (restarting, cut off):
		// "try again later", which NFS clients retry, rather than an I/O
		// error a hard mount would hand to the program.
		return ErrJukebox
	}
	switch me.Code {
	case metaapi.ENOENT:
		return ErrNoent
	case metaapi.EEXIST:
		return ErrExist
	case metaapi.ENOTDIR:
		return ErrNotdir
	case metaapi.EISDIR:
		return ErrIsdir
	case metaapi.ENOTEMPTY:
		return ErrNotempty
	case metaapi.EINVAL, metaapi.ELOOP:
		return ErrInval
	case metaapi.ENAMETOOLONG:
		return ErrNametoolong
	case metaapi.EACCES, metaapi.EAUTH:
		return ErrAcces
	case metaapi.EPERM:
		return ErrPerm
	case metaapi.EROFS:
		return ErrRofs
	case metaapi.ENOSPC:
		return ErrNospc
	case metaapi.EXDEV:
		return ErrXdev
	case metaapi.EMLINK:
		return ErrMlink
	case metaapi.EFBIG:
		return ErrFbig
	case metaapi.EAGAIN:
		return ErrJukebox // "try again later": clients retry
	case metaapi.ENOTSUP:
		return ErrNotsupp
	}
	return ErrIO
}

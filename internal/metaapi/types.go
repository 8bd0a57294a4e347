// Package metaapi is the control-plane contract between the meta service
// and its callers (clients, storage nodes, front ends): request and
// response types, error codes, and an HTTP+JSON client.
//
// The control plane is off the data path — one round trip per chunk
// allocation or namespace operation, never per write packet — so it uses
// plain HTTP/1.1 with JSON bodies: debuggable with curl, reconnects by
// itself when meta restarts, and every decoder is the standard library's.
// Every call is a POST to /v1/<Op> with a JSON body; success is 200 with a
// JSON body, failure is a non-200 status with an Error body. File names,
// paths, symlink targets and attribute names are bytes, not text: they
// are ByteStrings, a JSON string when valid UTF-8 and {"base64": ...}
// otherwise.
//
// Clients authenticate with "Authorization: Bearer <id>:<credential>" from
// client.conf; storage nodes with "Authorization: Node <node token>".
package metaapi

import (
	"fmt"
	"strings"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
)

// Code is a POSIX-flavoured error code. Front ends map it to errno.
type Code string

const (
	ENOENT       Code = "ENOENT"       // no such file or directory
	EEXIST       Code = "EEXIST"       // already exists
	ENOTDIR      Code = "ENOTDIR"      // a path component or target is not a directory
	EISDIR       Code = "EISDIR"       // is a directory
	ENOTEMPTY    Code = "ENOTEMPTY"    // directory not empty
	EINVAL       Code = "EINVAL"       // invalid argument (bad name, rename into own subtree, bad policy)
	ENAMETOOLONG Code = "ENAMETOOLONG" // name longer than MaxNameLen or path longer than MaxPathLen
	EACCES       Code = "EACCES"       // permission denied
	EPERM        Code = "EPERM"        // operation not permitted
	ENOSPC       Code = "ENOSPC"       // not enough live nodes or capacity to place data
	EXDEV        Code = "EXDEV"        // cross-device link
	ELOOP        Code = "ELOOP"        // too many symlinks
	EMLINK       Code = "EMLINK"       // too many links
	EFBIG        Code = "EFBIG"        // offset or size beyond MaxFileSize
	EAUTH        Code = "EAUTH"        // missing or invalid credential
	EAGAIN       Code = "EAGAIN"       // retryable: meta busy or starting
	EIO          Code = "EIO"          // internal error
	ENODATA      Code = "ENODATA"      // no such extended attribute
	ENOTSUP      Code = "ENOTSUP"      // not supported (an extended attribute namespace)
	E2BIG        Code = "E2BIG"        // an extended attribute value or list too large
	ERANGE       Code = "ERANGE"       // an extended attribute name empty or too long
	EROFS        Code = "EROFS"        // the caller's principal may only read
	ENOLCK       Code = "ENOLCK"       // too many locks held on one file or by one session
)

// Error is the body of every failed call, and the error type the client
// returns.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Limits enforced by meta.
const (
	MaxNameLen  = 255
	MaxPathLen  = 4096
	MaxFileSize = 1 << 50 // 1 PiB
	// DefaultChunkSize is the chunk size new files get.
	DefaultChunkSize = 64 << 20
	// MaxReaddirLimit bounds one Readdir page.
	MaxReaddirLimit = 4096
	// MaxLayoutChunks bounds the chunks one Layout call returns.
	MaxLayoutChunks = 256
)

// FileType is the kind of an inode.
type FileType string

const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	TypeFIFO    FileType = "fifo"
	// Device nodes and sockets are inodes with no data, as FIFOs: a
	// device's number is kept (Attr.Rdev) and means something only to
	// the kernel of a machine that opens it (mounts are nodev); a
	// socket's endpoint lives in the kernel that bound it.
	TypeBlock  FileType = "block"
	TypeChar   FileType = "char"
	TypeSocket FileType = "socket"
)

// Attr is an inode's attributes. Times are unix nanoseconds.
type Attr struct {
	Ino       ids.Ino    `json:"ino"`
	Type      FileType   `json:"type"`
	Mode      uint32     `json:"mode"` // permission bits only (07777)
	UID       uint32     `json:"uid"`
	GID       uint32     `json:"gid"`
	Size      int64      `json:"size"`
	Nlink     uint32     `json:"nlink"`
	Atime     int64      `json:"atime"`
	Mtime     int64      `json:"mtime"`
	Ctime     int64      `json:"ctime"`
	ChunkSize int64      `json:"chunk_size,omitempty"` // files
	Policy    *Policy    `json:"policy,omitempty"`     // files: the policy fixed at creation
	Target    ByteString `json:"target,omitempty"`     // symlinks
	Rdev      uint64     `json:"rdev,omitempty"`       // devices: the device number (Mkdev)
	// Files: Chunks is how many chunks (stripe groups) exist, counted
	// since the file was created if Counted (files from before are not);
	// ChunkEnd is one past the highest index among them, 0 if there are
	// none or the file's chunks predate the field (see Allocated).
	Chunks   int64 `json:"nchunks,omitempty"`
	ChunkEnd int64 `json:"chunk_end,omitempty"`
	Counted  bool  `json:"counted,omitempty"`
}

// Policy says how a file's data is made redundant: Replicas copies
// written with the plan Strategy (by name in JSON: "ring", "host-tree"
// ...), or (EC set) a Reed-Solomon erasure code.
type Policy struct {
	Replicas int          `json:"replicas,omitempty"`
	Strategy plan.Plan    `json:"strategy,omitzero"`
	EC       *ErasureCode `json:"ec,omitempty"`
}

// Plan is how the policy's chunks are written (an erasure code's units:
// plan.EC; no policy: the default).
func (p *Policy) Plan() plan.Plan {
	switch {
	case p == nil:
		return plan.Default
	case p.EC != nil:
		return plan.Plan{Strategy: plan.EC}
	}
	return p.Strategy
}

func (p Policy) String() string {
	if p.EC != nil {
		return fmt.Sprintf("ec=%s cell=%d", p.EC, p.EC.Cell)
	}
	return fmt.Sprintf("replicas=%d strategy=%s", p.Replicas, p.Strategy)
}

// Units is the number of distinct nodes one chunk of the policy needs.
func (p Policy) Units() int {
	if p.EC != nil {
		return p.EC.Units()
	}
	return p.Replicas
}

// Validate checks a policy on its own (not against the cluster size).
func (p Policy) Validate() error {
	if p.EC != nil {
		if p.Replicas != 0 || !p.Strategy.IsZero() {
			return Errorf(EINVAL, "a policy is either replicated or erasure-coded, not both")
		}
		return p.EC.Validate()
	}
	if p.Replicas < 1 || p.Replicas > 16 {
		return Errorf(EINVAL, "replicas must be between 1 and 16, got %d", p.Replicas)
	}
	if !p.Strategy.Named() {
		return Errorf(EINVAL, "unknown replication strategy %q (known: %s)", p.Strategy, strings.Join(plan.Names(), ", "))
	}
	return nil
}

// Who is the caller's identity for permission checks. The CLI sends the
// process's uid/gid; the FUSE front end sends the calling process's.
type Who struct {
	UID  uint32   `json:"uid"`
	GID  uint32   `json:"gid"`
	GIDs []uint32 `json:"gids,omitempty"`
}

// ---- namespace ----

type ResolveReq struct {
	Path   ByteString `json:"path"`   // absolute, "/"-separated
	Follow bool       `json:"follow"` // follow a symlink in the last component
	// Root is the directory "/" names: set by meta from the caller's
	// principal, never by the caller (not in JSON).
	Root ids.Ino `json:"-"`
}
type AttrResp struct {
	Attr Attr `json:"attr"`
	// Dirs are the directories a create or link changed, as they are
	// after it (a front end can answer for them without asking).
	Dirs []Attr `json:"dirs,omitempty"`
}

// DirsResp answers a remove or rename: the directories it changed, after
// it.
type DirsResp struct {
	Dirs []Attr `json:"dirs,omitempty"`
}

type LookupReq struct {
	Parent ids.Ino    `json:"parent"`
	Name   ByteString `json:"name"`
	Who    Who        `json:"who"` // needs search permission on Parent
	// Root: see ResolveReq ("..": the parent of Root is Root).
	Root ids.Ino `json:"-"`
}
type GetAttrReq struct {
	Ino ids.Ino `json:"ino"`
}

type CreateReq struct {
	Parent    ids.Ino    `json:"parent"`
	Name      ByteString `json:"name"`
	Type      FileType   `json:"type"` // any FileType
	Mode      uint32     `json:"mode"`
	Target    ByteString `json:"target,omitempty"`    // symlink target
	Rdev      uint64     `json:"rdev,omitempty"`      // device number of a block or char device (Mkdev)
	Exclusive bool       `json:"exclusive,omitempty"` // files: EEXIST if present; otherwise an existing file is returned
	// Tmpfile creates a file with no name (open(2) with O_TMPFILE; Name
	// empty), kept like a removed open file until Release, and linkable
	// into place with Link unless Exclusive.
	Tmpfile bool `json:"tmpfile,omitempty"`
	// TempSession marks a new file (Exclusive) as a put's temporary:
	// meta removes it once this lock session, which the writer renews,
	// has lapsed for its grace period; a rename makes it a file like
	// any other.
	TempSession uint64 `json:"temp_session,omitempty"`
	// Open is the access (MayRead, MayWrite) an existing file returned
	// must grant Who: the create is an open(O_CREAT) that found it.
	Open uint32 `json:"open,omitempty"`
	Who  Who    `json:"who"`
}

type LinkReq struct {
	Ino       ids.Ino    `json:"ino"`
	NewParent ids.Ino    `json:"new_parent"`
	NewName   ByteString `json:"new_name"`
	Who       Who        `json:"who"`
}

type RemoveReq struct {
	Parent ids.Ino    `json:"parent"`
	Name   ByteString `json:"name"`
	Dir    bool       `json:"dir"` // rmdir semantics if true, unlink otherwise
	// Keep: the caller holds the file open. If this removes its last
	// name, meta keeps it (nlink 0, readable and writable by inode) as an
	// orphan until the caller's Release, or until the orphan lease lapses
	// unrenewed (a crashed caller).
	Keep bool `json:"keep,omitempty"`
	Who  Who  `json:"who"`
}

// ReleaseReq ends (or, with Renew, extends) the orphan lease on a file
// kept by a Remove or Rename with Keep: released, an orphan is deleted.
// Releasing a file that is not an orphan does nothing.
type ReleaseReq struct {
	Ino   ids.Ino `json:"ino"`
	Renew bool    `json:"renew,omitempty"`
	Who   Who     `json:"who"`
}

// Extended attributes (xattrs). Names are namespaced as on Linux:
// "user." (needs read permission to get, write permission to set, and
// only on files and directories), "trusted." and "security." (set by root
// only; trusted ones are invisible to others). "system." (POSIX ACLs) is
// not supported.
const (
	MaxXattrName  = 255       // bytes, namespace included (XATTR_NAME_MAX)
	MaxXattrValue = 64 << 10  // bytes (XATTR_SIZE_MAX)
	MaxXattrTotal = 256 << 10 // bytes of names and values per inode
	MaxXattrList  = 64 << 10  // bytes of names, each with a NUL, per inode (XATTR_LIST_MAX)
	XattrCreate   = 1         // SetXattr fails with EEXIST if the name exists
	XattrReplace  = 2         // SetXattr fails with ENODATA if it does not
	// XattrCaps (file capabilities) is refused: they mean nothing on a
	// nosuid mount, and so front ends may answer "none" without asking —
	// the kernel asks before every write(2).
	XattrCaps = "security.capability"
)

type SetXattrReq struct {
	Ino   ids.Ino    `json:"ino"`
	Name  ByteString `json:"name"`
	Value []byte     `json:"value"`
	Flags uint32     `json:"flags,omitempty"` // XattrCreate, XattrReplace
	Who   Who        `json:"who"`
}

// XattrReq names one attribute to get or remove.
type XattrReq struct {
	Ino  ids.Ino    `json:"ino"`
	Name ByteString `json:"name"`
	Who  Who        `json:"who"`
}

type XattrResp struct {
	Value []byte `json:"value"`
}

type ListXattrReq struct {
	Ino ids.Ino `json:"ino"`
	Who Who     `json:"who"`
}

type ListXattrResp struct {
	Names []ByteString `json:"names"` // those the caller may see, in name order
}

// File locks (fcntl record locks, OFD locks and flock) are held by an
// owner within a lock session: one mount, which renews the session while
// it holds locks. A session not renewed for the lease meta reports loses
// its locks, so a crashed mount blocks nobody for long; a meta restart
// gives every session a fresh lease instead. POSIX and BSD locks do not
// interact, as on Linux.
const (
	LockUnlock = 0
	LockRead   = 1 // shared
	LockWrite  = 2 // exclusive
	// MaxLocksPerFile and MaxLocksPerSession bound the lock records one
	// file and one session may have (ENOLCK beyond).
	MaxLocksPerFile    = 1024
	MaxLocksPerSession = 1 << 16
)

// LockReq sets the inclusive byte range [Start, End] of file Ino to Type
// for Owner in Session (End = 1<<63-1 reaches the end of the file). A
// range another owner holds in a conflicting way is not waited for: the
// answer names the conflicting lock instead (the caller retries to wait).
// With Test nothing changes; the answer only names a conflict (F_GETLK).
type LockReq struct {
	Ino     ids.Ino `json:"ino"`
	Session uint64  `json:"session"`
	Owner   uint64  `json:"owner"`
	Flock   bool    `json:"flock,omitempty"` // a BSD lock: the whole file
	Type    uint8   `json:"type"`            // LockUnlock, LockRead, LockWrite
	Start   uint64  `json:"start"`
	End     uint64  `json:"end"`
	Pid     uint32  `json:"pid,omitempty"`
	Test    bool    `json:"test,omitempty"`
	Who     Who     `json:"who"`
}

type LockResp struct {
	// Conflict is a lock that kept the request from being granted (or,
	// with Test, would have); nil if it was granted (or would be).
	Conflict *LockInfo `json:"conflict,omitempty"`
	// Held says the owner still holds a lock of this kind on the file.
	Held bool `json:"held,omitempty"`
	// Lost says the session had lapsed before this call: the locks it
	// held were dropped (others may have taken them since).
	Lost bool `json:"lost,omitempty"`
	// Lease is how long the session lives unrenewed, in nanoseconds.
	Lease int64 `json:"lease"`
}

// LockInfo describes a held lock. Pid is that of the process that set
// it, and Session the session holding it (a pid means nothing on
// another machine).
type LockInfo struct {
	Type    uint8  `json:"type"`
	Start   uint64 `json:"start"`
	End     uint64 `json:"end"`
	Pid     uint32 `json:"pid"`
	Session uint64 `json:"session"`
}

// LockSessionReq renews a lock session, or with End drops every lock it
// holds and ends it (a clean unmount).
type LockSessionReq struct {
	Session uint64 `json:"session"`
	End     bool   `json:"end,omitempty"`
}

type LockSessionResp struct {
	Lost  bool  `json:"lost,omitempty"` // see LockResp.Lost
	Lease int64 `json:"lease"`
}

type RenameReq struct {
	OldParent ids.Ino    `json:"old_parent"`
	OldName   ByteString `json:"old_name"`
	NewParent ids.Ino    `json:"new_parent"`
	NewName   ByteString `json:"new_name"`
	NoReplace bool       `json:"no_replace,omitempty"` // EEXIST instead of replacing
	Keep      bool       `json:"keep,omitempty"`       // a replaced file is kept as an orphan (see RemoveReq)
	Who       Who        `json:"who"`
}

type ReaddirReq struct {
	Ino   ids.Ino    `json:"ino"`
	After ByteString `json:"after,omitempty"` // return names strictly after this one
	Limit int        `json:"limit,omitempty"` // default and max MaxReaddirLimit
	Who   Who        `json:"who"`
}
type Dirent struct {
	Name ByteString `json:"name"`
	Ino  ids.Ino    `json:"ino"`
	Type FileType   `json:"type"`
}
type ReaddirResp struct {
	Entries []Dirent `json:"entries"`
	More    bool     `json:"more"` // call again with After = last name
}

// SetAttrReq changes attributes; nil fields are left alone. Size
// truncates or extends (with a hole).
type SetAttrReq struct {
	Ino   ids.Ino `json:"ino"`
	Mode  *uint32 `json:"mode,omitempty"`
	UID   *uint32 `json:"uid,omitempty"`
	GID   *uint32 `json:"gid,omitempty"`
	Size  *int64  `json:"size,omitempty"`
	Atime *int64  `json:"atime,omitempty"`
	Mtime *int64  `json:"mtime,omitempty"`
	// AtimeNow and MtimeNow set the time to meta's clock. Explicit times
	// need ownership; "now" also write permission (as utimes(NULL)).
	AtimeNow bool `json:"atime_now,omitempty"`
	MtimeNow bool `json:"mtime_now,omitempty"`
	// KillSuidgid clears the set-user-ID bit of a non-directory, and its
	// set-group-ID bit if it is group-executable, as a write, truncation
	// or change of owner by an unprivileged process does (Linux's rule;
	// the front end says when: the mount's kernel tells it). Alone it
	// needs what writing the file's data needs.
	KillSuidgid bool `json:"kill_suidgid,omitempty"`
	Who         Who  `json:"who"`
}

type SetPolicyReq struct {
	Ino    ids.Ino `json:"ino"` // a directory
	Policy Policy  `json:"policy"`
	Who    Who     `json:"who"`
}
type GetPolicyReq struct {
	Ino ids.Ino `json:"ino"`
}
type PolicyResp struct {
	Policy Policy  `json:"policy"`
	From   ids.Ino `json:"from"` // the directory it is set on (inherited if != Ino)
}

// ---- data layout ----

// LayoutReq asks for the chunks covering [Off, Off+Len) of a file, with a
// capability for each. With Write, missing chunks are allocated and
// placed on live nodes; without it, absent chunks are simply not listed
// (they read as zeros).
type LayoutReq struct {
	Ino   ids.Ino `json:"ino"`
	Off   int64   `json:"off"`
	Len   int64   `json:"len"`
	Write bool    `json:"write"`
	Who   Who     `json:"who"`
}

// Replica is one storage node holding a copy of a chunk.
type Replica struct {
	Node ids.NodeID `json:"node"`
	Addr string     `json:"addr"` // fabric address, host:port
}

// ChunkLayout places one chunk. The capability covers the whole chunk
// ([0, ChunkSize)) with the rights asked for, is bound to this replica
// set and epoch, and expires at Expiry.
type ChunkLayout struct {
	Index    int64       `json:"index"` // chunk number within the file: file offset / ChunkSize
	Chunk    ids.ChunkID `json:"chunk"`
	Version  uint64      `json:"version"` // last committed version meta knows of
	Replicas []Replica   `json:"replicas"`
	Cap      []byte      `json:"cap"` // encoded capability.Capability (base64 in JSON)
	Expiry   int64       `json:"expiry"`
	// ZeroFrom, when non-zero, is the chunk-relative offset from which
	// the bytes stored on the replicas are stale — left behind by a
	// truncation inside this chunk — and must read as zeros. A writer
	// writing [off, end) into such a chunk with off > ZeroFrom first
	// writes zeros over [ZeroFrom, off), and reports End = end in its
	// Commit; meta then raises ZeroFrom to End (clearing it at the chunk
	// size).
	ZeroFrom int64 `json:"zero_from,omitempty"`
}

type LayoutResp struct {
	Attr   Attr          `json:"attr"`
	Epoch  uint64        `json:"epoch"`
	Chunks []ChunkLayout `json:"chunks"`
	// More is set when the range holds more chunks than one reply may
	// carry (MaxLayoutChunks): ask again from the last Index + 1.
	More bool `json:"more,omitempty"`
}

// CommitReq records a completed write: the file grows to at least Size,
// each listed chunk's committed version becomes at least Version, mtime
// is set.
type CommitReq struct {
	Ino    ids.Ino        `json:"ino"`
	Size   int64          `json:"size"`
	Chunks []ChunkVersion `json:"chunks"`
	Mtime  int64          `json:"mtime"`
	Who    Who            `json:"who"`
}
type ChunkVersion struct {
	Index   int64       `json:"index"`
	Chunk   ids.ChunkID `json:"chunk"`
	Version uint64      `json:"version"`
	// End is the chunk-relative offset just past the bytes this write
	// covered in the chunk (0: not reported). See ChunkLayout.ZeroFrom.
	End int64 `json:"end,omitempty"`
}

// MarkDegradedReq records (Degraded) or clears that an erasure-coded
// file's stripe group Index (chunk Chunk) is degraded: a write left some
// of its units ahead of the others (a unit's node died mid-write, say),
// so it has fewer than M units of redundancy until repaired.
type MarkDegradedReq struct {
	Ino      ids.Ino     `json:"ino"`
	Index    int64       `json:"index"`
	Chunk    ids.ChunkID `json:"chunk"`
	Degraded bool        `json:"degraded"`
	Who      Who         `json:"who"`
}

// DegradedGroup is a stripe group recorded as degraded.
type DegradedGroup struct {
	Ino   ids.Ino     `json:"ino"`
	Index int64       `json:"index"`
	Chunk ids.ChunkID `json:"chunk"`
}

// ListDegradedResp lists degraded stripe groups (at most MaxDegradedList).
type ListDegradedResp struct {
	Groups []DegradedGroup `json:"groups"`
	More   bool            `json:"more,omitempty"`
}

// MaxDegradedList bounds one ListDegraded reply.
const MaxDegradedList = 1024

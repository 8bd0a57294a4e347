// Package fusefs serves a Sluice cluster to the kernel over FUSE, so that
// unmodified programs run on it: it maps each kernel request (by inode
// and name) onto one SDK call, acting as the calling process's uid and
// gids, buffers each open file's sequential writes into large streaming
// writes, and maps Sluice's errors onto errno values.
//
// Consistency is close-to-open: a file's data and size are durable and
// visible to every client when close(2) (or fsync) returns, and an open
// sees everything closed before it. Attributes and directory entries are
// cached by the kernel for short, configurable times. File locks are
// held at meta, so they hold across mounts, and data follows them: a
// lock taken revalidates the file, a lock released sends its writes
// (lock.go).
package fusefs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Options configure a mount.
type Options struct {
	// AttrTimeout and EntryTimeout are how long the kernel may cache
	// attributes and name lookups (default 1s each); NegativeTimeout
	// how long it may remember that a name does not exist (default 0:
	// a file another mount creates is visible at once).
	AttrTimeout, EntryTimeout, NegativeTimeout time.Duration
	// WriteBuffer is how many bytes of one open file's sequential writes
	// are gathered into one streaming write (default 16 MiB). The
	// write-behind of all open files together holds at
	// most bufferFiles times as much; past it, writes go through.
	WriteBuffer int
	// OpTimeout bounds one operation, retries included, before it fails
	// with ETIMEDOUT (default 60s): a mount never wedges on a dead meta.
	OpTimeout time.Duration
	// AllowOther lets users other than the mounting one use the mount
	// (root mounts allow it by default; others need user_allow_other).
	AllowOther bool
	Logger     *slog.Logger
	Debug      bool // log every FUSE request
}

func (o *Options) defaults() {
	if o.AttrTimeout == 0 {
		o.AttrTimeout = time.Second
	}
	if o.EntryTimeout == 0 {
		o.EntryTimeout = time.Second
	}
	if o.NegativeTimeout < 0 {
		o.NegativeTimeout = 0
	}
	if o.WriteBuffer <= 0 {
		o.WriteBuffer = 16 << 20
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = 60 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// FS is one mount's state.
type FS struct {
	cl   *sdk.Client
	opts Options

	mu    sync.Mutex
	files map[ids.Ino]*openFile // regular files open through this mount
	stop  chan struct{}         // closed when the mount ends

	groups groupCache
	dirs   dirAttrs // directories this mount just changed
	locks  *locks

	// bufOpts configure each open file's sdk.Buffered; their Budget
	// bounds the memory of every file's write-behind.
	bufOpts sdk.BufferOptions

	// killWrites holds the cancel channels of WRITEs that drop the
	// file's privileges (see privRaw).
	killWrites sync.Map

	statMu   sync.Mutex
	statAt   time.Time
	statResp metaapi.StatusResp
}

// bufferFiles is how many write buffers' worth of memory the mount's
// open files share (see sdk.Budget).
const bufferFiles = 16

// Server is a running mount.
type Server struct {
	*fuse.Server
	ended chan struct{}
}

// Wait returns once the mount is unmounted and this mount's file locks
// are released at meta.
func (s *Server) Wait() {
	s.Server.Wait()
	<-s.ended
}

// Mount mounts the cluster cl reaches at dir and serves it until Unmount
// (or `sluice umount`). The root's attributes are read first, so that an
// unreachable cluster fails here rather than in the first program.
func Mount(ctx context.Context, cl *sdk.Client, dir string, opts Options) (*Server, error) {
	opts.defaults()
	root, err := cl.Stat(ctx, "/")
	if err != nil {
		return nil, fmt.Errorf("mount: reading the cluster's root: %w", err)
	}
	f := &FS{cl: cl, opts: opts, files: map[ids.Ino]*openFile{}, stop: make(chan struct{}),
		dirs: dirAttrs{ttl: opts.AttrTimeout, now: time.Now}, locks: newLocks()}
	// No read-ahead of the layer's: the kernel reads ahead itself, and
	// reads straight into its buffers are faster than copies out of
	// blocks read ahead (1.0-1.1 GB/s against 0.6-0.75 for cat of
	// 512 MiB on this VM).
	f.bufOpts = sdk.BufferOptions{WriteBuffer: opts.WriteBuffer, ReadAhead: -1, OpTimeout: opts.OpTimeout,
		Budget: sdk.NewBudget(bufferFiles * int64(opts.WriteBuffer)),
		OnLost: func(err error) {
			opts.Logger.Warn("fuse: a buffered write failed (reported at the next write, fsync or close)", "err", err)
		}}
	at, et, nt := opts.AttrTimeout, opts.EntryTimeout, opts.NegativeTimeout
	// nodev and nosuid are said, not left to the mount's defaults: device
	// nodes on the mount are inert (kept as inodes, for backups and image
	// layers, never opened as devices here), and set-user-ID bits grant
	// nothing.
	mo := fuse.MountOptions{
		FsName:        "sluice",
		Name:          "sluice",
		AllowOther:    opts.AllowOther || os.Geteuid() == 0,
		Options:       []string{"default_permissions", "nodev", "nosuid"},
		MaxWrite:      1 << 20,
		MaxReadAhead:  1 << 20,
		MaxBackground: 64,
		DirectMount:   true, // as root, mount(2) itself; otherwise fusermount
		// Our replies are in memory: splicing them through a pipe only
		// fails (1 MiB replies exceed the pipe) and logs each time.
		DisableSplice: true,
		EnableLocks:   true, // held at meta: see lock.go
		// Meta drops set-user-ID bits on unprivileged writes: killpriv.go.
		ExtraCapabilities: killCaps,
		Debug:             opts.Debug,
	}
	raw := fs.NewNodeFS(&node{fsys: f}, &fs.Options{
		MountOptions:    mo,
		AttrTimeout:     &at,
		EntryTimeout:    &et,
		NegativeTimeout: &nt,
		RootStableAttr:  &fs.StableAttr{Ino: uint64(root.Ino), Mode: syscall.S_IFDIR},
		// Mode 0 is a mode (open(2) makes such files; an overlay's
		// whiteout is a char device 0:0 of mode 0): go-fuse would show
		// it as 0644.
		NullPermissions: true,
	})
	server, err := fuse.NewServer(&privRaw{RawFileSystem: &lockRaw{RawFileSystem: raw, l: f.locks}, f: f}, dir, &mo)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	f.widenReadahead(dir)
	go f.renewOrphans()
	go f.renewLocks()
	s := &Server{Server: server, ended: make(chan struct{})}
	go func() {
		server.Wait()
		f.endLocks()
		close(f.stop)
		close(s.ended)
	}()
	return s, nil
}

// ---- identity ----

// call returns the context an operation runs with: the caller's identity
// and the operation timeout.
func (f *FS) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if c, ok := fuse.FromContext(ctx); ok {
		ctx = sdk.WithWho(ctx, metaapi.Who{UID: c.Uid, GID: c.Gid, GIDs: f.groups.of(c.Pid)})
	}
	// The kernel interrupts a request when its process gets a signal —
	// for Go programs, constantly (preemption). An operation half done
	// is worse than one finished late: finish it, within OpTimeout.
	return context.WithTimeout(context.WithoutCancel(ctx), f.opts.OpTimeout)
}

// groupCache remembers processes' supplementary groups for a second:
// reading /proc on every request would cost more than the request.
type groupCache struct {
	mu sync.Mutex
	m  map[uint32]groupsEntry
}

type groupsEntry struct {
	gids []uint32
	at   time.Time
}

func (g *groupCache) of(pid uint32) []uint32 {
	now := time.Now()
	g.mu.Lock()
	e, ok := g.m[pid]
	g.mu.Unlock()
	if ok && now.Sub(e.at) < time.Second {
		return e.gids
	}
	gids := groupsOf(pid)
	g.mu.Lock()
	if g.m == nil || len(g.m) >= 4096 {
		g.m = map[uint32]groupsEntry{} // bounded: start over
	}
	g.m[pid] = groupsEntry{gids, now}
	g.mu.Unlock()
	return gids
}

// widenReadahead raises the kernel's read-ahead for the mount (its bdi's
// read_ahead_kb; FUSE's default is 128 KiB) so that a sequential reader
// keeps several large reads in flight. It needs root; without it the
// default stays, which is slower but correct.
func (f *FS) widenReadahead(dir string) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte("16384"), 0o644); err != nil {
		f.opts.Logger.Debug("fuse: kernel read-ahead left at its default", "err", err)
	}
}

// groupsOf reads a process's supplementary groups (FUSE passes only its
// uid and gid; the kernel's own permission checks use them all, and meta
// must agree). A process that has exited has none.
func groupsOf(pid uint32) []uint32 {
	if pid == 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var out []uint32
		for _, g := range strings.Fields(rest) {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				out = append(out, uint32(n))
			}
		}
		return out
	}
	return nil
}

// ---- errors ----

var codeErrno = map[metaapi.Code]syscall.Errno{
	metaapi.ENOENT:       syscall.ENOENT,
	metaapi.EEXIST:       syscall.EEXIST,
	metaapi.ENOTDIR:      syscall.ENOTDIR,
	metaapi.EISDIR:       syscall.EISDIR,
	metaapi.ENOTEMPTY:    syscall.ENOTEMPTY,
	metaapi.EINVAL:       syscall.EINVAL,
	metaapi.ENAMETOOLONG: syscall.ENAMETOOLONG,
	metaapi.EACCES:       syscall.EACCES,
	metaapi.EPERM:        syscall.EPERM,
	metaapi.ENOSPC:       syscall.ENOSPC,
	metaapi.EXDEV:        syscall.EXDEV,
	metaapi.ELOOP:        syscall.ELOOP,
	metaapi.EMLINK:       syscall.EMLINK,
	metaapi.EFBIG:        syscall.EFBIG,
	metaapi.EAUTH:        syscall.EACCES,
	metaapi.EAGAIN:       syscall.EAGAIN,
	metaapi.EIO:          syscall.EIO,
	metaapi.ENODATA:      syscall.ENODATA,
	metaapi.ENOTSUP:      syscall.EOPNOTSUPP,
	metaapi.E2BIG:        syscall.E2BIG,
	metaapi.ERANGE:       syscall.ERANGE,
	metaapi.EROFS:        syscall.EROFS,
}

// errno maps an SDK error to what the kernel returns to the program,
// logging what is not a plain answer (an I/O failure, a timeout) with its
// full text, which errno cannot carry.
func (f *FS) errno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var me *metaapi.Error
	if errors.As(err, &me) {
		if e, ok := codeErrno[me.Code]; ok {
			if e == syscall.EIO || e == syscall.EAGAIN {
				f.opts.Logger.Warn("fuse: operation failed", "op", op, "err", err)
			}
			return e
		}
	}
	// Anything else — an errno met on the way (a node's connection
	// reset), a node's refusal — is the transport's, not an answer about
	// the file. (Operations are never cancelled, see call.)
	if errors.Is(err, context.DeadlineExceeded) {
		f.opts.Logger.Warn("fuse: operation timed out", "op", op, "err", err)
		return syscall.ETIMEDOUT
	}
	f.opts.Logger.Warn("fuse: operation failed", "op", op, "err", err)
	return syscall.EIO
}

// ---- attributes ----

func typeMode(t metaapi.FileType) uint32 {
	switch t {
	case metaapi.TypeDir:
		return syscall.S_IFDIR
	case metaapi.TypeSymlink:
		return syscall.S_IFLNK
	case metaapi.TypeFIFO:
		return syscall.S_IFIFO
	case metaapi.TypeSocket:
		return syscall.S_IFSOCK
	case metaapi.TypeBlock:
		return syscall.S_IFBLK
	case metaapi.TypeChar:
		return syscall.S_IFCHR
	}
	return syscall.S_IFREG
}

// fileType is the inode type a mknod(2) mode asks for (S_IFREG or none:
// a regular file).
func fileType(mode uint32) (metaapi.FileType, bool) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG, 0:
		return metaapi.TypeFile, true
	case syscall.S_IFIFO:
		return metaapi.TypeFIFO, true
	case syscall.S_IFSOCK:
		return metaapi.TypeSocket, true
	case syscall.S_IFBLK:
		return metaapi.TypeBlock, true
	case syscall.S_IFCHR:
		return metaapi.TypeChar, true
	}
	return "", false
}

// blockSize is the I/O size st_blksize advertises: programs that size
// their buffers by it (cp, many libraries) then write in large requests.
const blockSize = 1 << 20

func fillAttr(a *metaapi.Attr, out *fuse.Attr) {
	out.Ino = uint64(a.Ino)
	out.Mode = typeMode(a.Type) | a.Mode&07777
	out.Size = uint64(a.Size)
	if a.Type == metaapi.TypeSymlink {
		out.Size = uint64(len(a.Target))
	}
	out.Blocks = (out.Size + 511) / 512
	if a.Type == metaapi.TypeFile {
		out.Blocks = (uint64(a.Allocated()) + 511) / 512 // holes take nothing
	}
	out.Nlink = a.Nlink
	// The kernel's 32-bit encoding, which is glibc's for the numbers meta
	// accepts (major < 4096, minor < 2^20).
	out.Rdev = uint32(a.Rdev)
	out.Owner = fuse.Owner{Uid: a.UID, Gid: a.GID}
	out.Blksize = blockSize
	setTime := func(ns int64, sec *uint64, nsec *uint32) {
		*sec, *nsec = uint64(ns/1e9), uint32(ns%1e9)
	}
	setTime(a.Atime, &out.Atime, &out.Atimensec)
	setTime(a.Mtime, &out.Mtime, &out.Mtimensec)
	setTime(a.Ctime, &out.Ctime, &out.Ctimensec)
}

// statfs answers from the cluster's status, cached for a second (df and
// some libraries ask often).
func (f *FS) statfs(ctx context.Context, out *fuse.StatfsOut) error {
	f.statMu.Lock()
	defer f.statMu.Unlock()
	if time.Since(f.statAt) > time.Second {
		st, err := f.cl.Status(ctx)
		if err != nil {
			return err
		}
		f.statResp, f.statAt = st, time.Now()
	}
	capacity, free := f.statResp.Space()
	const bs = 4096
	out.Bsize, out.Frsize = bs, bs
	out.Blocks = uint64(capacity / bs)
	out.Bfree = uint64(min(free, capacity) / bs)
	out.Bavail = out.Bfree
	inodes := uint64(f.statResp.Files + f.statResp.Dirs)
	out.Files = inodes + 1<<32
	out.Ffree = 1 << 32
	out.NameLen = metaapi.MaxNameLen
	return nil
}

package fusefs

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// File locks. The kernel forwards every fcntl, OFD and flock lock on a
// regular file here, and meta holds them, so a lock holds across mounts
// as on one machine. The mount is one lock session at meta, renewed while
// it may hold locks; a mount that dies loses its locks a lease later.
//
// Data follows the locks as NFS does it: taking a lock drops what this
// mount has cached of the file (kernel pages, attributes, layouts, and
// lookups of names beginning with the file's, see revalidate), and
// releasing one first sends what was written under it, so a program that
// locks around its reads and writes (SQLite, say) sees every other
// mount's work.
//
// Locks end as on Linux: POSIX locks when their process closes any
// descriptor of the file (the kernel's FLUSH carries the owner), OFD and
// BSD locks with their open file description (the RELEASE of the handle
// they were taken through).

// offsetMax is the kernel's OFFSET_MAX: a lock "to the end of the file"
// ends there.
const offsetMax = 1<<63 - 1

// locks is the mount's lock session.
type locks struct {
	session uint64
	used    atomic.Bool  // a lock was asked for: renew, and watch closes
	lease   atomic.Int64 // meta's lease, ns
	renewed atomic.Int64 // when meta last renewed the session (unix ns)

	mu sync.Mutex
	// posix: the owners holding POSIX locks on each file, as meta last
	// said: a close by any other owner needs no call to meta.
	posix map[ids.Ino]map[uint64]bool

	// flushOwner carries a FLUSH's lock owner from the raw request to the
	// handle's Flush, keyed by the request's cancel channel (unique while
	// the request runs): go-fuse's node API does not pass it.
	flushOwner sync.Map
}

func newLocks() *locks {
	l := &locks{session: rand.Uint64() | 1, posix: map[ids.Ino]map[uint64]bool{}}
	l.lease.Store(int64(30 * time.Second))
	return l
}

// holds says whether owner holds POSIX locks on ino.
func (l *locks) holds(ino ids.Ino, owner uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.posix[ino][owner]
}

func (l *locks) setHeld(ino ids.Ino, owner uint64, held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.posix[ino]
	switch {
	case held && m == nil:
		l.posix[ino] = map[uint64]bool{owner: true}
	case held:
		m[owner] = true
	case m != nil:
		delete(m, owner)
		if len(m) == 0 {
			delete(l.posix, ino)
		}
	}
}

// Owner use, per handle: how an owner used the handle.
const (
	ownerPOSIX   = 1 << iota // took a POSIX or OFD lock through it
	ownerFlock               // took a BSD lock through it
	ownerFlushed             // closed a descriptor of it: a process, not an OFD
)

// lockRaw passes the lock owner of the kernel's FLUSH to the handle.
type lockRaw struct {
	fuse.RawFileSystem
	l *locks
}

func (r *lockRaw) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if r.l.used.Load() {
		r.l.flushOwner.Store(cancel, in.LockOwner)
		defer r.l.flushOwner.Delete(cancel)
	}
	return r.RawFileSystem.Flush(cancel, in)
}

var (
	_ fs.NodeGetlker  = (*node)(nil)
	_ fs.NodeSetlker  = (*node)(nil)
	_ fs.NodeSetlkwer = (*node)(nil)
)

func lockType(t uint32) (uint8, bool) {
	switch t {
	case syscall.F_RDLCK:
		return metaapi.LockRead, true
	case syscall.F_WRLCK:
		return metaapi.LockWrite, true
	case syscall.F_UNLCK:
		return metaapi.LockUnlock, true
	}
	return 0, false
}

func (n *node) Getlk(ctx context.Context, fh fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	f := n.fsys
	typ, ok := lockType(lk.Typ)
	if !ok {
		return syscall.EINVAL
	}
	f.locks.used.Store(true)
	cctx, cancel := f.call(ctx)
	defer cancel()
	resp, err := f.cl.Lock(cctx, metaapi.LockReq{Ino: n.ino(), Session: f.locks.session, Owner: owner,
		Flock: flags&fuse.LK_FLOCK != 0, Type: typ, Start: lk.Start, End: lk.End, Pid: lk.Pid, Test: true})
	if err != nil {
		return f.errno("getlk", err)
	}
	*out = *lk
	if c := resp.Conflict; c == nil {
		out.Typ = syscall.F_UNLCK
	} else {
		out.Typ = syscall.F_RDLCK
		if c.Type == metaapi.LockWrite {
			out.Typ = syscall.F_WRLCK
		}
		// The kernel refuses ranges past OFFSET_MAX; a pid is only
		// meaningful on this machine.
		out.Start, out.End, out.Pid = min(c.Start, offsetMax), min(c.End, offsetMax), 0
		if c.Session == f.locks.session {
			out.Pid = c.Pid
		}
	}
	return 0
}

func (n *node) Setlk(ctx context.Context, fh fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(ctx, fh, owner, lk, flags, false)
}

func (n *node) Setlkw(ctx context.Context, fh fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return n.setlk(ctx, fh, owner, lk, flags, true)
}

// setlk sets or releases a lock, waiting for a conflicting one to go if
// wait: meta does not queue waiters, so the mount asks again, backing off
// to every 100 ms, until granted or the process is interrupted (the
// kernel restarts the call unless a signal handler says otherwise).
func (n *node) setlk(ctx context.Context, fh fs.FileHandle, owner uint64, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
	f := n.fsys
	typ, ok := lockType(lk.Typ)
	if !ok {
		return syscall.EINVAL
	}
	h, _ := fh.(*handle)
	flock := flags&fuse.LK_FLOCK != 0
	f.locks.used.Store(true)
	var flushErr syscall.Errno
	if typ == metaapi.LockUnlock && h != nil {
		// What was written under the lock goes out before the next
		// holder can read. The lock goes either way.
		flushErr = h.sync(ctx, "unlock")
	}
	req := metaapi.LockReq{Ino: n.ino(), Session: f.locks.session, Owner: owner, Flock: flock,
		Type: typ, Start: lk.Start, End: lk.End, Pid: lk.Pid}
	resp, errno := f.lockAt(ctx, req, wait)
	if errno != 0 {
		return errno
	}
	if !flock {
		f.locks.setHeld(req.Ino, owner, resp.Held)
	}
	if h != nil && typ != metaapi.LockUnlock {
		h.noteOwner(owner, flock)
	}
	if typ != metaapi.LockUnlock {
		n.revalidate(ctx)
	}
	return flushErr
}

// lockAt asks meta for a lock until it is granted (or, unless wait, once).
func (f *FS) lockAt(ctx context.Context, req metaapi.LockReq, wait bool) (metaapi.LockResp, syscall.Errno) {
	backoff := 2 * time.Millisecond
	for {
		cctx, cancel := f.call(ctx)
		resp, err := f.cl.Lock(cctx, req)
		cancel()
		if err != nil {
			return resp, f.errno("lock", err)
		}
		f.locks.renewedNow(resp.Lease)
		if resp.Lost {
			f.lostLocks()
		}
		if resp.Conflict == nil {
			return resp, 0
		}
		if !wait {
			return resp, syscall.EAGAIN
		}
		select {
		case <-ctx.Done():
			return resp, syscall.EINTR
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// revalidate drops what this mount caches of the file, after a lock is
// taken: another mount may have changed it under the lock before.
func (n *node) revalidate(ctx context.Context) {
	f := n.fsys
	ino := n.ino()
	if of := f.file(ino); of != nil {
		cctx, cancel := f.call(ctx)
		of.mu.Lock()
		err := of.flushLocked(cctx)
		if err == nil && of.f != nil {
			var a metaapi.Attr
			if a, err = f.cl.GetAttr(cctx, ino); err == nil {
				of.f.SetAttr(a)
			}
		}
		f.cl.ForgetLayouts(ino)
		of.mu.Unlock()
		cancel()
		if err != nil {
			f.opts.Logger.Warn("fuse: refreshing a file after locking it", "ino", ino, "err", err)
		}
	}
	n.NotifyContent(0, 0) // kernel pages and attributes
	// Programs that lock a file keep companions beside it under names
	// that extend its own (SQLite's "db-journal", "db-wal"), and decide
	// by their existence: the kernel must look those up afresh too.
	if name, dir := n.Parent(); dir != nil {
		for child := range dir.Children() {
			if len(child) > len(name) && strings.HasPrefix(child, name) {
				dir.NotifyEntry(child)
			}
		}
	}
}

// lostLocks reports that meta dropped this mount's locks: it could not
// renew them for a lease (cut off, or meta away longer than that).
func (f *FS) lostLocks() {
	f.locks.mu.Lock()
	n := len(f.locks.posix)
	clear(f.locks.posix)
	f.locks.mu.Unlock()
	if n > 0 {
		f.opts.Logger.Error("fuse: this mount's file locks lapsed at meta; other mounts may have taken them", "files", n)
	}
}

// noteOwner records that owner locked through h.
func (h *handle) noteOwner(owner uint64, flock bool) {
	h.lockMu.Lock()
	defer h.lockMu.Unlock()
	if h.owners == nil {
		h.owners = map[uint64]uint8{}
	}
	if flock {
		h.owners[owner] |= ownerFlock
	} else {
		h.owners[owner] |= ownerPOSIX
	}
}

// unlockOnClose drops, when a descriptor of h is closed, the POSIX locks
// its process holds on the file, however it took them.
func (h *handle) unlockOnClose(ctx context.Context) {
	f := h.of.fsys
	if !f.locks.used.Load() {
		return
	}
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return
	}
	v, ok := f.locks.flushOwner.Load(fc.Cancel)
	if !ok {
		return
	}
	owner := v.(uint64)
	h.lockMu.Lock()
	if h.owners != nil {
		h.owners[owner] |= ownerFlushed
	}
	h.lockMu.Unlock()
	if f.locks.holds(h.of.ino, owner) {
		f.unlockAll(ctx, h.of.ino, owner, false)
	}
}

// unlockAtRelease drops the OFD and BSD locks taken through h, whose open
// file description is gone.
func (h *handle) unlockAtRelease(ctx context.Context) {
	f := h.of.fsys
	h.lockMu.Lock()
	owners := h.owners
	h.owners = nil
	h.lockMu.Unlock()
	for owner, use := range owners {
		if use&ownerFlock != 0 {
			f.unlockAll(ctx, h.of.ino, owner, true)
		}
		if use&(ownerPOSIX|ownerFlushed) == ownerPOSIX && f.locks.holds(h.of.ino, owner) {
			f.unlockAll(ctx, h.of.ino, owner, false)
		}
	}
}

// unlockAll releases every lock of one kind owner holds on ino.
func (f *FS) unlockAll(ctx context.Context, ino ids.Ino, owner uint64, flock bool) {
	cctx, cancel := f.call(ctx)
	defer cancel()
	resp, err := f.cl.Lock(cctx, metaapi.LockReq{Ino: ino, Session: f.locks.session, Owner: owner, Flock: flock,
		Type: metaapi.LockUnlock, Start: 0, End: offsetMax})
	if err != nil {
		// Meta drops them when the session ends or lapses.
		f.opts.Logger.Warn("fuse: releasing the locks of a closed file", "ino", ino, "err", err)
		return
	}
	if !flock {
		f.locks.setHeld(ino, owner, resp.Held)
	}
}

// renewedNow notes that meta renewed the session (every lock call does).
func (l *locks) renewedNow(lease int64) {
	l.lease.Store(lease)
	l.renewed.Store(time.Now().UnixNano())
}

// renewLocks keeps the lock session alive while the mount runs, once it
// has used locks: a third of the lease after meta last renewed it.
func (f *FS) renewLocks() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		lease := time.Duration(f.locks.lease.Load())
		if !f.locks.used.Load() || time.Since(time.Unix(0, f.locks.renewed.Load())) < lease/3 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), lease/3)
		resp, err := f.cl.LockSession(ctx, f.locks.session, false)
		cancel()
		if err != nil {
			f.opts.Logger.Warn("fuse: renewing this mount's lock session", "err", err)
			continue
		}
		f.locks.renewedNow(resp.Lease)
		if resp.Lost {
			f.lostLocks()
		}
	}
}

// endLocks ends the lock session: the mount is gone, so are its locks.
func (f *FS) endLocks() {
	if !f.locks.used.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := f.cl.LockSession(ctx, f.locks.session, true); err != nil {
		f.opts.Logger.Warn("fuse: ending this mount's lock session (its locks lapse with the lease)", "err", err)
	}
}

package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// One-sided operations over shared memory (directAccess for shm links).
//
// The initiator asks the target once per region, on the link's control
// socket, for the region's memory: the target checks the key, the
// connection binding (RegisterFor) and that the region is a whole Alloc
// it may read, and answers with the memory file (read-only unless the
// region allows writes) and its per-connection control page, by
// SCM_RIGHTS; the initiator maps both and from then on copies itself.
//
// Revocation across processes. Each grant (region × connection) has a
// slot in the target's control page for that connection, shared with the
// initiator: a revoked flag and an in-use count. The initiator, per
// operation: increments in-use, loads revoked, copies only if it is 0,
// decrements in-use. Deregister stores revoked, then waits for in-use to
// be 0. All four are sequentially consistent atomics (LOCK-prefixed on
// amd64, on memory shared by both processes), so they have one total
// order: if the initiator's increment comes before the revoked store, the
// owner's later load of in-use sees it and waits for the decrement,
// which follows the copy; if it comes after, the initiator's load of
// revoked (after its increment, so after the store) sees 1 and it does
// not copy. Either way no copy touches the memory once Deregister has
// returned. This holds for peers running this code; a hostile same-host
// peer keeps what it mapped (Alloc says: Free memory once revoked).

// Control page: ctlSlots slots of {revoked, inUse uint32}.
const (
	ctlSlots = 8192
	ctlSize  = ctlSlots * 8
)

// shmCtl is a control page a target made for one connection.
type shmCtl struct {
	mem  []byte
	fd   int          // to hand out; closed when the connection ends
	refs atomic.Int32 // the connection's and one per grant: unmapped at 0
	next int          // next unused slot, under the shmEnd's ownMu (slots are never reused)
}

func newShmCtl() (*shmCtl, error) {
	fd, err := newMemfd("sluice-ctl", ctlSize, true)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, ctlSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mapping control page: %w", err)
	}
	p := &shmCtl{mem: mem, fd: fd}
	p.refs.Store(1)
	return p, nil
}

func (p *shmCtl) unref() {
	if p.refs.Add(-1) == 0 {
		unix.Munmap(p.mem)
	}
}

// ctlSlot returns the revoked flag and in-use count of slot i of a
// control page's memory.
func ctlSlot(mem []byte, i int) (revoked, inUse *uint32) {
	return (*uint32)(unsafe.Pointer(&mem[8*i])), (*uint32)(unsafe.Pointer(&mem[8*i+4]))
}

// shmGrant is a region handed to a connection's peer.
type shmGrant struct {
	ctl  *shmCtl
	slot int
	conn *Conn
}

// revokeGrants sets the grants' revoked flags (under the region's mu).
func revokeGrants(gs []shmGrant) {
	for _, g := range gs {
		revoked, _ := ctlSlot(g.ctl.mem, g.slot)
		atomic.StoreUint32(revoked, 1)
	}
}

// granted reports whether r was handed to any peer.
func (r *Region) granted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.grants) > 0
}

// grantedTo returns the slot of r's grant to connection c, if it has one.
func (r *Region) grantedTo(c *Conn) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.grants {
		if g.conn == c {
			return g.slot, true
		}
	}
	return 0, false
}

// whileLive runs f under r's lock unless r is revoked.
func (r *Region) whileLive(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return false
	}
	f()
	return true
}

// grantWith records g for r and runs f, unless r is revoked.
func (r *Region) grantWith(g shmGrant, f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return false
	}
	f()
	r.grants = append(r.grants, g)
	return true
}

// errHeld fails a connection whose peer stays inside a copy of a region
// being deregistered.
var errHeld = errors.New("fabric: peer held a revoked shared region too long")

// releaseGrants waits until no peer granted r (revoked) is inside a copy,
// then lets go of its shared memory. A peer whose connection is live
// gets WriteTimeout (as a stalled READ response on TCP), then its
// connection is failed; once it has ended, a copy begun before (at most
// a region's length of memcpy) gets a second more.
func (e *Endpoint) releaseGrants(r *Region) {
	r.mu.Lock()
	gs := r.grants
	r.grants = nil
	memDone := r.memDone
	r.memDone = true
	r.mu.Unlock()
	// One deadline for them all, and a connection's grace once closed
	// shared by its grants: a peer holding many grants cannot multiply
	// the wait.
	held := time.Now().Add(e.opts.WriteTimeout)
	closedAt := map[*Conn]time.Time{}
	for _, g := range gs {
		_, inUse := ctlSlot(g.ctl.mem, g.slot)
		for d := time.Microsecond; atomic.LoadUint32(inUse) != 0; d = min(2*d, time.Millisecond) {
			now := time.Now()
			at, closed := closedAt[g.conn]
			if !closed && g.conn.Err() == nil && now.After(held) {
				g.conn.CloseWithError(errHeld)
			}
			if !closed && g.conn.Err() != nil {
				closedAt[g.conn], at, closed = now, now, true
			}
			if closed && now.Sub(at) > time.Second {
				e.opts.Logger.Warn("fabric: a closed peer still holds a revoked shared region", "peer", g.conn.RemoteAddr())
				break
			}
			time.Sleep(d)
		}
		g.ctl.unref()
	}
	if r.mem != nil && !memDone {
		e.mems.unregistered(r.mem)
	}
}

// Control exchange on a link's control sockets.
const (
	grantReqSize  = 16 // magic, 0, key
	grantRespSize = 16 // status, perm, 0, slot, length
	grantOK       = 0
	grantNone     = 1 // no such region for this connection: ErrNoRegion
	grantPackets  = 2 // not in shared memory: use packets
)

var grantMagic = [4]byte{'S', 'L', 'G', 1}

// shmEnd is one end of a shared-memory link: the initiator of one-sided
// operations on the peer's regions, and the grantor of its own.
type shmEnd struct {
	opts  *Options
	conn  *Conn
	reqMu sync.Mutex    // one request at a time on req
	req   *net.UnixConn // our grant requests out, the peer's answers in
	srv   *net.UnixConn // the peer's grant requests in
	stop  sync.Once

	ownMu     sync.Mutex
	own       *shmCtl // our control page for this connection (on first grant)
	ownClosed bool

	mu     sync.RWMutex // maps and ctl; held (read) across a copy
	closed bool
	maps   map[uint64]*shmMap
	ctl    []byte // the peer's control page, mapped
}

// shmMap is a peer's region as mapped here.
type shmMap struct {
	mem            []byte // page-rounded; nil: the region goes by packets
	n              uint64
	perm           Perm
	revoked, inUse *uint32
}

func newShmEnd(opts *Options, req, srv *net.UnixConn) *shmEnd {
	return &shmEnd{opts: opts, req: req, srv: srv, maps: make(map[uint64]*shmMap)}
}

func (s *shmEnd) bind(c *Conn) {
	s.conn = c
	go s.serve()
	go func() {
		<-c.Done()
		s.close()
	}()
}

// abort closes a link whose hello failed (no Conn was made).
func (s *shmEnd) abort() { s.close() }

func (s *shmEnd) close() {
	s.stop.Do(func() {
		s.req.Close()
		s.srv.Close()
		s.mu.Lock()
		s.closed = true
		for _, m := range s.maps {
			if m.mem != nil {
				unix.Munmap(m.mem)
			}
		}
		s.maps = nil
		if s.ctl != nil {
			unix.Munmap(s.ctl)
			s.ctl = nil
		}
		s.mu.Unlock()
		s.ownMu.Lock()
		s.ownClosed = true
		if s.own != nil {
			unix.Close(s.own.fd)
			s.own.unref()
		}
		s.ownMu.Unlock()
	})
}

func (s *shmEnd) readRegion(ctx context.Context, key, off uint64, dst []byte) error {
	return s.copyRegion(ctx, key, off, dst, RemoteRead)
}

func (s *shmEnd) writeRegion(ctx context.Context, key, off uint64, src []byte) error {
	return s.copyRegion(ctx, key, off, src, RemoteWrite)
}

// copyRegion performs a one-sided operation by copying, with the checks
// the target would make: permission, bounds, revocation.
func (s *shmEnd) copyRegion(ctx context.Context, key, off uint64, b []byte, perm Perm) error {
	if key&keyShared == 0 {
		return errNotDirect // not in shared memory (region.go)
	}
	for {
		s.mu.RLock()
		if s.closed {
			s.mu.RUnlock()
			return ErrClosed
		}
		if m := s.maps[key]; m != nil {
			err := m.copy(off, b, perm)
			s.mu.RUnlock()
			return err
		}
		s.mu.RUnlock()
		if err := s.fetch(ctx, key); err != nil {
			return err
		}
	}
}

func (m *shmMap) copy(off uint64, b []byte, perm Perm) error {
	if m.mem == nil {
		return errNotDirect
	}
	if m.perm&perm != perm {
		return ErrPerm
	}
	end := off + uint64(len(b))
	if end < off || end > m.n {
		return fmt.Errorf("%w: [%d,+%d) of %d bytes", ErrBounds, off, len(b), m.n)
	}
	atomic.AddUint32(m.inUse, 1)
	if atomic.LoadUint32(m.revoked) != 0 {
		atomic.AddUint32(m.inUse, ^uint32(0))
		return fmt.Errorf("%w (revoked)", ErrNoRegion)
	}
	if perm == RemoteRead {
		copy(b, m.mem[off:end])
	} else {
		copy(m.mem[off:end], b)
	}
	atomic.AddUint32(m.inUse, ^uint32(0))
	return nil
}

// fetch asks the peer for region key and maps it.
func (s *shmEnd) fetch(ctx context.Context, key uint64) error {
	s.reqMu.Lock()
	defer s.reqMu.Unlock()
	s.mu.RLock()
	_, have := s.maps[key]
	s.mu.RUnlock()
	if have {
		return nil
	}
	deadline := time.Now().Add(s.opts.HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	s.req.SetDeadline(deadline)
	var q [grantReqSize]byte
	copy(q[:], grantMagic[:])
	binary.LittleEndian.PutUint64(q[8:], key)
	if _, err := s.req.Write(q[:]); err != nil {
		return fmt.Errorf("asking for shared region: %w", err)
	}
	var a [grantRespSize]byte
	fds, err := recvWithFds(s.req, a[:], 2)
	if err != nil {
		return fmt.Errorf("receiving shared region: %w", err)
	}
	defer closeFds(fds)
	m := &shmMap{}
	switch a[0] {
	case grantNone, grantPackets:
		if len(fds) != 0 {
			return fmt.Errorf("%w: %d descriptors with a refusal", ErrProtocol, len(fds))
		}
		if a[0] == grantNone {
			return fmt.Errorf("%w %#x", ErrNoRegion, key)
		}
	case grantOK:
		if len(fds) != 2 {
			return fmt.Errorf("%w: %d descriptors with a shared region, want 2", ErrProtocol, len(fds))
		}
		m.perm = Perm(a[1])
		slot := int(binary.LittleEndian.Uint32(a[4:]))
		m.n = binary.LittleEndian.Uint64(a[8:])
		if m.perm&RemoteRead == 0 || m.perm&^(RemoteRead|RemoteWrite) != 0 || slot >= ctlSlots || m.n == 0 || m.n > 1<<40 {
			return fmt.Errorf("%w: bad shared region grant", ErrProtocol)
		}
		prot := unix.PROT_READ
		if m.perm&RemoteWrite != 0 {
			prot |= unix.PROT_WRITE
		}
		if m.mem, err = mapMemfd(fds[0], int(m.n), prot); err != nil {
			return err
		}
		ctl, err := s.setCtl(fds[1])
		if err != nil {
			unix.Munmap(m.mem)
			return err
		}
		// (If the link closes now, ctl is unmapped but m is never used.)
		m.revoked, m.inUse = ctlSlot(ctl, slot)
	default:
		return fmt.Errorf("%w: shared region answer %d", ErrProtocol, a[0])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if m.mem != nil {
			unix.Munmap(m.mem)
		}
		return ErrClosed
	}
	// Revoked regions stay revoked (slots are not reused): their
	// mappings go now rather than when the connection ends.
	for k, old := range s.maps {
		if old.mem != nil && atomic.LoadUint32(old.revoked) != 0 && atomic.LoadUint32(old.inUse) == 0 {
			unix.Munmap(old.mem)
			delete(s.maps, k)
		}
	}
	s.maps[key] = m
	return nil
}

// setCtl maps the peer's control page on its first grant, and returns
// it.
func (s *shmEnd) setCtl(fd int) ([]byte, error) {
	s.mu.RLock()
	ctl, closed := s.ctl, s.closed
	s.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if ctl != nil {
		return ctl, nil
	}
	ctl, err := mapMemfd(fd, ctlSize, unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		unix.Munmap(ctl)
		return nil, ErrClosed
	}
	s.ctl = ctl
	return ctl, nil
}

// serve answers the peer's grant requests until the link closes. Any
// descriptor the peer sends is discarded by the kernel (plain reads); a
// malformed request fails the connection.
func (s *shmEnd) serve() {
	var q [grantReqSize]byte
	for {
		if _, err := io.ReadFull(s.srv, q[:]); err != nil {
			if err != io.EOF && !errors.Is(err, net.ErrClosed) {
				s.conn.CloseWithError(fmt.Errorf("fabric: shared-memory control: %w", err))
			}
			return
		}
		if [4]byte(q[:4]) != grantMagic || binary.LittleEndian.Uint32(q[4:]) != 0 {
			s.conn.CloseWithError(fmt.Errorf("%w: bad shared-memory request % x", ErrProtocol, q[:8]))
			return
		}
		a, fds := s.grant(binary.LittleEndian.Uint64(q[8:]))
		_, _, err := s.srv.WriteMsgUnix(a[:], unix.UnixRights(fds...), nil)
		closeFds(fds) // dups
		if err != nil {
			s.conn.CloseWithError(fmt.Errorf("fabric: shared-memory control: %w", err))
			return
		}
	}
}

// grant decides a request for region key: the answer, and the
// descriptors to pass (dups of the memory file and the control page's).
func (s *shmEnd) grant(key uint64) (a [grantRespSize]byte, fds []int) {
	a[0] = grantNone
	r := s.conn.ep.regions.lookup(s.conn, key)
	if r == nil {
		return a, nil
	}
	a[0] = grantPackets
	if r.mem == nil || r.perm&RemoteRead == 0 {
		return a, nil
	}
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.ownClosed {
		return a, nil
	}
	if s.own == nil {
		ctl, err := newShmCtl()
		if err != nil {
			s.opts.Logger.Warn("fabric: no control page for shared memory", "err", err)
			return a, nil
		}
		s.own = ctl
	}
	if s.own.next == ctlSlots {
		return a, nil // out of slots for this connection: packets
	}
	// A region already granted on this connection keeps its slot: a
	// peer asking again and again gets no more slots to hold.
	if slot, ok := r.grantedTo(s.conn); ok {
		var dup int
		if !r.whileLive(func() { dup = s.conn.ep.mems.dup(r.mem, r.perm&RemoteWrite != 0) }) {
			a[0] = grantNone
			return a, nil
		}
		ctl, err := unix.FcntlInt(uintptr(s.own.fd), unix.F_DUPFD_CLOEXEC, 0)
		if dup < 0 || err != nil {
			closeFds([]int{dup, ctl})
			return a, nil
		}
		a[0], a[1] = grantOK, byte(r.perm)
		binary.LittleEndian.PutUint32(a[4:], uint32(slot))
		binary.LittleEndian.PutUint64(a[8:], uint64(len(r.buf)))
		return a, []int{dup, ctl}
	}
	g := shmGrant{ctl: s.own, slot: s.own.next, conn: s.conn}
	s.own.refs.Add(1)
	// The memory file is dup'ed while the region is live (grant holds
	// its mu), so Free cannot close it under us.
	var dup int
	ok := r.grantWith(g, func() { dup = s.conn.ep.mems.dup(r.mem, r.perm&RemoteWrite != 0) })
	if !ok {
		s.own.refs.Add(-1)
		a[0] = grantNone
		return a, nil
	}
	s.own.next++
	ctl, err := unix.FcntlInt(uintptr(s.own.fd), unix.F_DUPFD_CLOEXEC, 0)
	if dup < 0 || err != nil {
		closeFds([]int{dup, ctl}) // (-1 is ignored)
		return a, nil             // the grant stays (revocation waits on an idle slot)
	}
	a[0], a[1] = grantOK, byte(r.perm)
	binary.LittleEndian.PutUint32(a[4:], uint32(g.slot))
	binary.LittleEndian.PutUint64(a[8:], uint64(len(r.buf)))
	return a, []int{dup, ctl}
}

// recvWithFds reads exactly len(b) bytes, taking the descriptors (at
// most max) that come with them. More than max fails.
func recvWithFds(uc *net.UnixConn, b []byte, max int) ([]int, error) {
	oob := make([]byte, unix.CmsgSpace(4*(max+1)))
	n, oobn, flags, _, err := uc.ReadMsgUnix(b, oob)
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
		if perr != nil && err == nil {
			err = perr
		}
	}
	if err == nil && (flags&unix.MSG_CTRUNC != 0 || len(fds) > max) {
		err = fmt.Errorf("%w: too many descriptors", ErrProtocol)
	}
	if err == nil && n < len(b) {
		_, err = io.ReadFull(uc, b[n:])
	}
	if err != nil {
		closeFds(fds)
		return nil, err
	}
	return fds, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

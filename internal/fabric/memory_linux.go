package fabric

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared memory a same-host peer can map (the shared-memory backend,
// transport_shm.go). Alloc returns the bytes of an anonymous memory file
// (memfd_create) mapped MAP_SHARED; registering exactly those bytes makes
// the region reachable by a peer over shared memory: the peer is handed
// the file (read-only if the region is), maps it and copies itself. The
// unit handed out is the whole allocation, so only a region that is an
// entire allocation is handed out (a sub-slice, or heap memory, is served
// by packets as over TCP): a peer that bypasses the fabric's own checks
// can reach no byte outside the region.

// shmMem is one allocation.
type shmMem struct {
	buf  []byte // the caller's bytes: len as asked, the mapping page-rounded
	fd   int    // the memory file, read-write
	rofd int    // the same file opened read-only, for read-only grants
	regs int    // live regions registered on it, under shmMems.mu
}

// shmMems is an endpoint's allocations, by address of their first byte.
type shmMems struct {
	mu sync.Mutex
	m  map[*byte]*shmMem
}

// memfdSeals are set on every memory file handed to a peer: it cannot
// shrink (a peer's access past the end would fault, SIGBUS) nor be
// resealed; the initiator checks them before it maps a file.
const memfdSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

// newMemfd creates a memory file of n bytes (a page multiple), sealed
// unless the caller seals it (seal false: it must then add memfdSeals).
func newMemfd(name string, n int, seal bool) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sizing memory file: %w", err)
	}
	if !seal {
		return fd, nil
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, memfdSeals); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sealing memory file: %w", err)
	}
	return fd, nil
}

// reopenRO opens the file of fd again, read-only: a peer given it can map
// it PROT_READ only.
func reopenRO(fd int) (int, error) {
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("reopening memory file read-only: %w", err)
	}
	return ro, nil
}

// mapMemfd maps at least n bytes of a memory file a peer handed over,
// after checking it is one (sealed against shrinking) and large enough.
func mapMemfd(fd int, n int, prot int) ([]byte, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("%w: peer's memory file is not sealed against shrinking", ErrProtocol)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("inspecting peer's memory file: %w", err)
	}
	if n <= 0 || st.Size < int64(n) {
		return nil, fmt.Errorf("%w: peer's memory file has %d bytes, region %d", ErrProtocol, st.Size, n)
	}
	mem, err := unix.Mmap(fd, 0, pageRound(n), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping peer's memory file: %w", err)
	}
	return mem, nil
}

func pageRound(n int) int {
	p := unix.Getpagesize()
	return (n + p - 1) / p * p
}

// Alloc returns n bytes of shared memory (zeroed). Registered whole
// (Register or RegisterFor of exactly these bytes), the region is reached
// by a shared-memory peer directly: its one-sided operations are copies
// by that peer, with no work by this endpoint. Any transport serves it.
// Free it once deregistered (Close closes its file, not its mapping).
//
// A peer holding a mapping keeps it after Deregister (the fabric's own
// code no longer touches it: see Deregister), so memory once handed to a
// peer must not be reused for data that peer may not see: Free it.
func (e *Endpoint) Alloc(n int) ([]byte, error) { return e.alloc(n, false) }

// AllocReadOnly is Alloc of memory peers may only ever read: the file is
// also sealed against writes by anyone but this mapping
// (F_SEAL_FUTURE_WRITE), so a peer given it read-only cannot reopen it
// writable (/proc/self/fd) and change what others are served. Register it
// RemoteRead only.
func (e *Endpoint) AllocReadOnly(n int) ([]byte, error) { return e.alloc(n, true) }

func (e *Endpoint) alloc(n int, readOnly bool) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("fabric: allocating %d bytes of shared memory", n)
	}
	fd, err := newMemfd("sluice-region", pageRound(n), !readOnly)
	if err != nil {
		return nil, fmt.Errorf("fabric: allocating shared memory: %w", err)
	}
	ro, err := reopenRO(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fabric: allocating shared memory: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, pageRound(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		unix.Close(ro)
		return nil, fmt.Errorf("fabric: mapping shared memory: %w", err)
	}
	if readOnly {
		// After this mapping: it stays writable, no other can be.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE|memfdSeals); err != nil {
			unix.Munmap(mem)
			unix.Close(fd)
			unix.Close(ro)
			return nil, fmt.Errorf("fabric: sealing shared memory read-only: %w", err)
		}
	}
	m := &shmMem{buf: mem[:n], fd: fd, rofd: ro}
	e.mems.mu.Lock()
	if e.mems.m == nil {
		e.mems.m = make(map[*byte]*shmMem)
	}
	e.mems.m[&mem[0]] = m
	e.mems.mu.Unlock()
	return m.buf, nil
}

// ErrRegistered is returned by Free for memory still registered.
var ErrRegistered = errors.New("fabric: shared memory still registered")

// Free unmaps memory Alloc returned. It must not be registered any more
// (after Deregister, or in Release's idle callback).
func (e *Endpoint) Free(buf []byte) error {
	if len(buf) == 0 {
		return errors.New("fabric: freeing empty shared memory")
	}
	e.mems.mu.Lock()
	m := e.mems.m[&buf[0]]
	switch {
	case m == nil:
		e.mems.mu.Unlock()
		return errors.New("fabric: freeing memory Alloc did not return")
	case m.regs > 0:
		e.mems.mu.Unlock()
		return ErrRegistered
	}
	delete(e.mems.m, &buf[0])
	if m.fd >= 0 {
		unix.Close(m.fd)
		unix.Close(m.rofd)
	}
	e.mems.mu.Unlock()
	if err := unix.Munmap(m.buf[:cap(m.buf)]); err != nil {
		return fmt.Errorf("fabric: unmapping shared memory: %w", err)
	}
	return nil
}

// closeFiles closes the memory files of every allocation (the endpoint
// is closed: nothing more is handed out); the mappings stay until Free.
func (t *shmMems) closeFiles() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range t.m {
		if m.fd >= 0 {
			unix.Close(m.fd)
			unix.Close(m.rofd)
			m.fd, m.rofd = -1, -1
		}
	}
}

// dup duplicates m's file (read-only unless rw) for a peer; -1 if the
// file is closed.
func (t *shmMems) dup(m *shmMem, rw bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	fd := m.rofd
	if rw {
		fd = m.fd
	}
	if fd < 0 {
		return -1
	}
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return d
}

// lookup returns the allocation buf is, whole, counting a registration
// on it; nil if buf is not exactly an allocation.
func (t *shmMems) lookup(buf []byte) *shmMem {
	if len(buf) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.m[unsafe.SliceData(buf)]
	if m == nil || len(buf) != len(m.buf) {
		return nil
	}
	m.regs++
	return m
}

// unregistered ends a registration counted by lookup.
func (t *shmMems) unregistered(m *shmMem) {
	t.mu.Lock()
	m.regs--
	t.mu.Unlock()
}

package meta

import (
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

const toEOF = 1<<63 - 1

// lk is a shorthand lock request.
func lk(ino ids.Ino, session, owner uint64, typ uint8, start, end uint64) metaapi.LockReq {
	return metaapi.LockReq{Ino: ino, Session: session, Owner: owner, Type: typ, Start: start, End: end, Pid: uint32(owner), Who: root}
}

func (f *fixture) lock(req metaapi.LockReq) metaapi.LockResp {
	f.t.Helper()
	r, err := f.s.Lock(1, req)
	if err != nil {
		f.t.Fatalf("lock %+v: %v", req, err)
	}
	return r
}

func (f *fixture) wantGranted(req metaapi.LockReq) metaapi.LockResp {
	f.t.Helper()
	r := f.lock(req)
	if r.Conflict != nil {
		f.t.Fatalf("lock %+v refused: conflicts with %+v", req, *r.Conflict)
	}
	return r
}

func (f *fixture) wantConflict(req metaapi.LockReq, session uint64, start, end uint64) {
	f.t.Helper()
	r := f.lock(req)
	if r.Conflict == nil {
		f.t.Fatalf("lock %+v granted, want a conflict with session %d's %d-%d", req, session, start, end)
	}
	if c := *r.Conflict; c.Session != session || c.Start != start || c.End != end {
		f.t.Fatalf("lock %+v conflicts with %+v, want session %d's %d-%d", req, c, session, start, end)
	}
}

func TestLockConflictsAcrossSessionsAndOwners(t *testing.T) {
	f := newFixture(t)
	f.tree("/f", "/g")
	ino := f.ino("/f")

	f.wantGranted(lk(ino, 1, 10, metaapi.LockWrite, 0, 99))
	// Another owner of the same session (another process on the mount)
	// and another session conflict alike.
	f.wantConflict(lk(ino, 1, 11, metaapi.LockRead, 50, 50), 1, 0, 99)
	f.wantConflict(lk(ino, 2, 10, metaapi.LockWrite, 99, toEOF), 1, 0, 99)
	f.wantGranted(lk(ino, 2, 10, metaapi.LockWrite, 100, toEOF))
	// Other files and BSD locks are independent.
	f.wantGranted(lk(f.ino("/g"), 2, 10, metaapi.LockWrite, 0, toEOF))
	fl := lk(ino, 2, 77, metaapi.LockWrite, 0, 0)
	fl.Flock = true
	f.wantGranted(fl)
	fl.Owner = 78
	f.wantConflict(fl, 2, 0, toEOF) // a BSD lock covers the whole file

	// Shared locks share; converting to exclusive waits for the others.
	f.wantGranted(lk(ino, 1, 10, metaapi.LockRead, 0, 99))
	f.wantGranted(lk(ino, 3, 5, metaapi.LockRead, 10, 20))
	f.wantConflict(lk(ino, 1, 10, metaapi.LockWrite, 0, 99), 3, 10, 20)

	// Test changes nothing and reports the same conflict.
	test := lk(ino, 1, 10, metaapi.LockWrite, 0, 99)
	test.Test = true
	if r := f.lock(test); r.Conflict == nil || r.Conflict.Session != 3 || r.Conflict.Pid != 5 || r.Conflict.Type != metaapi.LockRead {
		t.Fatalf("test: %+v", r.Conflict)
	}
	// Unlocking part of a range splits it: the rest still conflicts.
	r := f.wantGranted(lk(ino, 3, 5, metaapi.LockUnlock, 10, 15))
	if !r.Held {
		t.Fatal("owner holding 16-20 reported holding nothing")
	}
	f.wantConflict(lk(ino, 1, 10, metaapi.LockWrite, 0, 99), 3, 16, 20)
	if r := f.wantGranted(lk(ino, 3, 5, metaapi.LockUnlock, 0, toEOF)); r.Held {
		t.Fatal("owner reported holding locks after unlocking everything")
	}
	f.wantGranted(lk(ino, 1, 10, metaapi.LockWrite, 0, 99))
}

func TestLockBadRequests(t *testing.T) {
	f := newFixture(t)
	f.tree("/f", "/d/")
	ino := f.ino("/f")
	for _, c := range []struct {
		req  metaapi.LockReq
		code metaapi.Code
	}{
		{lk(ino, 0, 1, metaapi.LockRead, 0, 1), metaapi.EINVAL},
		{lk(ino, 1, 1, 3, 0, 1), metaapi.EINVAL},
		{lk(ino, 1, 1, metaapi.LockRead, 5, 4), metaapi.EINVAL},
		{lk(999, 1, 1, metaapi.LockRead, 0, 1), metaapi.ENOENT},
	} {
		_, err := f.s.Lock(1, c.req)
		wantCode(t, err, c.code)
	}
	// Who may neither read nor write a file may not lock it.
	f.mk("/", "private", metaapi.TypeFile, 0o600, root)
	req := lk(f.ino("/private"), 1, 1, metaapi.LockRead, 0, 1)
	req.Who = bob
	_, err := f.s.Lock(1, req)
	wantCode(t, err, metaapi.EACCES)
	req.Who = root
	f.wantGranted(req)
	// A session belongs to the client that opened it.
	_, err = f.s.Lock(2, lk(ino, 1, 1, metaapi.LockRead, 0, 1))
	wantCode(t, err, metaapi.EPERM)
	_, err = f.s.LockSession(2, metaapi.LockSessionReq{Session: 1, End: true})
	wantCode(t, err, metaapi.EPERM)
	_, err = f.s.LockSession(1, metaapi.LockSessionReq{})
	wantCode(t, err, metaapi.EINVAL)
}

func TestLockLimits(t *testing.T) {
	f := newFixture(t)
	f.tree("/f")
	ino := f.ino("/f")
	// Every other byte: nothing merges.
	for i := 0; i < metaapi.MaxLocksPerFile; i++ {
		f.wantGranted(lk(ino, 1, 1, metaapi.LockWrite, uint64(2*i), uint64(2*i)))
	}
	_, err := f.s.Lock(1, lk(ino, 1, 1, metaapi.LockWrite, 1<<40, 1<<40))
	wantCode(t, err, metaapi.ENOLCK)
	// Changes that do not add records still work: filling a gap merges.
	f.wantGranted(lk(ino, 1, 1, metaapi.LockWrite, 1, 1))
	f.wantGranted(lk(ino, 1, 1, metaapi.LockUnlock, 0, toEOF))
	f.wantGranted(lk(ino, 1, 1, metaapi.LockWrite, 1<<40, 1<<40))
}

func TestLockSessionLease(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.LockLease = 30 * time.Second })
	f.tree("/f")
	ino := f.ino("/f")
	if r := f.wantGranted(lk(ino, 1, 1, metaapi.LockWrite, 0, toEOF)); !r.Lost || r.Lease != int64(30*time.Second) {
		t.Fatalf("first call of a session: %+v, want lost (new) and the lease", r)
	}
	// Renewed, the session keeps its lock past the first lease.
	f.clk.Advance(20 * time.Second)
	if r, err := f.s.LockSession(1, metaapi.LockSessionReq{Session: 1}); err != nil || r.Lost {
		t.Fatalf("renew: %+v %v", r, err)
	}
	f.clk.Advance(20 * time.Second)
	f.wantConflict(lk(ino, 2, 1, metaapi.LockWrite, 0, 0), 1, 0, toEOF)
	// Unrenewed, it lapses: others get the lock even before the sweep.
	f.clk.Advance(31 * time.Second)
	f.wantGranted(lk(ino, 2, 1, metaapi.LockWrite, 0, 0))
	// The lapsed session learns it lost its locks, and they stay lost.
	if r, err := f.s.LockSession(1, metaapi.LockSessionReq{Session: 1}); err != nil || !r.Lost {
		t.Fatalf("renew after lapse: %+v %v", r, err)
	}
	f.wantConflict(lk(ino, 1, 1, metaapi.LockWrite, 0, toEOF), 2, 0, 0)

	// The sweep deletes lapsed sessions and their records.
	f.clk.Advance(31 * time.Second)
	f.s.SweepLocks()
	if n := f.countKeys(pLock) + f.countKeys(pLockIndex) + f.countKeys(pLockSess); n != 0 {
		t.Fatalf("%d lock records left after the sweep", n)
	}
}

func TestLockSessionEnd(t *testing.T) {
	f := newFixture(t)
	f.tree("/f", "/g")
	f.wantGranted(lk(f.ino("/f"), 1, 1, metaapi.LockWrite, 0, toEOF))
	f.wantGranted(lk(f.ino("/g"), 1, 2, metaapi.LockRead, 0, 9))
	f.wantGranted(lk(f.ino("/g"), 2, 2, metaapi.LockRead, 0, 9))
	if _, err := f.s.LockSession(1, metaapi.LockSessionReq{Session: 1, End: true}); err != nil {
		t.Fatal(err)
	}
	f.wantGranted(lk(f.ino("/f"), 3, 1, metaapi.LockWrite, 0, toEOF))
	f.wantConflict(lk(f.ino("/g"), 3, 1, metaapi.LockWrite, 0, toEOF), 2, 0, 9)
	if n := f.countKeys(pLockSess); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
}

// TestLocksSurviveMetaRestart: a restart takes no lock from its holder,
// and gives every session a fresh lease (nobody could renew meanwhile).
func TestLocksSurviveMetaRestart(t *testing.T) {
	f := newFixture(t, onDisk, func(o *Options) { o.LockLease = 30 * time.Second })
	f.tree("/f")
	ino := f.ino("/f")
	f.wantGranted(lk(ino, 1, 1, metaapi.LockWrite, 0, toEOF))
	f.clk.Advance(29 * time.Second)
	f.reopen()
	f.clk.Advance(20 * time.Second) // past the session's own expiry
	f.wantConflict(lk(ino, 2, 1, metaapi.LockRead, 0, 0), 1, 0, toEOF)
	f.clk.Advance(11 * time.Second) // past a lease since the restart
	f.wantGranted(lk(ino, 2, 1, metaapi.LockRead, 0, 0))
}

func (f *fixture) countKeys(prefix byte) int {
	f.t.Helper()
	n := 0
	err := f.s.read(func(v view) error {
		return scan(v.r, []byte{prefix}, []byte{prefix + 1}, func(_, _ []byte) (bool, error) { n++; return true, nil })
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

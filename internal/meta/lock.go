package meta

import (
	"encoding/binary"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/rangelock"
)

// File locks are kept durably, so that a meta restart takes no lock from
// under its holder:
//
//	l <ino:8> <session:8> <owner:8> <kind:1> <start:8>   a held lock: <end:8> <type:1> <pid:4>
//	L <session:8> <ino:8>                                a session holds locks on ino (empty value)
//	s <session:8>                                        lock session: <expiry:8> <client:8> <locks:8>
//
// A session's locks count until its expiry (unix ns), which each call
// from it pushes a lease ahead; after a meta restart every session has at
// least a lease from the restart (its holder could not renew meanwhile).
// A lapsed session's locks are ignored at once and deleted by the sweep,
// or by the session's next call, which learns it lost them.
const (
	pLock      = 'l'
	pLockIndex = 'L'
	pLockSess  = 's'
)

const (
	kindPOSIX = 0
	kindFlock = 1
)

// flockEnd is where a BSD lock ends: the kernel's OFFSET_MAX.
const flockEnd = 1<<63 - 1

func lockInoPrefix(ino ids.Ino) []byte {
	b := make([]byte, 9, 34)
	b[0] = pLock
	binary.BigEndian.PutUint64(b[1:], uint64(ino))
	return b
}

func lockKey(ino ids.Ino, o rangelock.Owner, kind byte, start uint64) []byte {
	b := lockInoPrefix(ino)
	b = binary.BigEndian.AppendUint64(b, o.Session)
	b = binary.BigEndian.AppendUint64(b, o.ID)
	b = append(b, kind)
	return binary.BigEndian.AppendUint64(b, start)
}

func lockIndexKey(session uint64, ino ids.Ino) []byte {
	b := make([]byte, 17)
	b[0] = pLockIndex
	binary.BigEndian.PutUint64(b[1:], session)
	binary.BigEndian.PutUint64(b[9:], uint64(ino))
	return b
}

func lockSessKey(session uint64) []byte {
	b := make([]byte, 9)
	b[0] = pLockSess
	binary.BigEndian.PutUint64(b[1:], session)
	return b
}

// lockSess is a session record.
type lockSess struct {
	expiry int64
	client ids.ClientID
	locks  int64
}

func (r lockSess) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(r.expiry))
	b = binary.BigEndian.AppendUint64(b, uint64(r.client))
	return binary.BigEndian.AppendUint64(b, uint64(r.locks))
}

func loadLockSess(r pebble.Reader, session uint64) (lockSess, bool, error) {
	raw, found, err := getRaw(r, lockSessKey(session))
	if err != nil || !found {
		return lockSess{}, false, err
	}
	if len(raw) != 24 {
		return lockSess{}, false, metaapi.Errorf(metaapi.EIO, "lock session %x: record of %d bytes", session, len(raw))
	}
	return lockSess{int64(beUint64(raw)), ids.ClientID(beUint64(raw[8:])), int64(beUint64(raw[16:]))}, true, nil
}

// liveUntil is when a session's locks stop counting.
func (s *Service) liveUntil(r lockSess) int64 {
	return max(r.expiry, s.openedAt.Add(s.opts.LockLease).UnixNano())
}

// heldLock is a stored lock with its kind.
type heldLock struct {
	rangelock.Lock
	kind byte
}

// locksOn reads every lock on ino.
func locksOn(r pebble.Reader, ino ids.Ino) ([]heldLock, error) {
	var out []heldLock
	p := lockInoPrefix(ino)
	err := scan(r, p, prefixEnd(p), func(k, v []byte) (bool, error) {
		if len(k) != 34 || len(v) != 13 {
			return false, metaapi.Errorf(metaapi.EIO, "malformed lock record %x", k)
		}
		out = append(out, heldLock{
			Lock: rangelock.Lock{
				Owner: rangelock.Owner{Session: beUint64(k[9:]), ID: beUint64(k[17:])},
				Start: beUint64(k[26:]), End: beUint64(v),
				Type: rangelock.Type(v[8]), Pid: binary.BigEndian.Uint32(v[9:]),
			},
			kind: k[25],
		})
		return true, nil
	})
	return out, err
}

func checkLockReq(req metaapi.LockReq) error {
	switch {
	case req.Session == 0:
		return metaapi.Errorf(metaapi.EINVAL, "lock: no session")
	case req.Type > metaapi.LockWrite:
		return metaapi.Errorf(metaapi.EINVAL, "lock: unknown type %d", req.Type)
	case req.Start > req.End:
		return metaapi.Errorf(metaapi.EINVAL, "lock: range starts at %d, after its end %d", req.Start, req.End)
	}
	return nil
}

// lockAccess lets whoever could have opened the file lock it: its owner,
// root, or anyone who may read or write it. A POSIX write lock needs a
// descriptor open for writing (fcntl(2): EBADF otherwise), so write
// access; flock(2) takes any descriptor.
func lockAccess(in *inode, req metaapi.LockReq) error {
	w := req.Who
	if w.UID == 0 || w.UID == in.UID {
		return nil
	}
	if !req.Flock && req.Type == metaapi.LockWrite {
		if access(in, w, mayWrite) != nil {
			return metaapi.Errorf(metaapi.EACCES, "write-locking inode %d: uid %d may not write it", in.Ino, w.UID)
		}
		return nil
	}
	if access(in, w, mayRead) != nil && access(in, w, mayWrite) != nil {
		return metaapi.Errorf(metaapi.EACCES, "locking inode %d: no access to it", in.Ino)
	}
	return nil
}

// Lock sets, tests or releases a lock (see metaapi.LockReq).
func (s *Service) Lock(c ids.ClientID, req metaapi.LockReq) (metaapi.LockResp, error) {
	if err := checkLockReq(req); err != nil {
		return metaapi.LockResp{}, err
	}
	kind := byte(kindPOSIX)
	if req.Flock {
		kind, req.Start, req.End = kindFlock, 0, flockEnd
	}
	resp := metaapi.LockResp{Lease: int64(s.opts.LockLease)}
	if req.Test {
		err := s.read(func(v view) error {
			conflict, _, _, err := s.lockState(v.r, v, req, kind)
			resp.Conflict = conflict
			return err
		})
		return resp, err
	}
	err := s.update(func(tx *txn) error {
		resp.Conflict, resp.Held, resp.Lost = nil, false, false
		sess, lost, err := s.touchSession(tx, req.Session, c)
		if err != nil {
			return err
		}
		resp.Lost = lost
		conflict, mine, total, err := s.lockState(tx.b, tx, req, kind)
		if err != nil || conflict != nil {
			resp.Conflict = conflict
			// Only the session's renewal is written: nothing was granted.
			if err == nil {
				err = tx.b.Set(lockSessKey(req.Session), sess.encode(), nil)
			}
			return err
		}
		o := rangelock.Owner{Session: req.Session, ID: req.Owner}
		next := rangelock.Apply(mine, o, req.Start, req.End, rangelock.Type(req.Type), req.Pid)
		delta := int64(len(next) - len(mine))
		if delta > 0 && (total+int(delta) > metaapi.MaxLocksPerFile || sess.locks+delta > metaapi.MaxLocksPerSession) {
			return metaapi.Errorf(metaapi.ENOLCK, "locking inode %d: %d locks on the file, %d held by the session (limits %d and %d)",
				req.Ino, total, sess.locks, metaapi.MaxLocksPerFile, metaapi.MaxLocksPerSession)
		}
		for _, l := range mine {
			if err := tx.b.Delete(lockKey(req.Ino, o, kind, l.Start), nil); err != nil {
				return err
			}
		}
		for _, l := range next {
			v := binary.BigEndian.AppendUint64(nil, l.End)
			v = append(v, byte(l.Type))
			v = binary.BigEndian.AppendUint32(v, l.Pid)
			if err := tx.b.Set(lockKey(req.Ino, o, kind, l.Start), v, nil); err != nil {
				return err
			}
		}
		sess.locks += delta
		resp.Held = len(next) > 0
		if err := tx.b.Set(lockSessKey(req.Session), sess.encode(), nil); err != nil {
			return err
		}
		return s.indexSessionLocks(tx, req.Session, req.Ino)
	})
	return resp, err
}

// lockState reads what a request meets: the first live lock of another
// owner it conflicts with, the owner's own locks of the request's kind,
// and how many locks of any kind the file has. It checks the caller may
// lock the file at all.
func (s *Service) lockState(r pebble.Reader, n ns, req metaapi.LockReq, kind byte) (*metaapi.LockInfo, []rangelock.Lock, int, error) {
	in, err := n.inode(req.Ino)
	if err != nil {
		return nil, nil, 0, err
	}
	if err := lockAccess(in, req); err != nil {
		return nil, nil, 0, err
	}
	all, err := locksOn(r, req.Ino)
	if err != nil {
		return nil, nil, 0, err
	}
	o := rangelock.Owner{Session: req.Session, ID: req.Owner}
	now := s.opts.Now().UnixNano()
	live := map[uint64]bool{req.Session: true}
	var others, mine []rangelock.Lock
	for _, l := range all {
		if l.kind != kind {
			continue
		}
		if l.Owner == o {
			mine = append(mine, l.Lock)
			continue
		}
		alive, seen := live[l.Owner.Session]
		if !seen {
			rec, found, err := loadLockSess(r, l.Owner.Session)
			if err != nil {
				return nil, nil, 0, err
			}
			alive = found && s.liveUntil(rec) > now
			live[l.Owner.Session] = alive
		}
		if alive {
			others = append(others, l.Lock)
		}
	}
	if c, ok := rangelock.Conflict(others, o, req.Start, req.End, rangelock.Type(req.Type)); ok {
		return &metaapi.LockInfo{Type: uint8(c.Type), Start: c.Start, End: c.End, Pid: c.Pid, Session: c.Owner.Session}, mine, len(all), nil
	}
	return nil, mine, len(all), nil
}

// touchSession returns session's record with its lease renewed (not yet
// written), first dropping its locks if it had lapsed. lost says it was
// not live before (new, swept or lapsed): whatever locks its holder
// believes it has are gone.
func (s *Service) touchSession(tx *txn, session uint64, c ids.ClientID) (rec lockSess, lost bool, err error) {
	rec, found, err := loadLockSess(tx.b, session)
	if err != nil {
		return rec, false, err
	}
	if found && rec.client != c {
		return rec, false, metaapi.Errorf(metaapi.EPERM, "lock session %x belongs to another client", session)
	}
	if found && s.liveUntil(rec) <= tx.now {
		if err := dropSessionLocks(tx, session); err != nil {
			return rec, false, err
		}
		rec.locks = 0
	}
	lost = !found || s.liveUntil(rec) <= tx.now
	rec.client = c
	rec.expiry = tx.now + int64(s.opts.LockLease)
	return rec, lost, nil
}

// indexSessionLocks records whether session still holds locks on ino.
func (s *Service) indexSessionLocks(tx *txn, session uint64, ino ids.Ino) error {
	p := binary.BigEndian.AppendUint64(lockInoPrefix(ino), session)
	has := false
	if err := scan(tx.b, p, prefixEnd(p), func(_, _ []byte) (bool, error) { has = true; return false, nil }); err != nil {
		return err
	}
	if has {
		return tx.b.Set(lockIndexKey(session, ino), nil, nil)
	}
	return tx.b.Delete(lockIndexKey(session, ino), nil)
}

// dropSessionLocks deletes every lock session holds.
func dropSessionLocks(tx *txn, session uint64) error {
	p := lockIndexKey(session, 0)[:9]
	var inos []ids.Ino
	err := scan(tx.b, p, prefixEnd(p), func(k, _ []byte) (bool, error) {
		if len(k) == 17 {
			inos = append(inos, ids.Ino(beUint64(k[9:])))
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, ino := range inos {
		lp := binary.BigEndian.AppendUint64(lockInoPrefix(ino), session)
		var keys [][]byte
		err := scan(tx.b, lp, prefixEnd(lp), func(k, _ []byte) (bool, error) {
			keys = append(keys, append([]byte(nil), k...))
			return true, nil
		})
		if err != nil {
			return err
		}
		for _, k := range append(keys, lockIndexKey(session, ino)) {
			if err := tx.b.Delete(k, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// LockSession renews a lock session or ends it (see
// metaapi.LockSessionReq).
func (s *Service) LockSession(c ids.ClientID, req metaapi.LockSessionReq) (metaapi.LockSessionResp, error) {
	if req.Session == 0 {
		return metaapi.LockSessionResp{}, metaapi.Errorf(metaapi.EINVAL, "lock session: no session")
	}
	resp := metaapi.LockSessionResp{Lease: int64(s.opts.LockLease)}
	err := s.update(func(tx *txn) error {
		if req.End {
			rec, found, err := loadLockSess(tx.b, req.Session)
			if err != nil || !found {
				return err
			}
			if rec.client != c {
				return metaapi.Errorf(metaapi.EPERM, "lock session %x belongs to another client", req.Session)
			}
			if err := dropSessionLocks(tx, req.Session); err != nil {
				return err
			}
			return tx.b.Delete(lockSessKey(req.Session), nil)
		}
		rec, lost, err := s.touchSession(tx, req.Session, c)
		if err != nil {
			return err
		}
		resp.Lost = lost
		return tx.b.Set(lockSessKey(req.Session), rec.encode(), nil)
	})
	return resp, err
}

// SweepLocks deletes lapsed sessions and their locks: a mount that died
// holding locks stops blocking others a lease after its last call.
func (s *Service) SweepLocks() {
	var due []uint64
	now := s.opts.Now().UnixNano()
	err := s.read(func(v view) error {
		return scan(v.r, []byte{pLockSess}, []byte{pLockSess + 1}, func(k, _ []byte) (bool, error) {
			if len(k) != 9 {
				return true, nil
			}
			rec, found, err := loadLockSess(v.r, beUint64(k[1:]))
			if err == nil && found && s.liveUntil(rec) <= now {
				due = append(due, beUint64(k[1:]))
			}
			return len(due) < 256, err
		})
	})
	if err != nil || len(due) == 0 {
		return
	}
	err = s.update(func(tx *txn) error {
		for _, session := range due {
			rec, found, err := loadLockSess(tx.b, session)
			if err != nil {
				return err
			}
			if !found || s.liveUntil(rec) > tx.now {
				continue // renewed meanwhile
			}
			if err := dropSessionLocks(tx, session); err != nil {
				return err
			}
			if err := tx.b.Delete(lockSessKey(session), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("sweeping lapsed lock sessions", "err", err)
		return
	}
	s.log.Info("dropped lapsed lock sessions and their locks", "sessions", len(due), "lease", time.Duration(s.opts.LockLease))
}

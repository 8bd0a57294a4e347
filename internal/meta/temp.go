package meta

import (
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Temporary files of puts. A put writes into a hidden file it creates
// with CreateReq.TempSession, a lock session (lock.go) its writer renews
// while it writes; meta records the file under
//
//	T <ino:8>   tempRec (JSON)
//
// until a rename makes it a file like any other. A file whose session
// lapsed (its writer died: kill -9, a crashed host) is removed once it
// has stayed lapsed for TempGrace, and its chunks go the way of any
// removed file's. Only files a put creates are marked: never a user's,
// and a file renamed by anyone is no longer temporary.

const pTemp = 'T'

func tempKey(ino ids.Ino) []byte {
	b := make([]byte, 9)
	b[0] = pTemp
	binary.BigEndian.PutUint64(b[1:], uint64(ino))
	return b
}

// tempRec is a temporary file: the session writing it and its name.
type tempRec struct {
	Session uint64  `json:"session"`
	Parent  ids.Ino `json:"parent"`
	Name    string  `json:"name"`
	// Lapsed is when meta first found the session lapsed (unix ns; 0:
	// live when last looked at).
	Lapsed int64 `json:"lapsed,omitempty"`
}

// tempAction is what the sweep does with a temporary file.
type tempAction int

const (
	tempKeep   tempAction = iota // its writer lives, or the grace runs
	tempNote                     // lapsed just now: the grace starts
	tempRevive                   // lapsed before, live again: the grace is off
	tempRemove                   // lapsed for the grace: remove it
	tempForget                   // gone or renamed meanwhile: drop the record
)

// tempVerdict decides about rec: named says its name still names the
// file, live whether its session is live.
func tempVerdict(rec tempRec, named, live bool, now int64, grace time.Duration) tempAction {
	switch {
	case !named:
		return tempForget
	case live && rec.Lapsed != 0:
		return tempRevive
	case live:
		return tempKeep
	case rec.Lapsed == 0:
		return tempNote
	case now-rec.Lapsed >= int64(grace):
		return tempRemove
	}
	return tempKeep
}

// markTemp records the file ino, just created as name in parent, as a
// temporary of session, which it renews (client c's).
func (s *Service) markTemp(tx *txn, c ids.ClientID, session uint64, parent ids.Ino, name string, ino ids.Ino) error {
	sess, _, err := s.touchSession(tx, session, c)
	if err != nil {
		return err
	}
	if err := tx.b.Set(lockSessKey(session), sess.encode(), nil); err != nil {
		return err
	}
	return tx.setJSON(tempKey(ino), &tempRec{Session: session, Parent: parent, Name: name})
}

// unmarkTemp makes ino a file like any other (it was renamed).
func unmarkTemp(tx *txn, ino ids.Ino) error {
	if _, found, err := getRaw(tx.b, tempKey(ino)); err != nil || !found {
		return err
	}
	return tx.b.Delete(tempKey(ino), nil)
}

// tempState reads rec's file: whether its name still names it, and the
// file (nil if gone).
func tempState(n ns, ino ids.Ino, rec tempRec) (bool, *inode, error) {
	d, found, err := n.entry(rec.Parent, rec.Name)
	if err != nil || !found || d.Ino != ino {
		return false, nil, err
	}
	in, err := n.inode(ino)
	if metaapi.IsCode(err, metaapi.ENOENT) {
		return false, nil, nil
	}
	return err == nil, in, err
}

// maxTempSweep bounds the temporary files one sweep looks at.
const maxTempSweep = 256

// SweepTemps removes temporary files whose writer's session has been
// lapsed for TempGrace (the sweeper calls it).
func (s *Service) SweepTemps() {
	type due struct {
		ino ids.Ino
		rec tempRec
	}
	var todo []due
	err := s.read(func(v view) error {
		now := s.opts.Now().UnixNano()
		return scan(v.r, []byte{pTemp}, []byte{pTemp + 1}, func(k, val []byte) (bool, error) {
			var rec tempRec
			if len(k) != 9 || json.Unmarshal(val, &rec) != nil {
				return true, nil
			}
			ino := ids.Ino(beUint64(k[1:]))
			act, err := s.tempAction(v, ino, rec, now)
			if err != nil {
				return false, err
			}
			if act != tempKeep {
				todo = append(todo, due{ino, rec})
			}
			return len(todo) < maxTempSweep, nil
		})
	})
	if err != nil || len(todo) == 0 {
		if err != nil && err != errClosed {
			s.log.Warn("sweeping temporary files", "err", err)
		}
		return
	}
	removed := 0
	err = s.update(func(tx *txn) error {
		removed = 0
		for _, d := range todo {
			var rec tempRec
			found, err := getJSON(tx.b, tempKey(d.ino), &rec)
			if err != nil {
				return err
			}
			if !found {
				continue
			}
			act, err := s.tempAction(tx, d.ino, rec, tx.now)
			if err != nil {
				return err
			}
			switch act {
			case tempNote, tempRevive:
				rec.Lapsed = 0
				if act == tempNote {
					rec.Lapsed = tx.now
				}
				err = tx.setJSON(tempKey(d.ino), &rec)
			case tempForget:
				err = tx.b.Delete(tempKey(d.ino), nil)
			case tempRemove:
				removed++
				err = s.removeTemp(tx, d.ino, rec)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("sweeping temporary files", "err", err)
	} else if removed > 0 {
		s.log.Info("removed temporary files whose writer's session lapsed", "files", removed, "grace", s.opts.TempGrace)
	}
}

// tempAction reads what SweepTemps needs to decide about rec.
func (s *Service) tempAction(n ns, ino ids.Ino, rec tempRec, now int64) (tempAction, error) {
	named, _, err := tempState(n, ino, rec)
	if err != nil {
		return tempKeep, err
	}
	sess, found, err := loadLockSess(n.reader(), rec.Session)
	if err != nil {
		return tempKeep, err
	}
	live := found && s.liveUntil(sess) > now
	return tempVerdict(rec, named, live, now, s.opts.TempGrace), nil
}

// removeTemp unlinks a temporary file as a remove by root would.
func (s *Service) removeTemp(tx *txn, ino ids.Ino, rec tempRec) error {
	parent, err := dirInode(tx, rec.Parent)
	if err != nil {
		return err
	}
	victim, err := tx.inode(ino)
	if err != nil {
		return err
	}
	if err := tx.delEntry(parent.Ino, rec.Name); err != nil {
		return err
	}
	if err := unlinkInode(tx, parent, victim, false, s.opts.OrphanLease); err != nil {
		return err
	}
	touchDir(tx, parent)
	s.log.Info("removing a temporary file its writer left", "ino", ino, "parent", rec.Parent, "name", rec.Name)
	return tx.b.Delete(tempKey(ino), nil)
}

// tempUsage counts the temporary files and the bytes they hold at most:
// their size, or their chunks' whole size if more (a put commits its
// size only at the end). A file's chunks are its count (Attr.Chunks);
// only a file from before counts existed has its chunk records scanned.
// Every Status call runs this: the count spares it a scan of the chunk
// records of up to 65,536 files.
func tempUsage(v view) (files, bytes int64, err error) {
	err = scan(v.r, []byte{pTemp}, []byte{pTemp + 1}, func(k, val []byte) (bool, error) {
		var rec tempRec
		if len(k) != 9 || json.Unmarshal(val, &rec) != nil {
			return true, nil
		}
		ino := ids.Ino(beUint64(k[1:]))
		named, in, err := tempState(v, ino, rec)
		if err != nil || !named {
			return err == nil, err
		}
		chunks := in.Chunks
		if !in.Counted {
			chunks = 0
			p := chunkPrefix(ino)
			if err := scan(v.r, p, prefixEnd(p), func(_, _ []byte) (bool, error) { chunks++; return true, nil }); err != nil {
				return false, err
			}
		}
		files++
		bytes += max(in.Size, chunks*in.ChunkSize)
		return files < 1<<16, nil
	})
	return files, bytes, err
}

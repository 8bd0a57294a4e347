package meta

import (
	"encoding/binary"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Orphans are regular files whose last name was removed while a client
// held them open (POSIX: an unlinked file stays usable until closed).
// They keep their inode and chunks, reachable by inode number only, under
// a lease the holder renews; Release or a lapsed lease frees them.

// Release ends the orphan lease on req.Ino (freeing the file if it has
// no name), or extends it with Renew. Anything else is a no-op, so a
// retried call is harmless.
func (s *Service) Release(req metaapi.ReleaseReq) error {
	return s.update(func(tx *txn) error {
		_, found, err := getRaw(tx.b, orphanKey(req.Ino))
		if err != nil || !found {
			return err
		}
		in, err := tx.inode(req.Ino)
		if metaapi.IsCode(err, metaapi.ENOENT) {
			return tx.b.Delete(orphanKey(req.Ino), nil)
		} else if err != nil {
			return err
		}
		// Only who could have opened it may end it early.
		if w := req.Who; w.UID != 0 && w.UID != in.UID && access(in, w, mayRead) != nil && access(in, w, mayWrite) != nil {
			return metaapi.Errorf(metaapi.EACCES, "releasing inode %d: not its owner and no access to it", in.Ino)
		}
		switch {
		case in.Nlink > 0:
			// Not reachable through the API (Link refuses orphans), but a
			// stray record must never free a file that has a name.
			return tx.b.Delete(orphanKey(req.Ino), nil)
		case req.Renew:
			return tx.setOrphan(req.Ino, tx.now+int64(s.opts.OrphanLease))
		}
		return tx.free(in)
	})
}

// SweepOrphans frees orphans whose lease has lapsed (their holder died
// or lost touch with meta for longer than the lease).
func (s *Service) SweepOrphans() {
	var due []ids.Ino
	now := s.opts.Now().UnixNano()
	err := s.read(func(v view) error {
		return scan(v.r, []byte{pOrphan}, []byte{pOrphan + 1}, func(k, val []byte) (bool, error) {
			if len(k) == 9 && len(val) == 8 && int64(binary.BigEndian.Uint64(val)) < now {
				due = append(due, ids.Ino(binary.BigEndian.Uint64(k[1:])))
			}
			return len(due) < 1024, nil
		})
	})
	if err != nil || len(due) == 0 {
		return
	}
	freed := 0
	err = s.update(func(tx *txn) error {
		freed = 0
		for _, ino := range due {
			raw, found, err := getRaw(tx.b, orphanKey(ino))
			if err != nil {
				return err
			}
			if !found || len(raw) != 8 || int64(binary.BigEndian.Uint64(raw)) >= tx.now {
				continue // released or renewed meanwhile
			}
			in, err := tx.inode(ino)
			if err == nil && in.Nlink == 0 {
				err = tx.free(in)
				freed++
			} else if metaapi.IsCode(err, metaapi.ENOENT) || err == nil {
				err = tx.b.Delete(orphanKey(ino), nil)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && err != errClosed {
		s.log.Error("freeing orphans whose lease lapsed", "err", err)
	} else if err == nil && freed > 0 {
		s.log.Info("freed orphans whose lease lapsed", "count", freed)
	}
}

// tmpfile creates a regular file with no name in directory req.Parent
// (made as a create there would make it), kept as an orphan under the lease until
// released or linked into place.
func (s *Service) tmpfile(req metaapi.CreateReq) (metaapi.Attr, error) {
	var out metaapi.Attr
	if req.Name != "" || req.Type != metaapi.TypeFile {
		return out, metaapi.Errorf(metaapi.EINVAL, "a tmpfile is a regular file with no name (got %s %q)", req.Type, req.Name)
	}
	who := req.Who
	err := s.update(func(tx *txn) error {
		parent, err := dirInode(tx, req.Parent)
		if err != nil {
			return err
		}
		if err := access(parent, who, mayWrite|mayExec); err != nil {
			return err
		}
		in, err := s.newChild(tx, parent, req, who)
		if err != nil {
			return err
		}
		in.Nlink, in.Linkable = 0, !req.Exclusive
		tx.newInode(in)
		out = in.Attr
		if err := tx.setLastParent(in.Ino, parent.Ino); err != nil {
			return err
		}
		return tx.setOrphan(in.Ino, tx.now+int64(s.opts.OrphanLease))
	})
	return out, err
}

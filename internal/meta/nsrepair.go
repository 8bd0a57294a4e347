package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Repairs of the namespace check. Each runs in transactions of at most
// repairBatch repairs (a badly broken namespace does not hold the write
// lock for long), and each repair first makes sure the problem the
// snapshot showed is still there: what changed since is counted and left
// for the next check. Nothing is ever freed.

const repairBatch = 256

// lostFoundName is where the check links what no path reaches, as
// ext4's fsck does.
const lostFoundName = "lost+found"

// repairNamespace fixes what c found and says so in res. Dangling
// entries go first: what only they named was judged without them, so is
// an orphan already counted; orphans are linked next, then link counts
// set (directories counted again, so they agree with the entries the
// first two steps removed and made).
func (s *Service) repairNamespace(c *checker, res *NamespaceCheck) error {
	steps := []struct {
		k   kind
		run func() (fixed, changed int64, err error)
		did string
	}{
		{kDangling, func() (int64, int64, error) { return inBatches(s, c.dangling, removeDangling) }, "removed"},
		{kOrphan, func() (int64, int64, error) { return inBatches(s, c.orphans, linkOrphans) }, "linked into /" + lostFoundName + " as #<inode>"},
		{kLinks, func() (int64, int64, error) { return inBatches(s, c.links, setLinks) }, "set to the names counted"},
	}
	for _, st := range steps {
		if c.tallies[st.k].count == 0 {
			continue
		}
		fixed, changed, err := st.run()
		p := res.problem(st.k)
		p.Repaired, p.Action = fixed, st.did
		if changed > 0 {
			p.Action += fmt.Sprintf("; %d changed since the check read them: run it again", changed)
		}
		var lf *lostFoundError
		switch {
		case errors.As(err, &lf):
			p.Action = "left: " + lf.msg
			if fixed > 0 {
				p.Action = fmt.Sprintf("%s (%d), then the rest left: %s", st.did, fixed, lf.msg)
			}
		case err != nil:
			p.Action = fmt.Sprintf("%s (%d), then failed: %v", st.did, fixed, err)
			return err
		}
	}
	if c.tallies[kMeta].count > 0 {
		res.problem(kMeta).Action = "left alone: needs an operator"
	}
	if len(c.indexFaults) > 0 {
		if _, _, err := inBatches(s, c.indexFaults, fixLinks); err != nil {
			return fmt.Errorf("rewriting the name index: %w", err)
		}
		res.indexFaults = nil
	}
	return nil
}

// inBatches runs fix over items, repairBatch at a time, each batch one
// transaction.
func inBatches[T any](s *Service, items []T, fix func(tx *txn, batch []T) (fixed, changed int64, err error)) (fixed, changed int64, err error) {
	for len(items) > 0 {
		batch := items[:min(len(items), repairBatch)]
		items = items[len(batch):]
		var f, c int64
		err := s.update(func(tx *txn) error {
			var err error
			f, c, err = fix(tx, batch)
			return err
		})
		if err != nil {
			return fixed, changed, err
		}
		fixed, changed = fixed+f, changed+c
	}
	return fixed, changed, nil
}

// removeDangling deletes entries still dangling, touching their
// directories as a removal does.
func removeDangling(tx *txn, refs []entryRef) (fixed, changed int64, err error) {
	for _, e := range refs {
		raw, found, err := getRaw(tx.b, direntKey(e.parent, e.name))
		if err != nil {
			return 0, 0, err
		}
		if !found || !bytes.Equal(raw, e.raw) {
			changed++
			continue
		}
		// Still dangling? An inode number past a corrupt counter may
		// have been given out since.
		ptyp, pfound, err := txProbe(tx, e.parent)
		if err != nil {
			return 0, 0, err
		}
		d, derr := decodeDirent(raw)
		var ctyp metaapi.FileType
		var cfound bool
		if derr == nil {
			if ctyp, cfound, err = txProbe(tx, d.Ino); err != nil {
				return 0, 0, err
			}
		}
		if entryFault(e.parent, ptyp, pfound, d, derr, ctyp, cfound) == "" {
			changed++
			continue
		}
		if err := tx.delEntry(e.parent, e.name); err != nil {
			return 0, 0, err
		}
		fixed++
		// Its directory's link count, if it counted the entry, was
		// judged without it: the link count step sets it.
		if ptyp == metaapi.TypeDir {
			dir, err := tx.inode(e.parent)
			if err != nil {
				return 0, 0, err
			}
			touchDir(tx, dir)
		}
	}
	return fixed, changed, nil
}

// linkOrphans names each orphan still an orphan in lost+found.
func linkOrphans(tx *txn, fixes []orphanFix) (fixed, changed int64, err error) {
	var lf *inode // made when first needed
	for _, f := range fixes {
		in, err := tx.inode(f.ino)
		if metaapi.IsCode(err, metaapi.ENOENT) {
			changed++
			continue
		} else if err != nil {
			return 0, 0, err
		}
		still, err := stillOrphan(tx, f, in)
		if err != nil {
			return 0, 0, err
		}
		if !still {
			changed++
			continue
		}
		if lf == nil {
			if lf, err = lostFound(tx); err != nil {
				return 0, 0, err
			}
		}
		name, err := freeName(tx, lf.Ino, fmt.Sprintf("#%d", f.ino))
		if err != nil {
			return 0, 0, err
		}
		if len(f.cycle) > 0 {
			// Moved out of its cycle, as a rename would.
			old := f.cycle[0]
			if err := tx.delEntry(old.parent, old.name); err != nil {
				return 0, 0, err
			}
			if err := setDirLinks(tx, old.parent); err != nil {
				return 0, 0, err
			}
			dir, err := tx.inode(old.parent)
			if err != nil {
				return 0, 0, err
			}
			touchDir(tx, dir)
		}
		if err := tx.setEntry(lf.Ino, name, dirent{Ino: in.Ino, Type: in.Type}); err != nil {
			return 0, 0, err
		}
		if in.isDir() {
			in.Parent = lf.Ino
			tx.movedDir = true
			lf.Nlink++
		} else {
			in.Nlink, in.Linkable = 1, false
			if err := tx.b.Delete(orphanKey(in.Ino), nil); err != nil { // its name keeps it now
				return 0, 0, err
			}
		}
		in.Ctime = tx.now
		tx.dirty(in)
		touchDir(tx, lf)
		fixed++
	}
	return fixed, changed, nil
}

// stillOrphan says whether an orphan the snapshot showed is one still.
func stillOrphan(tx *txn, f orphanFix, in *inode) (bool, error) {
	switch {
	case in.Type != f.typ:
		return false, nil
	case len(f.cycle) > 0:
		// Each member still named in the next: still a cycle, and none
		// has another name (directories have one).
		for _, e := range f.cycle {
			raw, found, err := getRaw(tx.b, direntKey(e.parent, e.name))
			if err != nil || !found || !bytes.Equal(raw, e.raw) {
				return false, err
			}
		}
		return true, nil
	case in.isDir():
		return true, nil // Link refuses directories, Rename moves a name one has
	}
	// Every change to a non-directory's names changes its link count by
	// as much (Link, Remove, Rename onto it): the same count, no name.
	_, kept, err := getRaw(tx.b, orphanKey(in.Ino))
	return err == nil && in.Nlink == f.nlink && kept == f.kept, err
}

// setLinks sets link counts still wrong: a directory's to what its
// entries say now, a non-directory's to the names counted if nothing
// changed its names since.
func setLinks(tx *txn, fixes []linkFix) (fixed, changed int64, err error) {
	for _, f := range fixes {
		in, err := tx.inode(f.ino)
		if metaapi.IsCode(err, metaapi.ENOENT) {
			changed++
			continue
		} else if err != nil {
			return 0, 0, err
		}
		switch {
		case f.dir != in.isDir():
			changed++
		case f.dir:
			if err := setDirLinks(tx, f.ino); err != nil {
				return 0, 0, err
			}
			fixed++
		case in.Nlink != f.nlink:
			changed++ // see stillOrphan
		default:
			in.Nlink, in.Linkable, in.Ctime = f.names, false, tx.now
			tx.dirty(in)
			// A name keeps it: an orphan record must not free it.
			if err := tx.b.Delete(orphanKey(in.Ino), nil); err != nil {
				return 0, 0, err
			}
			fixed++
		}
	}
	return fixed, changed, nil
}

// setDirLinks sets a directory's link count to 2 ("." and its name) plus
// one for each subdirectory (its ".."), counted as the check counts.
func setDirLinks(tx *txn, ino ids.Ino) error {
	dir, err := tx.inode(ino)
	if err != nil || !dir.isDir() {
		return err
	}
	want := uint32(2)
	p := direntPrefix(ino)
	err = scan(tx.b, p, prefixEnd(p), func(_, v []byte) (bool, error) {
		d, err := decodeDirent(v)
		if err != nil || d.Type != metaapi.TypeDir {
			return true, nil
		}
		typ, found, err := txProbe(tx, d.Ino)
		if found && (typ == metaapi.TypeDir || typ == "") {
			want++
		}
		return err == nil, err
	})
	if err != nil {
		return err
	}
	if dir.Nlink != want {
		dir.Nlink, dir.Ctime = want, tx.now
		tx.dirty(dir)
	}
	return nil
}

// txProbe returns an inode's type as the check sees it: "" for a record
// that does not decode (or of no known type).
func txProbe(tx *txn, ino ids.Ino) (metaapi.FileType, bool, error) {
	if in, ok := tx.inodes[ino]; ok {
		return in.Type, true, nil
	}
	raw, found, err := getRaw(tx.b, inodeKey(ino))
	if err != nil || !found {
		return "", false, err
	}
	var in inode
	if json.Unmarshal(raw, &in) != nil {
		return "", true, nil
	}
	if _, known := typeCodes[in.Type]; !known {
		return "", true, nil
	}
	return in.Type, true, nil
}

// lostFoundError is why orphans cannot be linked into lost+found.
type lostFoundError struct{ msg string }

func (e *lostFoundError) Error() string { return e.msg }

// lostFound returns /lost+found, made if missing: a directory only root
// may enter, as ext4's.
func lostFound(tx *txn) (*inode, error) {
	// Records that do not decode are the check's metadata problems.
	if typ, _, err := txProbe(tx, ids.RootIno); err != nil {
		return nil, err
	} else if typ != metaapi.TypeDir {
		return nil, &lostFoundError{"the root directory is missing or unreadable"}
	}
	root, err := tx.inode(ids.RootIno)
	if err != nil {
		return nil, err
	}
	d, found, err := tx.entry(root.Ino, lostFoundName)
	if err != nil {
		return nil, err
	}
	if found {
		typ, _, err := txProbe(tx, d.Ino)
		if err != nil {
			return nil, err
		}
		if typ != metaapi.TypeDir || d.Type != metaapi.TypeDir {
			return nil, &lostFoundError{"/" + lostFoundName + " is not a directory: move it aside and check again"}
		}
		return tx.inode(d.Ino)
	}
	// A new inode must not overwrite one a corrupt counter is behind.
	if _, taken, err := getRaw(tx.b, inodeKey(tx.ctr.NextIno)); err != nil {
		return nil, err
	} else if taken {
		return nil, &lostFoundError{fmt.Sprintf("cannot make /%s: inode %d, the next to give out, exists", lostFoundName, tx.ctr.NextIno)}
	}
	lf := &inode{
		Attr: metaapi.Attr{
			Type: metaapi.TypeDir, Mode: 0o700, Nlink: 2,
			Atime: tx.now, Mtime: tx.now, Ctime: tx.now,
		},
		Parent: root.Ino,
	}
	tx.newInode(lf)
	if err := tx.setEntry(root.Ino, lostFoundName, dirent{Ino: lf.Ino, Type: metaapi.TypeDir}); err != nil {
		return nil, err
	}
	root.Nlink++
	touchDir(tx, root)
	return lf, nil
}

// freeName returns base, or base.N if that is taken, in directory dir.
func freeName(tx *txn, dir ids.Ino, base string) (string, error) {
	for i := range 100 {
		name := base
		if i > 0 {
			name = fmt.Sprintf("%s.%d", base, i)
		}
		_, taken, err := tx.entry(dir, name)
		if err != nil || !taken {
			return name, err
		}
	}
	return "", fmt.Errorf("no free name for %s in /%s", base, lostFoundName)
}

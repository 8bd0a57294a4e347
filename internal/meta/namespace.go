package meta

import (
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The namespace operations. Checks follow the order Linux applies them
// in, so callers see the same errno a local file system would give:
// name validation, then the parent (ENOENT, ENOTDIR), search permission,
// the lookup (ENOENT/EEXIST), write permission, the sticky bit, type
// checks, emptiness.

// dirInode loads ino and requires a directory.
func dirInode(r ns, ino ids.Ino) (*inode, error) {
	in, err := r.inode(ino)
	if err != nil {
		return nil, err
	}
	if !in.isDir() {
		return nil, metaapi.Errorf(metaapi.ENOTDIR, "inode %d is a %s, not a directory", ino, in.Type)
	}
	return in, nil
}

// child looks up name in directory dir and loads the inode it names:
// ENOENT when there is no such entry.
func child(r ns, dir ids.Ino, name string) (dirent, *inode, error) {
	d, found, err := r.entry(dir, name)
	if err != nil {
		return d, nil, err
	}
	if !found {
		return d, nil, metaapi.Errorf(metaapi.ENOENT, "no entry %q in directory %d", name, dir)
	}
	in, err := r.inode(d.Ino)
	return d, in, err
}

// isEmptyDir reports whether a directory has no entries.
func isEmptyDir(r ns, ino ids.Ino) (bool, error) {
	empty := true
	p := direntPrefix(ino)
	err := scan(r.reader(), p, prefixEnd(p), func(k, v []byte) (bool, error) {
		empty = false
		return false, nil
	})
	return empty, err
}

// maxDepth bounds walks up the tree; only a corrupted parent chain
// reaches it.
const maxDepth = 1 << 20

// isAncestor reports whether dir a is anc or lies below it.
func isAncestor(r ns, anc ids.Ino, a *inode) (bool, error) {
	for i := 0; i < maxDepth; i++ {
		if a.Ino == anc {
			return true, nil
		}
		if a.Ino == ids.RootIno {
			return false, nil
		}
		var err error
		if a, err = r.inode(a.Parent); err != nil {
			return false, err
		}
	}
	return false, metaapi.Errorf(metaapi.EIO, "directory tree deeper than %d: corrupt parent chain", maxDepth)
}

func touchDir(tx *txn, dirs ...*inode) {
	for _, d := range dirs {
		d.Mtime, d.Ctime = tx.now, tx.now
	}
	tx.dirty(dirs...)
	tx.touched = append(tx.touched, dirs...)
}

// updateDirs is update for an operation on directory entries: it also
// returns the attributes, after it, of the directories it changed, so a
// front end can answer for them without asking again.
func (s *Service) updateDirs(fn func(tx *txn) error) ([]metaapi.Attr, error) {
	var dirs []metaapi.Attr
	err := s.update(func(tx *txn) error {
		if err := fn(tx); err != nil {
			return err
		}
		for _, d := range tx.touched {
			if len(dirs) == 0 || dirs[len(dirs)-1].Ino != d.Ino {
				dirs = append(dirs, d.Attr)
			}
		}
		return nil
	})
	return dirs, err
}

// unlinkInode drops one name of victim, which was in dir, freeing it when
// no name is left — unless keep, for a regular file a caller holds open:
// then it becomes an orphan until released (see Release). The caller
// deletes the entry itself.
func unlinkInode(tx *txn, dir, victim *inode, keep bool, lease time.Duration) error {
	if victim.isDir() {
		victim.Nlink = 0
		dir.Nlink-- // victim's ".." no longer points at dir
		tx.dirty(dir)
		return tx.free(victim)
	}
	victim.Nlink--
	victim.Ctime = tx.now
	if victim.Nlink == 0 {
		if keep && victim.Type == metaapi.TypeFile {
			tx.dirty(victim)
			return tx.setOrphan(victim.Ino, tx.now+int64(lease))
		}
		return tx.free(victim)
	}
	tx.dirty(victim)
	return nil
}

// GetAttr returns an inode's attributes.
func (s *Service) GetAttr(req metaapi.GetAttrReq) (metaapi.Attr, error) {
	var out metaapi.Attr
	err := s.read(func(v view) error {
		in, err := v.inode(req.Ino)
		if err == nil {
			out = in.Attr
		}
		return err
	})
	return out, err
}

// Lookup returns the attributes of name in directory Parent.
func (s *Service) Lookup(req metaapi.LookupReq) (metaapi.Attr, error) {
	var out metaapi.Attr
	if req.Name == ".." {
		// The parent directory (the root's is the root): NFS clients
		// walk up by handle.
		err := s.read(func(v view) error {
			dir, err := dirInode(v, req.Parent)
			if err != nil {
				return err
			}
			if err := access(dir, req.Who, mayExec); err != nil {
				return err
			}
			if dir.Ino == req.Root {
				out = dir.Attr // a confined caller's "/" is its own parent
				return nil
			}
			up, err := v.inode(dir.Parent)
			if err == nil {
				out = up.Attr
			}
			return err
		})
		return out, err
	}
	if err := validName(string(req.Name)); err != nil {
		return out, err
	}
	err := s.read(func(v view) error {
		parent, err := dirInode(v, req.Parent)
		if err != nil {
			return err
		}
		if err := access(parent, req.Who, mayExec); err != nil {
			return err
		}
		_, in, err := child(v, req.Parent, string(req.Name))
		if err == nil {
			out = in.Attr
		}
		return err
	})
	return out, err
}

// Resolve returns the attributes of the inode an absolute path names.
func (s *Service) Resolve(req metaapi.ResolveReq) (metaapi.Attr, error) {
	var out metaapi.Attr
	err := s.read(func(v view) error {
		in, err := resolve(v, string(req.Path), req.Follow, req.Root)
		if err == nil {
			out = in.Attr
		}
		return err
	})
	return out, err
}

// Link adds a name for an existing non-directory inode.
func (s *Service) Link(req metaapi.LinkReq) (metaapi.Attr, error) {
	r, err := s.link(req)
	return r.Attr, err
}

func (s *Service) link(req metaapi.LinkReq) (metaapi.AttrResp, error) {
	var out metaapi.AttrResp
	if err := validName(string(req.NewName)); err != nil {
		return out, err
	}
	who := req.Who
	dirs, err := s.updateDirs(func(tx *txn) error {
		src, err := tx.inode(req.Ino)
		if err != nil {
			return err
		}
		if src.isDir() {
			return eperm("hard link to directory %d", src.Ino)
		}
		if src.Nlink == 0 && !src.Linkable {
			// An orphan (unlinked while open) cannot get a name back.
			return metaapi.Errorf(metaapi.ENOENT, "inode %d has been removed", src.Ino)
		}
		if src.Nlink == 0 && !isOwner(src, who) {
			// Linux names a tmpfile only for who holds it open; meta
			// cannot see descriptors, so only its owner may.
			return eperm("naming tmpfile %d owned by uid %d", src.Ino, src.UID)
		}
		np, err := dirInode(tx, req.NewParent)
		if err != nil {
			return err
		}
		if err := access(np, who, mayExec); err != nil {
			return err
		}
		_, found, err := tx.entry(np.Ino, string(req.NewName))
		if err != nil {
			return err
		}
		if found {
			return metaapi.Errorf(metaapi.EEXIST, "%q already exists in directory %d", req.NewName, np.Ino)
		}
		if err := access(np, who, mayWrite|mayExec); err != nil {
			return err
		}
		if src.Nlink >= maxLinks {
			return metaapi.Errorf(metaapi.EMLINK, "inode %d already has %d links", src.Ino, src.Nlink)
		}
		if err := tx.setEntry(np.Ino, string(req.NewName), dirent{Ino: src.Ino, Type: src.Type}); err != nil {
			return err
		}
		if src.Nlink == 0 { // a tmpfile linked into place: kept by its name now
			if err := tx.b.Delete(orphanKey(src.Ino), nil); err != nil {
				return err
			}
			src.Linkable = false
		}
		src.Nlink++
		src.Ctime = tx.now
		tx.dirty(src)
		touchDir(tx, np)
		out.Attr = src.Attr
		return nil
	})
	out.Dirs = dirs
	return out, err
}

// Remove unlinks a non-directory (Dir false) or removes an empty
// directory (Dir true).
func (s *Service) Remove(req metaapi.RemoveReq) error {
	_, err := s.remove(req)
	return err
}

func (s *Service) remove(req metaapi.RemoveReq) (metaapi.DirsResp, error) {
	if err := validName(string(req.Name)); err != nil {
		return metaapi.DirsResp{}, err
	}
	who := req.Who
	dirs, err := s.updateDirs(func(tx *txn) error {
		parent, err := dirInode(tx, req.Parent)
		if err != nil {
			return err
		}
		if err := access(parent, who, mayExec); err != nil {
			return err
		}
		_, victim, err := child(tx, parent.Ino, string(req.Name))
		if err != nil {
			return err
		}
		if err := access(parent, who, mayWrite|mayExec); err != nil {
			return err
		}
		if err := checkSticky(parent, victim, who); err != nil {
			return err
		}
		if req.Dir {
			if !victim.isDir() {
				return metaapi.Errorf(metaapi.ENOTDIR, "%q is a %s, not a directory", req.Name, victim.Type)
			}
			empty, err := isEmptyDir(tx, victim.Ino)
			if err != nil {
				return err
			}
			if !empty {
				return metaapi.Errorf(metaapi.ENOTEMPTY, "directory %q is not empty", req.Name)
			}
		} else if victim.isDir() {
			return metaapi.Errorf(metaapi.EISDIR, "%q is a directory", req.Name)
		}
		if err := tx.delEntry(parent.Ino, string(req.Name)); err != nil {
			return err
		}
		if err := unlinkInode(tx, parent, victim, req.Keep, s.opts.OrphanLease); err != nil {
			return err
		}
		touchDir(tx, parent)
		return nil
	})
	return metaapi.DirsResp{Dirs: dirs}, err
}

// Rename moves OldParent/OldName to NewParent/NewName atomically,
// replacing a compatible target as rename(2) does.
func (s *Service) Rename(req metaapi.RenameReq) error {
	_, err := s.rename(req)
	return err
}

func (s *Service) rename(req metaapi.RenameReq) (metaapi.DirsResp, error) {
	if err := validName(string(req.OldName)); err != nil {
		return metaapi.DirsResp{}, err
	}
	if err := validName(string(req.NewName)); err != nil {
		return metaapi.DirsResp{}, err
	}
	who := req.Who
	dirs, err := s.updateDirs(func(tx *txn) error {
		op, err := dirInode(tx, req.OldParent)
		if err != nil {
			return err
		}
		np, err := dirInode(tx, req.NewParent)
		if err != nil {
			return err
		}
		if err := access(op, who, mayExec); err != nil {
			return err
		}
		if err := access(np, who, mayExec); err != nil {
			return err
		}
		_, src, err := child(tx, op.Ino, string(req.OldName))
		if err != nil {
			return err
		}
		td, tfound, err := tx.entry(np.Ino, string(req.NewName))
		if err != nil {
			return err
		}
		if tfound && req.NoReplace {
			return metaapi.Errorf(metaapi.EEXIST, "%q already exists in directory %d", req.NewName, np.Ino)
		}
		if src.isDir() {
			// Moving a directory under itself would detach a cycle.
			inside, err := isAncestor(tx, src.Ino, np)
			if err != nil {
				return err
			}
			if inside {
				return metaapi.Errorf(metaapi.EINVAL, "cannot move directory %d into its own subtree", src.Ino)
			}
		}
		var tgt *inode
		if tfound {
			if td.Ino == src.Ino {
				return nil // both names already refer to the same inode
			}
			if tgt, err = tx.inode(td.Ino); err != nil {
				return err
			}
			if tgt.isDir() {
				// A target that contains the source is necessarily not empty.
				above, err := isAncestor(tx, tgt.Ino, op)
				if err != nil {
					return err
				}
				if above {
					return metaapi.Errorf(metaapi.ENOTEMPTY, "target %q contains the source", req.NewName)
				}
			}
		}
		if err := access(op, who, mayWrite|mayExec); err != nil {
			return err
		}
		if err := checkSticky(op, src, who); err != nil {
			return err
		}
		if tgt != nil {
			switch {
			case src.isDir() && !tgt.isDir():
				return metaapi.Errorf(metaapi.ENOTDIR, "cannot replace non-directory %q with a directory", req.NewName)
			case !src.isDir() && tgt.isDir():
				return metaapi.Errorf(metaapi.EISDIR, "cannot replace directory %q with a non-directory", req.NewName)
			}
		}
		if err := access(np, who, mayWrite|mayExec); err != nil {
			return err
		}
		if tgt != nil {
			if err := checkSticky(np, tgt, who); err != nil {
				return err
			}
			if tgt.isDir() {
				empty, err := isEmptyDir(tx, tgt.Ino)
				if err != nil {
					return err
				}
				if !empty {
					return metaapi.Errorf(metaapi.ENOTEMPTY, "target directory %q is not empty", req.NewName)
				}
			}
		}
		if src.isDir() && op.Ino != np.Ino {
			// Its ".." changes, which needs write permission on it.
			if err := access(src, who, mayWrite); err != nil {
				return err
			}
		}

		if tgt != nil {
			if err := unlinkInode(tx, np, tgt, req.Keep, s.opts.OrphanLease); err != nil {
				return err
			}
		}
		if err := tx.delEntry(op.Ino, string(req.OldName)); err != nil {
			return err
		}
		if err := tx.setEntry(np.Ino, string(req.NewName), dirent{Ino: src.Ino, Type: src.Type}); err != nil {
			return err
		}
		if err := unmarkTemp(tx, src.Ino); err != nil { // a put's file, in place
			return err
		}
		if src.isDir() && op.Ino != np.Ino {
			op.Nlink--
			np.Nlink++
			src.Parent = np.Ino
			tx.movedDir = true
		}
		src.Ctime = tx.now
		tx.dirty(src)
		touchDir(tx, op, np)
		return nil
	})
	return metaapi.DirsResp{Dirs: dirs}, err
}

// Readdir lists a directory in name order, one page at a time.
func (s *Service) Readdir(req metaapi.ReaddirReq) (metaapi.ReaddirResp, error) {
	out := metaapi.ReaddirResp{Entries: []metaapi.Dirent{}}
	limit := req.Limit
	switch {
	case limit < 0:
		return out, metaapi.Errorf(metaapi.EINVAL, "negative readdir limit %d", limit)
	case limit == 0 || limit > metaapi.MaxReaddirLimit:
		limit = metaapi.MaxReaddirLimit
	}
	if len(req.After) > metaapi.MaxNameLen {
		return out, metaapi.Errorf(metaapi.ENAMETOOLONG, "readdir cursor of %d bytes", len(req.After))
	}
	err := s.read(func(v view) error {
		dir, err := dirInode(v, req.Ino)
		if err != nil {
			return err
		}
		if err := access(dir, req.Who, mayRead); err != nil {
			return err
		}
		p := direntPrefix(req.Ino)
		lower := p
		if req.After != "" {
			lower = append(direntKey(req.Ino, string(req.After)), 0) // strictly after
		}
		return scan(v.r, lower, prefixEnd(p), func(k, val []byte) (bool, error) {
			if len(out.Entries) == limit {
				out.More = true
				return false, nil
			}
			d, err := decodeDirent(val)
			if err != nil {
				return false, err
			}
			out.Entries = append(out.Entries, metaapi.Dirent{Name: metaapi.ByteString(k[len(p):]), Ino: d.Ino, Type: d.Type})
			return true, nil
		})
	})
	return out, err
}

package meta

import (
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Creating inodes (the checks in namespace.go's order).

// Create makes an inode of any type: a file, directory, symbolic link,
// FIFO, socket or device node. A file that already exists is returned as
// is unless Exclusive is set.
func (s *Service) Create(req metaapi.CreateReq) (metaapi.Attr, error) {
	r, err := s.create(0, req)
	return r.Attr, err
}

func (s *Service) create(c ids.ClientID, req metaapi.CreateReq) (metaapi.AttrResp, error) {
	var out metaapi.AttrResp
	if req.TempSession != 0 && (req.Type != metaapi.TypeFile || !req.Exclusive || req.Tmpfile) {
		return out, metaapi.Errorf(metaapi.EINVAL, "only a new regular file (exclusive create) may be a temporary one")
	}
	if req.Tmpfile {
		a, err := s.tmpfile(req)
		return metaapi.AttrResp{Attr: a}, err
	}
	if err := validName(string(req.Name)); err != nil {
		return out, err
	}
	if err := validCreate(req); err != nil {
		return out, err
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
		d, found, err := tx.entry(parent.Ino, string(req.Name))
		if err != nil {
			return err
		}
		if found {
			if req.Type == metaapi.TypeFile && !req.Exclusive && d.Type == metaapi.TypeFile {
				in, err := tx.inode(d.Ino)
				if err != nil {
					return err
				}
				if err := access(in, who, req.Open&(mayRead|mayWrite)); err != nil {
					return err
				}
				out.Attr = in.Attr
				return nil
			}
			return metaapi.Errorf(metaapi.EEXIST, "%q already exists in directory %d (a %s)", req.Name, parent.Ino, d.Type)
		}
		if err := access(parent, who, mayWrite|mayExec); err != nil {
			return err
		}
		if err := mayMknod(req, who); err != nil {
			return err
		}
		in, err := s.newChild(tx, parent, req, who)
		if err != nil {
			return err
		}
		tx.newInode(in)
		if err := tx.setEntry(parent.Ino, string(req.Name), dirent{Ino: in.Ino, Type: in.Type}); err != nil {
			return err
		}
		if req.TempSession != 0 {
			if err := s.markTemp(tx, c, req.TempSession, parent.Ino, string(req.Name), in.Ino); err != nil {
				return err
			}
		}
		touchDir(tx, parent)
		out.Attr = in.Attr
		return nil
	})
	out.Dirs = dirs
	return out, err
}

// newChild builds (but does not register) the inode a create in parent
// makes: its owner, group (BSD semantics under a setgid parent, as Linux),
// mode, and what its type needs — a directory's link counts, a file's
// policy and chunk size, a symlink's target.
func (s *Service) newChild(tx *txn, parent *inode, req metaapi.CreateReq, who metaapi.Who) (*inode, error) {
	in := &inode{Attr: metaapi.Attr{
		Type: req.Type, Mode: req.Mode & modePerm, UID: who.UID, GID: who.GID, Nlink: 1,
		Atime: tx.now, Mtime: tx.now, Ctime: tx.now,
	}}
	if parent.Mode&modeSetgid != 0 {
		in.GID = parent.GID
		if req.Type == metaapi.TypeDir {
			in.Mode |= modeSetgid
		}
	}
	if req.Type != metaapi.TypeDir && in.Mode&modeSetgid != 0 && who.UID != 0 && !who.InGroup(in.GID) {
		in.Mode &^= modeSetgid
	}
	switch req.Type {
	case metaapi.TypeDir:
		in.Nlink = 2
		in.Parent = parent.Ino
		if parent.Nlink >= maxLinks*2 {
			return nil, metaapi.Errorf(metaapi.EMLINK, "directory %d has too many subdirectories", parent.Ino)
		}
		parent.Nlink++
	case metaapi.TypeFile:
		pol, _, err := effectivePolicy(tx, parent)
		if err != nil {
			return nil, err
		}
		in.ChunkSize = s.opts.ChunkSize
		in.Counted = true // Chunks counts from here (Attr.Allocated)
		if pol.EC != nil {
			in.ChunkSize = pol.EC.ChunkSize()
		}
		in.Policy = &pol
	case metaapi.TypeSymlink:
		in.Target = req.Target
		in.Size = int64(len(req.Target))
		in.Mode = 0o777
	case metaapi.TypeBlock, metaapi.TypeChar:
		in.Rdev = req.Rdev
	}
	return in, nil
}

// validCreate checks what a create asks for on its own: a known type, a
// symlink's target, a device's number.
func validCreate(req metaapi.CreateReq) error {
	switch req.Type {
	case metaapi.TypeFile, metaapi.TypeDir, metaapi.TypeFIFO, metaapi.TypeSocket, metaapi.TypeSymlink, metaapi.TypeBlock, metaapi.TypeChar:
	default:
		return metaapi.Errorf(metaapi.EINVAL, "cannot create inode of type %q", req.Type)
	}
	if req.Type == metaapi.TypeSymlink {
		if err := validTarget(string(req.Target)); err != nil {
			return err
		}
	}
	if !req.Type.IsDevice() {
		if req.Rdev != 0 {
			return metaapi.Errorf(metaapi.EINVAL, "a device number (%#x) for a %s", req.Rdev, req.Type)
		}
		return nil
	}
	if major, minor := metaapi.DevMajor(req.Rdev), metaapi.DevMinor(req.Rdev); major > metaapi.MaxDevMajor || minor > metaapi.MaxDevMinor || metaapi.Mkdev(major, minor) != req.Rdev {
		return metaapi.Errorf(metaapi.EINVAL, "device number %#x: at most %d:%d", req.Rdev, metaapi.MaxDevMajor, metaapi.MaxDevMinor)
	}
	return nil
}

// mayMknod checks the privilege a create needs beyond write access to the
// directory: device nodes are root's to make, as mknod(2) needs
// CAP_MKNOD — except the whiteout (a char device 0:0, which overlay file
// systems make for users too).
func mayMknod(req metaapi.CreateReq, who metaapi.Who) error {
	if whiteout := req.Type == metaapi.TypeChar && req.Rdev == 0; req.Type.IsDevice() && who.UID != 0 && !whiteout {
		return eperm("making a %s device as uid %d", req.Type, who.UID)
	}
	return nil
}

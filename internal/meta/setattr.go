package meta

import "github.com/sluicefs/sluice/internal/metaapi"

// SetAttr changes mode, ownership, size and times. All checks pass before
// anything changes.
func (s *Service) SetAttr(req metaapi.SetAttrReq) (metaapi.Attr, error) {
	var out metaapi.Attr
	who := req.Who
	err := s.update(func(tx *txn) error {
		in, err := tx.inode(req.Ino)
		if err != nil {
			return err
		}
		explicit := req.Atime != nil || req.Mtime != nil
		changes := req.Mode != nil || req.UID != nil || req.GID != nil || req.Size != nil || explicit || req.AtimeNow || req.MtimeNow
		kill := req.KillSuidgid && metaapi.KillSuidgid(in.Type, in.Mode) != in.Mode
		if !changes && !kill {
			out = in.Attr
			return nil
		}
		mode := in.Mode
		if req.Mode != nil {
			if !isOwner(in, who) {
				return eperm("chmod of inode %d owned by uid %d", in.Ino, in.UID)
			}
			mode = *req.Mode & modePerm
			if in.Type == metaapi.TypeSymlink {
				mode = in.Mode // a symlink's mode is always 0777
			}
			gid := in.GID
			if req.GID != nil {
				gid = *req.GID
			}
			if !in.isDir() && mode&modeSetgid != 0 && who.UID != 0 && !who.InGroup(gid) {
				mode &^= modeSetgid
			}
		}
		owner := req.UID != nil && *req.UID != in.UID
		group := req.GID != nil && *req.GID != in.GID
		if owner && who.UID != 0 {
			return eperm("chown of inode %d to uid %d by uid %d", in.Ino, *req.UID, who.UID)
		}
		if group && who.UID != 0 && (who.UID != in.UID || !who.InGroup(*req.GID)) {
			return eperm("chgrp of inode %d to gid %d by uid %d", in.Ino, *req.GID, who.UID)
		}
		if req.Size != nil {
			switch {
			case in.isDir():
				return metaapi.Errorf(metaapi.EISDIR, "cannot truncate directory %d", in.Ino)
			case in.Type != metaapi.TypeFile:
				return metaapi.Errorf(metaapi.EINVAL, "cannot truncate a %s", in.Type)
			case *req.Size < 0:
				return metaapi.Errorf(metaapi.EINVAL, "negative size %d", *req.Size)
			case *req.Size > metaapi.MaxFileSize:
				return metaapi.Errorf(metaapi.EFBIG, "size %d beyond the maximum %d", *req.Size, int64(metaapi.MaxFileSize))
			}
			if err := dataAccess(in, who, mayWrite); err != nil {
				return err
			}
		}
		if kill {
			// What the write it comes with needs: it may be a
			// non-owner's.
			if err := dataAccess(in, who, mayWrite); err != nil {
				return err
			}
		}
		switch {
		case isOwner(in, who):
		case explicit:
			return eperm("setting times of inode %d owned by uid %d", in.Ino, in.UID)
		case req.AtimeNow || req.MtimeNow:
			if err := access(in, who, mayWrite); err != nil {
				return err
			}
		}

		in.Mode = mode
		if req.UID != nil {
			in.UID = *req.UID
		}
		if req.GID != nil {
			in.GID = *req.GID
		}
		// A change of owner or group drops the privileges the bits gave
		// (unless the same call sets the mode, as NFS SETATTR may).
		if req.KillSuidgid || (req.UID != nil || req.GID != nil) && req.Mode == nil {
			in.Mode = metaapi.KillSuidgid(in.Type, in.Mode)
		}
		if req.Size != nil {
			if err := tx.resize(in, *req.Size); err != nil {
				return err
			}
			in.Mtime = tx.now
		}
		if req.Atime != nil {
			in.Atime = *req.Atime
		}
		if req.Mtime != nil {
			in.Mtime = *req.Mtime
		}
		if req.AtimeNow {
			in.Atime = tx.now
		}
		if req.MtimeNow {
			in.Mtime = tx.now
		}
		in.Ctime = tx.now
		tx.dirty(in)
		out = in.Attr
		return nil
	})
	return out, err
}

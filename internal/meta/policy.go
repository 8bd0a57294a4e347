package meta

import (
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// effectivePolicy returns the policy of the nearest directory, from dir
// upwards, that has one set, and that directory. The root always has one.
func effectivePolicy(r ns, dir *inode) (metaapi.Policy, ids.Ino, error) {
	d := dir
	for i := 0; i < maxDepth; i++ {
		if d.DirPolicy != nil {
			return *d.DirPolicy, d.Ino, nil
		}
		if d.Ino == ids.RootIno {
			return metaapi.Policy{}, 0, metaapi.Errorf(metaapi.EIO, "root directory has no policy")
		}
		var err error
		if d, err = r.inode(d.Parent); err != nil {
			return metaapi.Policy{}, 0, err
		}
	}
	return metaapi.Policy{}, 0, metaapi.Errorf(metaapi.EIO, "directory tree deeper than %d: corrupt parent chain", maxDepth)
}

// SetPolicy sets the policy new files created below a directory get.
// Existing files keep the policy they were created with.
func (s *Service) SetPolicy(req metaapi.SetPolicyReq) (metaapi.PolicyResp, error) {
	if err := req.Policy.Validate(); err != nil {
		return metaapi.PolicyResp{}, err
	}
	err := s.update(func(tx *txn) error {
		in, err := dirInode(tx, req.Ino)
		if err != nil {
			return err
		}
		if !isOwner(in, req.Who) {
			return eperm("setting the policy of directory %d owned by uid %d", in.Ino, in.UID)
		}
		p := req.Policy
		in.DirPolicy = &p
		in.Ctime = tx.now
		tx.dirty(in)
		return nil
	})
	if err != nil {
		return metaapi.PolicyResp{}, err
	}
	return metaapi.PolicyResp{Policy: req.Policy, From: req.Ino}, nil
}

// GetPolicy returns the policy in effect for an inode: a file's own
// (fixed at creation, From = the file), or for a directory the nearest
// one set on it or an ancestor.
func (s *Service) GetPolicy(req metaapi.GetPolicyReq) (metaapi.PolicyResp, error) {
	var out metaapi.PolicyResp
	err := s.read(func(v view) error {
		in, err := v.inode(req.Ino)
		if err != nil {
			return err
		}
		switch in.Type {
		case metaapi.TypeDir:
			out.Policy, out.From, err = effectivePolicy(v, in)
			return err
		case metaapi.TypeFile:
			if in.Policy == nil {
				return metaapi.Errorf(metaapi.EIO, "file %d has no policy", in.Ino)
			}
			out.Policy, out.From = *in.Policy, in.Ino
			return nil
		}
		return metaapi.Errorf(metaapi.EINVAL, "a %s has no storage policy", in.Type)
	})
	return out, err
}

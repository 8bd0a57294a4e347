package meta

import (
	"bytes"
	"encoding/binary"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Extended attributes live beside their inode:
//
//	a <ino:8> <name>                  extended attribute: its value
const pXattr = 'a'

func xattrPrefix(ino ids.Ino) []byte {
	b := make([]byte, 9, 9+32)
	b[0] = pXattr
	binary.BigEndian.PutUint64(b[1:], uint64(ino))
	return b
}

func xattrKey(ino ids.Ino, name string) []byte { return append(xattrPrefix(ino), name...) }

// xattrNamespace is the class of an attribute name, which decides who may
// see and change it.
type xattrNamespace int

const (
	nsUser xattrNamespace = iota
	nsTrusted
	nsSecurity
)

func parseXattrName(name string) (xattrNamespace, error) {
	if len(name) == 0 || len(name) > metaapi.MaxXattrName {
		return 0, metaapi.Errorf(metaapi.ERANGE, "attribute name of %d bytes (1 to %d)", len(name), metaapi.MaxXattrName)
	}
	if name == metaapi.XattrCaps {
		return 0, metaapi.Errorf(metaapi.ENOTSUP, "file capabilities (%s) are not supported: mounts are nosuid", name)
	}
	for _, ns := range []struct {
		prefix string
		ns     xattrNamespace
	}{{"user.", nsUser}, {"trusted.", nsTrusted}, {"security.", nsSecurity}} {
		if rest, ok := strings.CutPrefix(name, ns.prefix); ok {
			if rest == "" || strings.IndexByte(name, 0) >= 0 {
				return 0, metaapi.Errorf(metaapi.EINVAL, "invalid attribute name %q", name)
			}
			return ns.ns, nil
		}
	}
	if strings.HasPrefix(name, "system.") {
		return 0, metaapi.Errorf(metaapi.ENOTSUP, "%q: POSIX ACLs and other system attributes are not supported", name)
	}
	return 0, metaapi.Errorf(metaapi.ENOTSUP, "attribute %q is in no known namespace (user., trusted., security.)", name)
}

// xattrMayRead decides whether who sees attribute ns of in. A hidden
// attribute reads as absent (ENODATA), as on Linux.
func xattrMayRead(in *inode, ns xattrNamespace, who metaapi.Who) error {
	switch ns {
	case nsTrusted:
		if who.UID != 0 {
			return metaapi.Errorf(metaapi.ENODATA, "no such attribute")
		}
	case nsUser:
		if in.Type != metaapi.TypeFile && !in.isDir() {
			return metaapi.Errorf(metaapi.ENODATA, "no user attributes on a %s", in.Type)
		}
		return access(in, who, mayRead)
	}
	return nil
}

// xattrMayWrite decides whether who may set or remove attribute ns of in.
func xattrMayWrite(in *inode, ns xattrNamespace, who metaapi.Who) error {
	switch ns {
	case nsTrusted, nsSecurity:
		if who.UID != 0 {
			return eperm("only root sets trusted. and security. attributes (inode %d)", in.Ino)
		}
		return nil
	}
	if in.Type != metaapi.TypeFile && !in.isDir() {
		return eperm("user attributes on a %s (inode %d)", in.Type, in.Ino)
	}
	if in.isDir() && in.Mode&modeSticky != 0 && !isOwner(in, who) {
		return eperm("user attributes of sticky directory %d owned by uid %d", in.Ino, in.UID)
	}
	return access(in, who, mayWrite)
}

// SetXattr creates or replaces an extended attribute.
func (s *Service) SetXattr(req metaapi.SetXattrReq) error {
	ns, err := parseXattrName(string(req.Name))
	if err != nil {
		return err
	}
	switch {
	case len(req.Value) > metaapi.MaxXattrValue:
		return metaapi.Errorf(metaapi.E2BIG, "attribute value of %d bytes (at most %d)", len(req.Value), metaapi.MaxXattrValue)
	case req.Flags&^(metaapi.XattrCreate|metaapi.XattrReplace) != 0:
		return metaapi.Errorf(metaapi.EINVAL, "attribute flags %#x", req.Flags)
	}
	return s.changeXattrs(req.Ino, ns, req.Who, func(tx *txn, in *inode) error {
		total, names, found := 0, 0, false
		err := scan(tx.b, xattrPrefix(in.Ino), prefixEnd(xattrPrefix(in.Ino)), func(k, v []byte) (bool, error) {
			if string(k[9:]) == string(req.Name) {
				found = true
				return true, nil
			}
			total += len(k) - 9 + len(v)
			names += len(k) - 9 + 1
			return true, nil
		})
		if err != nil {
			return err
		}
		switch {
		case found && req.Flags&metaapi.XattrCreate != 0:
			return metaapi.Errorf(metaapi.EEXIST, "attribute %q of inode %d exists", req.Name, in.Ino)
		case !found && req.Flags&metaapi.XattrReplace != 0:
			return metaapi.Errorf(metaapi.ENODATA, "inode %d has no attribute %q", in.Ino, req.Name)
		case total+len(req.Name)+len(req.Value) > metaapi.MaxXattrTotal:
			return metaapi.Errorf(metaapi.ENOSPC, "inode %d's attributes would take %d bytes (at most %d)", in.Ino, total+len(req.Name)+len(req.Value), metaapi.MaxXattrTotal)
		case names+len(req.Name)+1 > metaapi.MaxXattrList:
			return metaapi.Errorf(metaapi.ENOSPC, "inode %d's attribute names would take %d bytes (listxattr returns at most %d)", in.Ino, names+len(req.Name)+1, metaapi.MaxXattrList)
		}
		return tx.b.Set(xattrKey(in.Ino, string(req.Name)), req.Value, nil)
	})
}

// changeXattrs runs fn, which changes the attributes of inode ino, if who
// may change those of namespace ns; the inode's ctime moves.
func (s *Service) changeXattrs(ino ids.Ino, ns xattrNamespace, who metaapi.Who, fn func(tx *txn, in *inode) error) error {
	return s.update(func(tx *txn) error {
		in, err := tx.inode(ino)
		if err != nil {
			return err
		}
		if err := xattrMayWrite(in, ns, who); err != nil {
			return err
		}
		if err := fn(tx, in); err != nil {
			return err
		}
		in.Ctime = tx.now
		tx.dirty(in)
		return nil
	})
}

// GetXattr returns an extended attribute's value.
func (s *Service) GetXattr(req metaapi.XattrReq) (metaapi.XattrResp, error) {
	var out metaapi.XattrResp
	ns, err := parseXattrName(string(req.Name))
	if err != nil {
		return out, err
	}
	err = s.read(func(v view) error {
		in, err := v.inode(req.Ino)
		if err != nil {
			return err
		}
		if err := xattrMayRead(in, ns, req.Who); err != nil {
			return err
		}
		val, closer, err := v.r.Get(xattrKey(in.Ino, string(req.Name)))
		if err == pebble.ErrNotFound {
			return metaapi.Errorf(metaapi.ENODATA, "inode %d has no attribute %q", in.Ino, req.Name)
		}
		if err != nil {
			return err
		}
		out.Value = bytes.Clone(val)
		if out.Value == nil {
			out.Value = []byte{}
		}
		return closer.Close()
	})
	return out, err
}

// ListXattr returns the names of the attributes who may see.
func (s *Service) ListXattr(req metaapi.ListXattrReq) (metaapi.ListXattrResp, error) {
	out := metaapi.ListXattrResp{Names: []metaapi.ByteString{}}
	err := s.read(func(v view) error {
		in, err := v.inode(req.Ino)
		if err != nil {
			return err
		}
		return scan(v.r, xattrPrefix(in.Ino), prefixEnd(xattrPrefix(in.Ino)), func(k, _ []byte) (bool, error) {
			// Listing needs no permission on the inode (as on Linux:
			// getting a value does); trusted. names are root's alone.
			name := string(k[9:])
			if ns, err := parseXattrName(name); err == nil && (ns != nsTrusted || req.Who.UID == 0) {
				out.Names = append(out.Names, metaapi.ByteString(name))
			}
			return true, nil
		})
	})
	return out, err
}

// RemoveXattr deletes an extended attribute.
func (s *Service) RemoveXattr(req metaapi.XattrReq) error {
	ns, err := parseXattrName(string(req.Name))
	if err != nil {
		return err
	}
	return s.changeXattrs(req.Ino, ns, req.Who, func(tx *txn, in *inode) error {
		key := xattrKey(in.Ino, string(req.Name))
		_, closer, err := tx.b.Get(key)
		if err == pebble.ErrNotFound {
			return metaapi.Errorf(metaapi.ENODATA, "inode %d has no attribute %q", in.Ino, req.Name)
		}
		if err != nil {
			return err
		}
		closer.Close()
		return tx.b.Delete(key, nil)
	})
}

// dropXattrs deletes ino's attributes, key by key: most inodes have none,
// and a range tombstone per freed inode would slow every later read.
func (tx *txn) dropXattrs(ino ids.Ino) error {
	var keys [][]byte
	err := scan(tx.b, xattrPrefix(ino), prefixEnd(xattrPrefix(ino)), func(k, _ []byte) (bool, error) {
		keys = append(keys, bytes.Clone(k))
		return true, nil
	})
	for _, k := range keys {
		if err == nil {
			err = tx.b.Delete(k, nil)
		}
	}
	return err
}

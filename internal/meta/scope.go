package meta

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Scopes: a principal confined to a directory reaches only what lies
// beneath it. A directory is beneath root if root is on its chain of
// parents; a file, symlink or device (which may have several names, and
// no parent pointer) if one of its names is: the link index below lists
// the directories naming each non-directory inode. A file with no name
// left (removed while open, or an O_TMPFILE) is judged by the directory
// its last name was in, or that it was made in.
//
//	h <ino:8> <parent:8> <name>   a name of non-directory ino: empty
//	q <ino:8>                     the directory of ino's last name: <parent:8>
const (
	pLink       = 'h'
	pLastParent = 'q'
)

// maxScopeDepth bounds the walk up a directory chain (a cycle would be a
// corrupt database, which must not hang a call).
const maxScopeDepth = 4096

// maxScopeLinks bounds the names of one file examined for a scope check
// (past them it counts as outside: a file with that many names in other
// directories is not worth a long walk).
const maxScopeLinks = 256

func linkKey(ino, parent ids.Ino, name string) []byte {
	k := make([]byte, 0, 17+len(name))
	k = append(k, pLink)
	k = binary.BigEndian.AppendUint64(k, uint64(ino))
	k = binary.BigEndian.AppendUint64(k, uint64(parent))
	return append(k, name...)
}

func linkPrefix(ino ids.Ino) []byte {
	return binary.BigEndian.AppendUint64([]byte{pLink}, uint64(ino))
}

func lastParentKey(ino ids.Ino) []byte {
	return binary.BigEndian.AppendUint64([]byte{pLastParent}, uint64(ino))
}

// indexLink records (or with del, forgets) that directory parent names
// non-directory d.Ino; forgetting a name remembers parent as the last.
func (tx *txn) indexLink(parent ids.Ino, name string, d dirent, del bool) error {
	if d.Type == metaapi.TypeDir {
		return nil
	}
	if !del {
		return tx.b.Set(linkKey(d.Ino, parent, name), nil, nil)
	}
	if err := tx.b.Delete(linkKey(d.Ino, parent, name), nil); err != nil {
		return err
	}
	return tx.setLastParent(d.Ino, parent)
}

func (tx *txn) setLastParent(ino, parent ids.Ino) error {
	return tx.b.Set(lastParentKey(ino), binary.BigEndian.AppendUint64(nil, uint64(parent)), nil)
}

// within reports whether ino lies beneath directory root (see above).
func within(v ns, ino, root ids.Ino) (bool, error) {
	if root == ids.RootIno || ino == root {
		return true, nil
	}
	in, err := v.inode(ino)
	if err != nil {
		return false, err
	}
	if in.isDir() {
		return dirWithin(v, in, root)
	}
	var parents []ids.Ino
	prefix := linkPrefix(ino)
	err = scan(v.reader(), prefix, prefixEnd(prefix), func(k, _ []byte) (bool, error) {
		if len(k) < 17 {
			return false, fmt.Errorf("link index key %x too short", k)
		}
		p := ids.Ino(binary.BigEndian.Uint64(k[9:17]))
		if len(parents) == 0 || parents[len(parents)-1] != p {
			parents = append(parents, p)
		}
		return len(parents) < maxScopeLinks, nil
	})
	if err != nil {
		return false, err
	}
	if len(parents) == 0 {
		raw, found, err := getRaw(v.reader(), lastParentKey(ino))
		if err != nil || !found || len(raw) != 8 {
			return false, err
		}
		parents = append(parents, ids.Ino(binary.BigEndian.Uint64(raw)))
	}
	for _, p := range parents {
		dir, err := v.inode(p)
		if err != nil {
			continue // a directory removed since: not a way in
		}
		if ok, err := dirWithin(v, dir, root); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}

// dirWithin walks dir's chain of parents looking for root.
func dirWithin(v ns, dir *inode, root ids.Ino) (bool, error) {
	for range maxScopeDepth {
		if dir.Ino == root {
			return true, nil
		}
		if dir.Ino == ids.RootIno || !dir.isDir() {
			return false, nil
		}
		next, err := v.inode(dir.Parent)
		if err != nil {
			return false, err
		}
		dir = next
	}
	return false, fmt.Errorf("directory %d: parent chain longer than %d", dir.Ino, maxScopeDepth)
}

// indexLinks brings a database of schema 2 to 3: it builds the link
// index from every directory entry (idempotent, so an interrupted run is
// simply repeated), then records the new schema.
func (s *Service) indexLinks() error {
	b := s.db.NewBatch()
	n := 0
	flush := func() error {
		err := b.Commit(pebble.Sync)
		b.Close()
		b = s.db.NewBatch()
		return err
	}
	err := scan(s.db, []byte{pDirent}, []byte{pDirent + 1}, func(k, v []byte) (bool, error) {
		d, err := decodeDirent(v)
		if len(k) < 9 || err != nil {
			s.log.Error("indexing names: an entry does not decode; left out", "key", fmt.Sprintf("%x", k))
			return true, nil
		}
		if d.Type == metaapi.TypeDir {
			return true, nil
		}
		if err := b.Set(linkKey(d.Ino, ids.Ino(beUint64(k[1:9])), string(k[9:])), nil, nil); err != nil {
			return false, err
		}
		if n++; n%4096 == 0 {
			return true, flush()
		}
		return true, nil
	})
	if err == nil {
		err = b.Set(keySchema, []byte(schemaVersion), nil)
	}
	if err == nil {
		err = b.Commit(pebble.Sync)
	}
	b.Close()
	if err == nil {
		s.log.Info("indexed the names of files", "names", n, "schema", schemaVersion)
	}
	return err
}

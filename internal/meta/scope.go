package meta

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

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
	if tx.freed[d.Ino] {
		return nil // freed already (a rename over it): nothing to remember
	}
	return tx.setLastParent(d.Ino, parent)
}

func (tx *txn) setLastParent(ino, parent ids.Ino) error {
	return tx.b.Set(lastParentKey(ino), binary.BigEndian.AppendUint64(nil, uint64(parent)), nil)
}

// within reports whether ino lies beneath directory root (see above),
// remembering in sc (if not nil) the directories it judged.
func within(v ns, ino, root ids.Ino, sc *scopeCache, gen uint64) (bool, error) {
	if root == ids.RootIno || ino == root {
		return true, nil
	}
	in, err := v.inode(ino)
	if err != nil {
		return false, err
	}
	if in.isDir() {
		return dirWithin(v, in, root, sc, gen)
	}
	// Each directory naming the file, once: its names in one directory
	// are skipped over with one seek.
	prefix := linkPrefix(ino)
	it, err := v.reader().NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return false, err
	}
	defer it.Close()
	named := false
	for valid := it.First(); valid; {
		k := it.Key()
		if len(k) < 17 {
			return false, fmt.Errorf("link index key %x too short", k)
		}
		named = true
		p := ids.Ino(binary.BigEndian.Uint64(k[9:17]))
		if dir, err := v.inode(p); err == nil {
			if ok, err := dirWithin(v, dir, root, sc, gen); ok || err != nil {
				return ok, err
			}
		}
		if p == ^ids.Ino(0) {
			break
		}
		valid = it.SeekGE(binary.BigEndian.AppendUint64(slices.Clone(prefix), uint64(p+1)))
	}
	if err := it.Error(); err != nil {
		return false, err
	}
	if named {
		return false, nil
	}
	raw, found, err := getRaw(v.reader(), lastParentKey(ino))
	if err != nil || !found || len(raw) != 8 {
		return false, err
	}
	dir, err := v.inode(ids.Ino(binary.BigEndian.Uint64(raw)))
	if err != nil {
		return false, nil // its last directory is gone too
	}
	return dirWithin(v, dir, root, sc, gen)
}

// dirWithin walks dir's chain of parents looking for root, stopping at a
// directory sc already judged.
func dirWithin(v ns, dir *inode, root ids.Ino, sc *scopeCache, gen uint64) (bool, error) {
	var walked []ids.Ino
	result := false
	for range maxScopeDepth {
		if dir.Ino == root {
			result = true
			break
		}
		if dir.Ino == ids.RootIno || !dir.isDir() {
			break
		}
		if known, ok := sc.get(dir.Ino, gen); ok {
			result = known
			break
		}
		walked = append(walked, dir.Ino)
		next, err := v.inode(dir.Parent)
		if err != nil {
			return false, err
		}
		dir = next
	}
	if len(walked) == maxScopeDepth {
		return false, metaapi.Errorf(metaapi.EACCES, "directory %d lies more than %d levels below any directory judged: cannot tell whether it is within reach", walked[0], maxScopeDepth)
	}
	sc.put(walked, result, gen)
	return result, nil
}

// scopeCache remembers, for one principal, which directories lie beneath
// its root. A directory's ancestry changes only when a directory is moved
// (rename, or the namespace check linking one into lost+found), which
// bumps meta's scope generation and so empties every cache.
type scopeCache struct {
	mu  sync.Mutex
	gen uint64
	in  map[ids.Ino]bool
}

// maxScopeCache bounds a principal's cache (it starts over when full).
const maxScopeCache = 1 << 16

func (c *scopeCache) get(ino ids.Ino, gen uint64) (bool, bool) {
	if c == nil {
		return false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return false, false
	}
	v, ok := c.in[ino]
	return v, ok
}

func (c *scopeCache) put(inos []ids.Ino, within bool, gen uint64) {
	if c == nil || len(inos) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.in == nil || c.gen != gen || len(c.in)+len(inos) > maxScopeCache {
		c.gen, c.in = gen, make(map[ids.Ino]bool)
	}
	for _, ino := range inos {
		c.in[ino] = within
	}
}

// indexLinks brings a database of schema 2 to 3: it builds the link
// index from every directory entry.
func (s *Service) indexLinks() error {
	return s.buildIndex(pDirent, schemaVersion, "the names of files", func(b *pebble.Batch, k, v []byte) (bool, error) {
		d, err := decodeDirent(v)
		if len(k) < 9 || err != nil {
			s.log.Error("indexing names: an entry does not decode; left out", "key", fmt.Sprintf("%x", k))
			return false, nil
		}
		if d.Type == metaapi.TypeDir {
			return false, nil
		}
		return true, b.Set(linkKey(d.Ino, ids.Ino(beUint64(k[1:9])), string(k[9:])), nil, nil)
	})
}

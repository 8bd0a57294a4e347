package meta

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// ns is what namespace logic reads through: committed state (view) or a
// mutation in progress (txn).
type ns interface {
	// inode returns the inode, or ENOENT. Callers of a view get a copy;
	// callers of a txn get the txn's own instance, to modify and mark
	// with txn.dirty.
	inode(ino ids.Ino) (*inode, error)
	// entry looks name up in directory parent.
	entry(parent ids.Ino, name string) (dirent, bool, error)
	// reader gives prefix scans.
	reader() pebble.Reader
}

// view reads committed state. It is used under Service.mu.RLock so a
// multi-key read sees one consistent state.
type view struct{ r pebble.Reader }

func (v view) reader() pebble.Reader { return v.r }

func (v view) inode(ino ids.Ino) (*inode, error) { return loadInode(v.r, ino) }

func (v view) entry(parent ids.Ino, name string) (dirent, bool, error) {
	return loadEntry(v.r, parent, name)
}

func loadInode(r pebble.Reader, ino ids.Ino) (*inode, error) {
	in := new(inode)
	found, err := getJSON(r, inodeKey(ino), in)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, metaapi.Errorf(metaapi.ENOENT, "no inode %d", ino)
	}
	return in, nil
}

func loadEntry(r pebble.Reader, parent ids.Ino, name string) (dirent, bool, error) {
	raw, found, err := getRaw(r, direntKey(parent, name))
	if err != nil || !found {
		return dirent{}, false, err
	}
	d, err := decodeDirent(raw)
	return d, err == nil, err
}

// txn is one mutation: an indexed pebble batch (so its own writes are
// visible to its reads and scans), a cache of the inodes it touched (so two
// references to one inode — a rename within one directory, say — share one
// instance), a copy of the counters, and in-memory side effects to apply
// once the batch is committed. Service.update commits it atomically.
type txn struct {
	b      *pebble.Batch
	now    int64 // unix nanoseconds, one timestamp for the whole mutation
	ctr    counters
	ctr0   counters
	inodes map[ids.Ino]*inode
	dirtyI map[ids.Ino]bool
	freed  map[ids.Ino]bool
	after  []func() // run after a successful commit, still under the lock
	// goneUntil is how long nodes keep the tombstone of a chunk this
	// mutation deletes: past every capability minted before it.
	goneUntil int64
	// touched are the directories whose entries changed (see touchDir).
	touched []*inode
	// movedDir: a directory changed parents (scope.go's caches).
	movedDir bool
}

func (tx *txn) reader() pebble.Reader { return tx.b }

func (tx *txn) inode(ino ids.Ino) (*inode, error) {
	if tx.freed[ino] {
		return nil, metaapi.Errorf(metaapi.ENOENT, "no inode %d", ino)
	}
	if in, ok := tx.inodes[ino]; ok {
		return in, nil
	}
	in, err := loadInode(tx.b, ino)
	if err != nil {
		return nil, err
	}
	tx.inodes[ino] = in
	return in, nil
}

func (tx *txn) entry(parent ids.Ino, name string) (dirent, bool, error) {
	return loadEntry(tx.b, parent, name)
}

// dirty marks inodes to be written at commit.
func (tx *txn) dirty(ins ...*inode) {
	for _, in := range ins {
		tx.inodes[in.Ino] = in
		tx.dirtyI[in.Ino] = true
	}
}

// newInode allocates an inode number and registers in as dirty.
func (tx *txn) newInode(in *inode) {
	in.Ino = tx.ctr.NextIno
	tx.ctr.NextIno++
	if in.isDir() {
		tx.ctr.Dirs++
	} else {
		tx.ctr.Files++
	}
	tx.dirty(in)
}

// setEntry sets (or replaces) a directory entry, keeping the link index
// (scope.go) in step.
func (tx *txn) setEntry(parent ids.Ino, name string, d dirent) error {
	if err := tx.unindex(parent, name); err != nil {
		return err
	}
	if err := tx.indexLink(parent, name, d, false); err != nil {
		return err
	}
	return tx.b.Set(direntKey(parent, name), encodeDirent(d), nil)
}

func (tx *txn) delEntry(parent ids.Ino, name string) error {
	if err := tx.unindex(parent, name); err != nil {
		return err
	}
	return tx.b.Delete(direntKey(parent, name), nil)
}

// unindex drops the link index entry of the name being replaced or removed.
// An entry that does not decode (being repaired) had no index entry.
func (tx *txn) unindex(parent ids.Ino, name string) error {
	raw, found, err := getRaw(tx.b, direntKey(parent, name))
	if err != nil || !found {
		return err
	}
	old, err := decodeDirent(raw)
	if err != nil {
		return nil
	}
	return tx.indexLink(parent, name, old, true)
}

func (tx *txn) setJSON(key []byte, v any) error { return tx.b.Set(key, mustJSON(v), nil) }

// setOrphan records that file ino, which has no name left, is kept open
// until the lease expiry (unix ns) unless renewed or released.
func (tx *txn) setOrphan(ino ids.Ino, expiry int64) error {
	return tx.b.Set(orphanKey(ino), binary.BigEndian.AppendUint64(nil, uint64(expiry)), nil)
}

// free deletes an inode whose last name is gone; a file's chunks are
// queued for deletion on every node holding a replica.
func (tx *txn) free(in *inode) error {
	if in.Type == metaapi.TypeFile {
		if err := tx.dropChunks(in.Ino, 0); err != nil {
			return err
		}
	}
	if in.isDir() {
		tx.ctr.Dirs--
	} else {
		tx.ctr.Files--
	}
	tx.freed[in.Ino] = true
	delete(tx.dirtyI, in.Ino)
	if err := tx.b.Delete(orphanKey(in.Ino), nil); err != nil {
		return err
	}
	if err := tx.b.Delete(lastParentKey(in.Ino), nil); err != nil {
		return err
	}
	if err := tx.dropXattrs(in.Ino); err != nil {
		return err
	}
	return tx.b.Delete(inodeKey(in.Ino), nil)
}

// dropChunks deletes the chunk records of ino with index >= from and
// queues each replica for deletion on its node.
func (tx *txn) dropChunks(ino ids.Ino, from int64) error {
	var recs []chunkRec
	var keys [][]byte
	err := scan(tx.b, chunkKey(ino, from), prefixEnd(chunkPrefix(ino)), func(k, v []byte) (bool, error) {
		var c chunkRec
		if err := json.Unmarshal(v, &c); err != nil {
			return false, fmt.Errorf("decoding chunk record %q: %w", k, err)
		}
		recs = append(recs, c)
		keys = append(keys, append([]byte(nil), k...))
		return true, nil
	})
	if err != nil {
		return err
	}
	until := binary.BigEndian.AppendUint64(nil, uint64(tx.goneUntil))
	for i, c := range recs {
		// Every node that holds or may hold a copy: members, and former
		// members a reconciliation under way was still copying from.
		for _, n := range append(slices.Clone(c.Nodes), c.Replaced...) {
			if err := tx.b.Set(gcKey(n, c.ID), until, nil); err != nil {
				return err
			}
		}
		if err := tx.b.Delete(keys[i], nil); err != nil {
			return err
		}
		if err := tx.b.Delete(chunkIDKey(c.ID), nil); err != nil {
			return err
		}
		if err := tx.b.Delete(degradedKey(ino, int64(beUint64(keys[i][9:]))), nil); err != nil {
			return err
		}
	}
	tx.ctr.Chunks -= int64(len(recs))
	if in, ok := tx.inodes[ino]; ok && len(recs) > 0 { // the caller writes it back (or frees it)
		in.Chunks = max(in.Chunks-int64(len(recs)), 0)
		if in.ChunkEnd = 0; from > 0 {
			if in.ChunkEnd, err = chunkEnd(tx.b, ino, from); err != nil {
				return err
			}
		}
	}
	return nil
}

// chunkEnd is one past the highest index of ino's chunks below before, 0
// if none: one seek back from before over the chunk records.
func chunkEnd(r pebble.Reader, ino ids.Ino, before int64) (int64, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: chunkPrefix(ino), UpperBound: chunkKey(ino, max(before, 0))})
	if err != nil {
		return 0, err
	}
	end := int64(0)
	if it.Last() {
		if k := it.Key(); len(k) == 17 {
			end = int64(beUint64(k[9:])) + 1
		}
	}
	return end, errors.Join(it.Error(), it.Close())
}

// flush writes the dirty inodes and the counters into the batch.
func (tx *txn) flush() error {
	for ino := range tx.dirtyI {
		if err := tx.setJSON(inodeKey(ino), tx.inodes[ino]); err != nil {
			return err
		}
	}
	if tx.ctr != tx.ctr0 {
		return tx.setJSON(keyCounters, &tx.ctr)
	}
	return nil
}

// read runs fn over committed state under the read lock and returns once
// everything fn could have observed is durable.
// contained runs fn, turning a panic into an internal error: a bug met by
// one call must not leave meta's lock held (every later call would wait
// forever) or apply half a mutation (its batch is dropped).
func contained(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return fn()
}

package meta

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The key space of meta.db. Integers are big-endian so that keys sort in
// numeric order and a prefix scan visits a directory's entries by name and
// a file's chunks by index.
//
//	v/schema                          schema version (decimal text)
//	v/counters                        counters (JSON): next ino/chunk/node id, epoch, object counts
//	v/capkeys                         capability key ids and revocations (JSON capKeyState, capkeys.go)
//	i <ino:8>                         inode (JSON inode)
//	d <parent:8> <name>               directory entry: <ino:8> <type:1>
//	k <ino:8> <index:8>               chunk of a file (JSON chunkRec)
//	c <chunk:8>                       the chunk's record: <ino:8> <index:8> (inventory.go)
//	g <node:4> <chunk:8>              chunk queued for deletion on node: empty (a copy moved
//	                                  elsewhere) or <until:8> (a chunk deleted; see goneUntil)
//	n <node:4>                        storage node (JSON nodeRec)
//	o <ino:8>                         orphan: a file with no name kept while open; <lease expiry:8> (unix ns)
//	a <ino:8> <name>                  extended attribute: its value (xattr.go)
//	h <ino:8> <parent:8> <name>       a name of a non-directory inode (scope.go)
//	q <ino:8>                         the directory of a nameless file's last name (scope.go)
//	p <id:8>                          principal (JSON principalRec, principal.go)
//	j <token:8>                       join token: JSON joinRec (join.go)
//	C <node:4>                        the node's current certificate: JSON nodeCertRec (nodecert.go)
const (
	pInode   = 'i'
	pDirent  = 'd'
	pChunk   = 'k'
	pChunkID = 'c'
	pGC      = 'g'
	pNode    = 'n'
	// pDegraded indexes erasure-coded stripe groups a write left degraded
	// (some units ahead of the others) until a repair makes them whole.
	pDegraded = 'x'
	pOrphan   = 'o'
)

var (
	keySchema   = []byte("v/schema")
	keyCounters = []byte("v/counters")
	keyCapKeys  = []byte("v/capkeys")
)

// schemaVersion is bumped on incompatible changes to the key space.
// 2: the chunk id index (c); a database at 1 is brought to 2 at open.
// 3: the link index (l, q); a database at 2 is brought to 3 at open.
const schemaVersion = "3"

func inodeKey(ino ids.Ino) []byte {
	b := make([]byte, 9)
	b[0] = pInode
	binary.BigEndian.PutUint64(b[1:], uint64(ino))
	return b
}

func direntPrefix(parent ids.Ino) []byte {
	b := make([]byte, 9, 9+16)
	b[0] = pDirent
	binary.BigEndian.PutUint64(b[1:], uint64(parent))
	return b
}

func direntKey(parent ids.Ino, name string) []byte {
	return append(direntPrefix(parent), name...)
}

func chunkPrefix(ino ids.Ino) []byte {
	b := make([]byte, 9, 17)
	b[0] = pChunk
	binary.BigEndian.PutUint64(b[1:], uint64(ino))
	return b
}

func chunkKey(ino ids.Ino, index int64) []byte {
	return binary.BigEndian.AppendUint64(chunkPrefix(ino), uint64(index))
}

func orphanKey(ino ids.Ino) []byte {
	b := make([]byte, 9)
	b[0] = pOrphan
	binary.BigEndian.PutUint64(b[1:], uint64(ino))
	return b
}

func degradedKey(ino ids.Ino, index int64) []byte {
	b := make([]byte, 1, 17)
	b[0] = pDegraded
	b = binary.BigEndian.AppendUint64(b, uint64(ino))
	return binary.BigEndian.AppendUint64(b, uint64(index))
}

func chunkIDKey(id ids.ChunkID) []byte {
	b := make([]byte, 9)
	b[0] = pChunkID
	binary.BigEndian.PutUint64(b[1:], uint64(id))
	return b
}

func encodeChunkRef(ino ids.Ino, index int64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(ino)), uint64(index))
}

func decodeChunkRef(v []byte) (chunkRef, error) {
	if len(v) != 16 {
		return chunkRef{}, fmt.Errorf("corrupt chunk id index entry: %d bytes", len(v))
	}
	return chunkRef{ino: ids.Ino(beUint64(v)), index: int64(beUint64(v[8:]))}, nil
}

func gcPrefix(node ids.NodeID) []byte {
	b := make([]byte, 5, 13)
	b[0] = pGC
	binary.BigEndian.PutUint32(b[1:], uint32(node))
	return b
}

func gcKey(node ids.NodeID, chunk ids.ChunkID) []byte {
	return binary.BigEndian.AppendUint64(gcPrefix(node), uint64(chunk))
}

// A collection key's value says what the node does with its copy: a
// retired copy (moved elsewhere) carries the epoch it was retired at
// (retiredValue; empty in records from before); a gone chunk its
// tombstone's end (8 bytes, see txn.go).
const retiredTag = 'r'

func retiredValue(epoch uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{retiredTag}, epoch)
}

// retiredEpoch decodes a retired copy's value (0: not recorded).
func retiredEpoch(v []byte) uint64 {
	if len(v) == 9 && v[0] == retiredTag {
		return binary.BigEndian.Uint64(v[1:])
	}
	return 0
}

func nodeKey(id ids.NodeID) []byte {
	b := make([]byte, 5)
	b[0] = pNode
	binary.BigEndian.PutUint32(b[1:], uint32(id))
	return b
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}

// ---- records ----

// inode is the stored form of an inode: its attributes plus what only meta
// needs.
type inode struct {
	metaapi.Attr
	// Parent is the directory containing a directory (directories have
	// exactly one name); the root is its own parent. Zero for other types,
	// which may have several names.
	Parent ids.Ino `json:"parent,omitempty"`
	// DirPolicy is the policy set on a directory with SetPolicy, if any.
	DirPolicy *metaapi.Policy `json:"dir_policy,omitempty"`
	// Linkable: a nameless file made with Tmpfile that Link may name
	// (Linux's I_LINKABLE). Any other file with no name stays nameless.
	Linkable bool `json:"linkable,omitempty"`
}

func (in *inode) isDir() bool { return in.Type == metaapi.TypeDir }

// dirent is the value of a directory entry.
type dirent struct {
	Ino  ids.Ino
	Type metaapi.FileType
}

var typeCodes = map[metaapi.FileType]byte{
	metaapi.TypeFile: 1, metaapi.TypeDir: 2, metaapi.TypeSymlink: 3, metaapi.TypeFIFO: 4,
	metaapi.TypeSocket: 5, metaapi.TypeBlock: 6, metaapi.TypeChar: 7,
}

var codeTypes = map[byte]metaapi.FileType{
	1: metaapi.TypeFile, 2: metaapi.TypeDir, 3: metaapi.TypeSymlink, 4: metaapi.TypeFIFO,
	5: metaapi.TypeSocket, 6: metaapi.TypeBlock, 7: metaapi.TypeChar,
}

func encodeDirent(d dirent) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 9), uint64(d.Ino))
	return append(b, typeCodes[d.Type])
}

func decodeDirent(b []byte) (dirent, error) {
	if len(b) != 9 {
		return dirent{}, fmt.Errorf("corrupt directory entry: %d bytes", len(b))
	}
	t, ok := codeTypes[b[8]]
	if !ok {
		return dirent{}, fmt.Errorf("corrupt directory entry: type %d", b[8])
	}
	return dirent{Ino: ids.Ino(binary.BigEndian.Uint64(b)), Type: t}, nil
}

// chunkRec is one chunk of a file.
type chunkRec struct {
	ID      ids.ChunkID  `json:"id"`
	Version uint64       `json:"version"`
	Nodes   []ids.NodeID `json:"nodes"` // replica set, in chain order
	// ZeroFrom, when non-zero, is the chunk-relative offset from which the
	// stored bytes are stale (a truncation inside the chunk) and read as
	// zeros. See metaapi.ChunkLayout.ZeroFrom.
	ZeroFrom int64 `json:"zero_from,omitempty"`
	// Epoch is the cluster epoch at which the replica set last changed
	// (or was last reconciled): members are fenced at it.
	Epoch uint64 `json:"epoch,omitempty"`
	// Reconciling: a reconciliation is under way (writes wait for it).
	// Fresh are members it placed, which hold nothing of the chunk yet;
	// Corrupt members found holding blocks that fail their checksums (by
	// a scrub, a read or a repair), with Bad their bad bytes where known
	// (a Corrupt member without an entry counts as bad throughout).
	Reconciling bool                       `json:"reconciling,omitempty"`
	Fresh       []ids.NodeID               `json:"fresh,omitempty"`
	Corrupt     []ids.NodeID               `json:"corrupt,omitempty"`
	Bad         map[ids.NodeID]extent.List `json:"bad,omitempty"`
	// Replaced are former members a reconciliation under way took out;
	// their copies are collected when it is done.
	Replaced []ids.NodeID `json:"replaced,omitempty"`
	// Leaving are members on draining nodes a reconciliation under way
	// added a member for (the set is one larger meanwhile); they leave
	// the set when it is done.
	Leaving []ids.NodeID `json:"leaving,omitempty"`
}

// nodeRec is a storage node as persisted. Liveness is not persisted: after
// a restart every node is down until it is heard from again.
type nodeRec struct {
	ID            ids.NodeID `json:"id"`
	Addr          string     `json:"addr"`
	Domain        string     `json:"domain,omitempty"`
	Capacity      int64      `json:"capacity"`
	Used          int64      `json:"used"`
	Free          int64      `json:"free"`
	Chunks        int64      `json:"chunks"`
	LastHeartbeat int64      `json:"last_heartbeat"`
	Draining      bool       `json:"draining,omitempty"`
	Reclaimable   int64      `json:"reclaimable,omitempty"`
	Disk          string     `json:"disk,omitempty"`
	FSSize        int64      `json:"fs_size,omitempty"`
}

// counters are the singletons every mutation may touch.
type counters struct {
	NextIno   ids.Ino     `json:"next_ino"`
	NextChunk ids.ChunkID `json:"next_chunk"`
	NextNode  ids.NodeID  `json:"next_node"`
	Epoch     uint64      `json:"epoch"`
	Files     int64       `json:"files"` // non-directory inodes
	Dirs      int64       `json:"dirs"`  // directories, including the root
	Chunks    int64       `json:"chunks"`
	// NextPrincipal is the next principal id (principal.go); 0 in a
	// database from before principals.
	NextPrincipal ids.ClientID `json:"next_principal,omitempty"`
	// RestoredChunks: chunk ids below it were given out before the last
	// restore from a backup (the backup's NextChunk), so their records
	// may name the members of the backup's time and a copy found
	// elsewhere may be adopted (reconcile.go). 0: never restored.
	RestoredChunks ids.ChunkID `json:"restored_chunks,omitempty"`
}

// ---- reading ----

// getJSON reads key into v; found is false if the key is absent.
func getJSON(r pebble.Reader, key []byte, v any) (found bool, err error) {
	raw, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("decoding %q: %w", key, err)
	}
	return true, nil
}

func getRaw(r pebble.Reader, key []byte) ([]byte, bool, error) {
	raw, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer closer.Close()
	return append([]byte(nil), raw...), true, nil
}

// scan calls fn for each key in [lower, upper) in order until fn returns
// false or an error. Key and value are only valid during the call.
func scan(r pebble.Reader, lower, upper []byte, fn func(k, v []byte) (bool, error)) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return err
		}
		more, err := fn(it.Key(), v)
		if err != nil {
			it.Close()
			return err
		}
		if !more {
			break
		}
	}
	if err := it.Error(); err != nil {
		it.Close()
		return err
	}
	return it.Close()
}

// keyCursor tells, for keys asked in increasing order, whether each is
// present under one prefix: a merge join of two sorted key spaces with
// one iterator, rather than a lookup per key.
type keyCursor struct {
	it    *pebble.Iterator
	valid bool
}

// newKeyCursor opens a cursor over the keys prefix+suffix, suffix >= from.
func newKeyCursor(r pebble.Reader, prefix byte, from []byte) (*keyCursor, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: append([]byte{prefix}, from...), UpperBound: []byte{prefix + 1}})
	if err != nil {
		return nil, err
	}
	return &keyCursor{it: it, valid: it.First()}, nil
}

// has reports whether prefix+suffix exists; suffixes come in increasing
// order.
func (c *keyCursor) has(suffix []byte) bool {
	for c.valid && bytes.Compare(c.it.Key()[1:], suffix) < 0 {
		c.valid = c.it.Next()
	}
	return c.valid && bytes.Equal(c.it.Key()[1:], suffix)
}

func (c *keyCursor) close() error {
	err := c.it.Error()
	return errors.Join(err, c.it.Close())
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("meta: encoding %T: %v", v, err)) // only our own plain structs are encoded
	}
	return b
}

package meta

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// checkRecords checks the records beside the namespace: chunks and their
// id index, the counters, the lock tables, the node ids. Whatever is
// wrong there is a metadata problem, left to an operator.
func (c *checker) checkRecords() error {
	chunkIDs := map[ids.ChunkID]bool{}
	// Records are in inode order: count each file's run of them.
	var runIno ids.Ino
	var run, runEnd int64
	err := c.scan(pChunk, func(k, val []byte) (bool, error) {
		c.chunks++
		if len(k) != 17 {
			c.metadataf("malformed chunk key %x", k)
			return true, nil
		}
		ino := ids.Ino(beUint64(k[1:9]))
		if ino != runIno {
			c.checkChunkCount(runIno, run, runEnd)
			runIno, run = ino, 0
		}
		run++
		index := int64(beUint64(k[9:17]))
		runEnd = index + 1 // in index order: the run's last is its highest
		var rec chunkRec
		if err := json.Unmarshal(val, &rec); err != nil {
			c.metadataf("chunk %d of inode %d: record does not decode: %v", index, ino, err)
			return true, nil
		}
		if n, ok := c.inodes[ino]; !ok || n.typ != metaapi.TypeFile && n.typ != "" {
			c.metadataf("chunk %v (index %d) belongs to missing or non-file inode %d", rec.ID, index, ino)
		}
		if chunkIDs[rec.ID] {
			c.metadataf("chunk id %v used twice", rec.ID)
		}
		chunkIDs[rec.ID] = true
		raw, found, err := getRaw(c.r, chunkIDKey(rec.ID))
		if err != nil {
			return false, err
		}
		if ref, err := decodeChunkRef(raw); !found || err != nil || ref != (chunkRef{ino, index}) {
			c.metadataf("chunk %v (index %d of inode %d) is not indexed by id (found=%v, %+v, %v)", rec.ID, index, ino, found, ref, err)
		}
		if rec.ID == 0 || rec.ID >= c.ctr.NextChunk {
			c.metadataf("chunk id %v not below the counter %v", rec.ID, c.ctr.NextChunk)
		}
		if len(rec.Nodes) == 0 {
			c.metadataf("chunk %v has no replicas", rec.ID)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	c.checkChunkCount(runIno, run, runEnd)
	for ino, n := range c.inodes { // counted files with no record at all
		if n.chunks > 0 || n.chunks == 0 && n.chunkEnd != 0 {
			c.checkChunkCount(ino, 0, 0)
		}
	}
	var indexed int64
	err = c.scan(pChunkID, func(k, _ []byte) (bool, error) {
		indexed++
		if len(k) != 9 || !chunkIDs[ids.ChunkID(beUint64(k[1:]))] {
			c.metadataf("chunk id index entry %x names no chunk record", k)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	if indexed != c.chunks {
		c.metadataf("%d chunk id index entries for %d chunk records", indexed, c.chunks)
	}
	if c.files != c.ctr.Files || c.dirs != c.ctr.Dirs || c.chunks != c.ctr.Chunks {
		c.metadataf("counters say %d files, %d dirs, %d chunks; found %d, %d, %d",
			c.ctr.Files, c.ctr.Dirs, c.ctr.Chunks, c.files, c.dirs, c.chunks)
	}
	if len(c.inodes) > 0 && c.maxIno >= c.ctr.NextIno {
		c.metadataf("inode %d not below the counter %d", c.maxIno, c.ctr.NextIno)
	}
	if err := c.checkLocks(); err != nil {
		return err
	}
	slices.Sort(c.nodes)
	for _, id := range c.nodes {
		if id >= c.ctr.NextNode {
			c.metadataf("node %d not below the counter %d", id, c.ctr.NextNode)
		}
	}
	return nil
}

// checkChunkCount compares a counted file's chunk count and the end of
// its last chunk (what st_blocks is made of) with the records it has
// (their number, one past the highest index), once. A ChunkEnd of 0 with
// chunks is a file whose chunks predate the field: not known, not wrong.
func (c *checker) checkChunkCount(ino ids.Ino, records, end int64) {
	n, ok := c.inodes[ino]
	if !ok || n.chunks < 0 {
		return
	}
	if counted := n.chunks; counted != records {
		c.problem(kMeta, func() string { return fmt.Sprintf("%s: counts %d chunks, has %d", c.path(ino), counted, records) })
	}
	if kept := n.chunkEnd; kept != 0 && kept != end {
		c.problem(kMeta, func() string {
			if end == 0 {
				return fmt.Sprintf("%s: keeps its last chunk at index %d, has none", c.path(ino), kept-1)
			}
			return fmt.Sprintf("%s: keeps its last chunk at index %d, has it at %d", c.path(ino), kept-1, end-1)
		})
	}
	n.chunks = -1
	c.inodes[ino] = n
}

// checkLocks verifies the lock records agree with their indexes: each
// session's count is its number of locks, and a session is indexed on
// exactly the files it holds locks on. (Locks on a removed file stay
// until their session ends: harmless, its inode number is never reused.)
func (c *checker) checkLocks() error {
	perSession := map[uint64]int64{}
	held := map[[2]uint64]bool{}
	err := c.scan(pLock, func(k, val []byte) (bool, error) {
		if len(k) != 34 || len(val) != 13 || val[8] < 1 || val[8] > 2 || k[25] > kindFlock || beUint64(k[26:]) > beUint64(val) {
			c.metadataf("malformed lock record %x: %x", k, val)
			return true, nil
		}
		perSession[beUint64(k[9:])]++
		held[[2]uint64{beUint64(k[9:]), beUint64(k[1:])}] = true
		return true, nil
	})
	if err != nil {
		return err
	}
	indexed := map[[2]uint64]bool{}
	err = c.scan(pLockIndex, func(k, _ []byte) (bool, error) {
		if len(k) != 17 {
			c.metadataf("malformed lock index %x", k)
			return true, nil
		}
		key := [2]uint64{beUint64(k[1:]), beUint64(k[9:])}
		if !held[key] {
			c.metadataf("lock index %x names no lock", k)
		}
		indexed[key] = true
		return true, nil
	})
	if err != nil {
		return err
	}
	var unindexed [][2]uint64
	for key := range held {
		if !indexed[key] {
			unindexed = append(unindexed, key)
		}
	}
	slices.SortFunc(unindexed, func(a, b [2]uint64) int { return slices.Compare(a[:], b[:]) })
	for _, key := range unindexed {
		c.metadataf("session %x holds locks on inode %d but is not indexed there", key[0], key[1])
	}
	err = c.scan(pLockSess, func(k, _ []byte) (bool, error) {
		if len(k) != 9 {
			c.metadataf("malformed lock session key %x", k)
			return true, nil
		}
		sess := beUint64(k[1:])
		rec, _, err := loadLockSess(c.r, sess)
		if err != nil {
			c.metadataf("lock session %x: %v", sess, err)
		} else if n := perSession[sess]; rec.locks != n {
			c.metadataf("lock session %x counts %d locks, holds %d", sess, rec.locks, n)
		}
		delete(perSession, sess)
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, sess := range slices.Sorted(maps.Keys(perSession)) {
		c.metadataf("%d locks of session %x, which has no record", perSession[sess], sess)
	}
	return nil
}

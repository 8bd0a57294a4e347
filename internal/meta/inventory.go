package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/inventory"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/repairplan"
)

// Inventories: nodes list the chunks they hold (metaapi.InventoryReq);
// meta judges each copy against its records (package inventory decides)
// and tells the node which strays to collect once the grace has passed.
// Judging needs a chunk's record by id, so meta keeps an index from
// chunk id to (inode, index), written with the record.

// inventories is the inventory state meta keeps in memory: the strays
// found so far, and the nodes asked for a round now (true: reading every
// block, for sluice check --verify).
type inventories struct {
	mu   sync.Mutex
	tr   inventory.Tracker
	want map[ids.NodeID]bool
}

func newInventories(grace time.Duration) inventories {
	return inventories{tr: inventory.Tracker{Grace: grace}, want: map[ids.NodeID]bool{}}
}

// ask has node run a round at its next heartbeat.
func (iv *inventories) ask(node ids.NodeID, verify bool) {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	iv.want[node] = iv.want[node] || verify
}

// wanted reports (once) whether node was asked for a round now, and
// whether it should read every block.
func (iv *inventories) wanted(node ids.NodeID) (round, verify bool) {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	verify, round = iv.want[node]
	delete(iv.want, node)
	return round, verify
}

// displaced lists the intact copies of chunk id the last inventories
// found on nodes its record does not name (kept: inventory.Displaced).
func (iv *inventories) displaced(id ids.ChunkID) []inventory.Found {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	return iv.tr.Displaced(id)
}

// errIndex: the chunk id index disagrees with the chunk records.
var errIndex = errors.New("chunk id index is inconsistent")

// copyRecord is what meta's state says of chunk id for node.
func copyRecord(r pebble.Reader, node ids.NodeID, id ids.ChunkID) (inventory.Record, error) {
	out, _, err := copyRecordOf(r, node, id)
	return out, err
}

// placedChunk is a chunk's record and where it is, for a copy of it.
type placedChunk struct {
	ref chunkRef
	rec chunkRec
}

// copyRecordOf is copyRecord, with the chunk's record when a file has
// the chunk (nil if not).
func copyRecordOf(r pebble.Reader, node ids.NodeID, id ids.ChunkID) (inventory.Record, *placedChunk, error) {
	var out inventory.Record
	_, queued, err := getRaw(r, gcKey(node, id))
	if err != nil {
		return out, nil, err
	}
	out.Queued = queued
	raw, found, err := getRaw(r, chunkIDKey(id))
	if err != nil || !found {
		return out, nil, err
	}
	ref, err := decodeChunkRef(raw)
	if err != nil {
		return out, nil, err
	}
	var rec chunkRec
	found, err = getJSON(r, chunkKey(ref.ino, ref.index), &rec)
	if err != nil {
		return out, nil, err
	}
	if !found || rec.ID != id {
		// The index disagrees with the records (Check reports it): keep
		// the copy rather than judge it on that.
		return inventory.Record{Exists: true, Member: true}, nil, fmt.Errorf("%w: chunk %v points at chunk %d of file %d, which is %v", errIndex, id, ref.index, ref.ino, rec.ID)
	}
	out.Exists = true
	out.Member = slices.Contains(rec.Nodes, node) || slices.Contains(rec.Replaced, node)
	return out, &placedChunk{ref: ref, rec: rec}, nil
}

// elsewhere is what meta knows of a chunk a node holds a copy of that
// its record does not place there.
type elsewhere struct {
	placedChunk
	whole bool // every member is up and not being reconciled, just placed or corrupt
	lost  bool // some member is down or no longer a node
	ec    bool
}

// judgeElsewhere is what meta knows of the chunk of a copy on a node
// its record does not name (s.mu held).
func (s *Service) judgeElsewhere(v view, pc *placedChunk) (*elsewhere, error) {
	e := &elsewhere{placedChunk: *pc}
	rec := &pc.rec
	e.whole = !rec.Reconciling && len(rec.Fresh) == 0 && len(rec.Corrupt) == 0
	for _, n := range rec.Nodes {
		if m := s.nodes[n]; m == nil || m.state != metaapi.NodeUp {
			e.whole, e.lost = false, true
		}
	}
	in, err := v.inode(pc.ref.ino)
	if err != nil {
		return nil, err
	}
	e.ec = in.Policy != nil && in.Policy.EC != nil
	return e, nil
}

// Inventory judges one page of a node's inventory round and answers the
// strays to collect (see metaapi.InventoryReq).
func (s *Service) Inventory(req metaapi.InventoryReq) (metaapi.InventoryResp, error) {
	var out metaapi.InventoryResp
	if len(req.Chunks) > metaapi.MaxInventoryPage {
		return out, metaapi.Errorf(metaapi.EINVAL, "%d chunks in one inventory page, at most %d", len(req.Chunks), metaapi.MaxInventoryPage)
	}
	prev := req.After
	for _, c := range req.Chunks {
		if c.Chunk <= prev {
			return out, metaapi.Errorf(metaapi.EINVAL, "inventory page lists chunk %v after %v: ids must increase", c.Chunk, prev)
		}
		if c.Length < 0 {
			return out, metaapi.Errorf(metaapi.EINVAL, "chunk %v of negative length %d", c.Chunk, c.Length)
		}
		if len(c.Bad) > metaapi.MaxBadExtents || !c.Bad.Valid(c.Length) {
			return out, metaapi.Errorf(metaapi.EINVAL, "chunk %v of %d bytes listed with bad extents %v", c.Chunk, c.Length, c.Bad)
		}
		prev = c.Chunk
	}
	records := make([]inventory.Record, len(req.Chunks))
	others := map[int]*elsewhere{} // by index in req.Chunks
	var next, restored ids.ChunkID
	err := s.read(func(v view) error {
		if s.nodes[req.Node] == nil {
			return metaapi.Errorf(metaapi.ENOENT, "unknown storage node %d: register first", req.Node)
		}
		out.Epoch = s.ctr.Epoch
		next, restored = s.ctr.NextChunk, s.ctr.RestoredChunks
		for i, c := range req.Chunks {
			r, pc, err := copyRecordOf(v.r, req.Node, c.Chunk)
			if errors.Is(err, errIndex) {
				s.log.Error("inventory: judging a copy", "node", req.Node, "err", err)
			} else if err != nil {
				return err
			}
			records[i] = r
			if pc != nil && !r.Member && !r.Queued {
				e, err := s.judgeElsewhere(v, pc)
				if metaapi.IsCode(err, metaapi.ENOENT) {
					continue // the file went meanwhile; kept this round
				} else if err != nil {
					return err
				}
				others[i] = e
			}
		}
		return nil
	})
	if err != nil {
		return metaapi.InventoryResp{}, err
	}
	s.chk.feed(&req)
	verdicts := make([]inventory.Verdict, len(req.Chunks))
	s.inv.mu.Lock()
	for i, c := range req.Chunks {
		if e := others[i]; e != nil {
			records[i].Covered = e.whole && s.inv.tr.Covered(c.Chunk, e.rec.Nodes, max(e.rec.Version, c.Version))
		}
		verdicts[i] = inventory.Judge(c.Chunk, next, records[i])
	}
	out.Collect = s.inv.tr.Page(req.Node, req.After, req.Chunks, verdicts, req.Done, s.opts.Now().UnixNano())
	s.inv.mu.Unlock()
	if len(out.Collect) > 0 {
		s.log.Info("inventory: node collects stray copies", "node", req.Node, "chunks", len(out.Collect),
			"first", out.Collect[0], "grace", s.opts.OrphanGrace.String())
	}
	s.adoptDisplaced(req, verdicts, others, restored)
	for i, v := range verdicts {
		if v == inventory.Ahead {
			s.log.Error("inventory: node holds a chunk id meta never gave out (meta's state older than the node's?); kept",
				"node", req.Node, "chunk", req.Chunks[i].Chunk)
			break
		}
	}
	return out, nil
}

// adoptDisplaced queues for repair the chunks some of whose members are
// down or gone and of which the node holds an intact copy at least as
// new as recorded: the repair makes that copy a member in place of a
// lost one (beginReconcile). After a restore from a backup older than
// a move, such a copy is the chunk's. A unit of an erasure-coded chunk
// is not adopted: the node does not know which unit it holds, and a
// unit adopted at the wrong index reads back as wrong data. It is kept
// (Displaced) and the group is rebuilt from its members. Only chunks
// made before the last restore (ids below restored) are adopted
// (adoptableLocked).
func (s *Service) adoptDisplaced(req metaapi.InventoryReq, verdicts []inventory.Verdict, others map[int]*elsewhere, restored ids.ChunkID) {
	n := 0
	for i, v := range verdicts {
		e, c := others[i], req.Chunks[i]
		if v != inventory.Displaced || e == nil || !e.lost || e.ec || c.Chunk >= restored || c.Version < e.rec.Version || len(c.Bad) > 0 || c.BadUnlisted {
			continue
		}
		s.repairs.add(e.ref, repairplan.Margin(0, 1), false)
		n++
	}
	if n > 0 {
		s.log.Warn("inventory: node holds copies of chunks whose recorded members are down or gone; repairing them from these copies",
			"node", req.Node, "chunks", n)
	}
}

// Strays reports what the nodes' last inventory rounds found: the
// copies nodes hold that no file needs there (see metaapi.StraysReq).
func (s *Service) Strays(req metaapi.StraysReq) (metaapi.StraysResp, error) {
	if req.Refresh && req.Who.UID != 0 {
		return metaapi.StraysResp{}, metaapi.Errorf(metaapi.EPERM, "only root may ask nodes for an inventory round")
	}
	s.mu.RLock()
	var nodes []ids.NodeID
	for id := range s.nodes {
		if req.Node == 0 || id == req.Node {
			nodes = append(nodes, id)
		}
	}
	s.mu.RUnlock()
	if req.Node != 0 && len(nodes) == 0 {
		return metaapi.StraysResp{}, metaapi.Errorf(metaapi.ENOENT, "no storage node %v", req.Node)
	}
	slices.Sort(nodes)
	out := metaapi.StraysResp{Now: s.opts.Now().UnixNano(), Grace: int64(s.opts.OrphanGrace)}
	s.inv.mu.Lock()
	defer s.inv.mu.Unlock()
	for _, n := range nodes {
		if req.Refresh {
			s.inv.want[n] = s.inv.want[n] || false
		}
		out.Nodes = append(out.Nodes, s.inv.tr.Report(n, metaapi.MaxStrayList))
	}
	return out, nil
}

// indexChunkIDs brings a database of schema 1 to 2: it indexes every
// chunk record by id.
func (s *Service) indexChunkIDs() error {
	return s.buildIndex(pChunk, "2", "chunk records by id", func(b *pebble.Batch, k, v []byte) (bool, error) {
		var rec chunkRec
		if len(k) != 17 || json.Unmarshal(v, &rec) != nil {
			// Left out of the index (so never judged stray-making);
			// sluice check reports the record. Meta must still open.
			s.log.Error("indexing chunk records: a record does not decode; left out", "key", fmt.Sprintf("%x", k))
			return false, nil
		}
		return true, b.Set(chunkIDKey(rec.ID), encodeChunkRef(ids.Ino(beUint64(k[1:])), int64(beUint64(k[9:]))), nil)
	})
}

// buildIndex brings the database to schema: it runs index over every
// record under prefix (idempotent, so an interrupted run is simply
// repeated), committing every 4096 records indexed, then records the
// new schema.
func (s *Service) buildIndex(prefix byte, schema, what string, index func(b *pebble.Batch, k, v []byte) (bool, error)) error {
	b := s.db.NewBatch()
	n := 0
	err := scan(s.db, []byte{prefix}, []byte{prefix + 1}, func(k, v []byte) (bool, error) {
		did, err := index(b, k, v)
		if err != nil || !did {
			return err == nil, err
		}
		if n++; n%4096 == 0 {
			err := b.Commit(pebble.Sync)
			b.Close()
			b = s.db.NewBatch()
			return err == nil, err
		}
		return true, nil
	})
	if err == nil {
		err = b.Set(keySchema, []byte(schema), nil)
	}
	if err == nil {
		err = b.Commit(pebble.Sync)
	}
	b.Close()
	if err == nil {
		s.log.Info("indexed "+what, "records", n, "schema", schema)
	}
	return err
}

package meta

import (
	"encoding/json"
	"fmt"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/placement"
	"github.com/sluicefs/sluice/internal/plan"
)

// maxCommitChunks bounds the chunk versions one Commit may carry.
const maxCommitChunks = 4 * metaapi.MaxLayoutChunks

// indexedChunk is a chunk record with its index in the file.
type indexedChunk struct {
	index int64
	rec   chunkRec
}

// fileForData loads a regular file for Layout and Commit.
func fileForData(r ns, ino ids.Ino, who metaapi.Who, want uint32) (*inode, error) {
	in, err := r.inode(ino)
	if err != nil {
		return nil, err
	}
	switch in.Type {
	case metaapi.TypeFile:
	case metaapi.TypeDir:
		return nil, metaapi.Errorf(metaapi.EISDIR, "inode %d is a directory", ino)
	default:
		return nil, metaapi.Errorf(metaapi.EINVAL, "inode %d is a %s, which has no data", ino, in.Type)
	}
	if in.ChunkSize <= 0 {
		return nil, metaapi.Errorf(metaapi.EIO, "file %d has chunk size %d", ino, in.ChunkSize)
	}
	return in, dataAccess(in, who, want)
}

// chunksIn returns the chunk records of ino with index in [first, last],
// at most max of them, and whether more exist in the range.
func chunksIn(r ns, ino ids.Ino, first, last int64, max int) ([]indexedChunk, bool, error) {
	var out []indexedChunk
	more := false
	err := scan(r.reader(), chunkKey(ino, first), chunkKey(ino, last+1), func(k, v []byte) (bool, error) {
		if len(out) == max {
			more = true
			return false, nil
		}
		var c indexedChunk
		c.index = int64(beUint64(k[9:]))
		if err := json.Unmarshal(v, &c.rec); err != nil {
			return false, fmt.Errorf("decoding chunk record %q: %w", k, err)
		}
		out = append(out, c)
		return true, nil
	})
	return out, more, err
}

func beUint64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// layoutPlan is what a Layout call computed under the lock; capabilities
// are minted from it afterwards.
type layoutPlan struct {
	// at is when the plan read the chunk records (unix ns): capabilities
	// expire CapabilityTTL after it, never later, so a chunk deleted
	// after the read is named by none past the deletion's goneUntil.
	at     int64
	attr   metaapi.Attr
	epoch  uint64
	chunks []indexedChunk
	more   bool
	addrs  map[ids.NodeID]string
}

// Layout returns the chunks covering [Off, Off+Len) of a file with a
// capability each; with Write it first allocates and places the missing
// ones. At most MaxLayoutChunks chunks are returned; More says the range
// continues (ask again from the chunk after the last one returned).
func (s *Service) Layout(client ids.ClientID, req metaapi.LayoutReq) (metaapi.LayoutResp, error) {
	return s.layout(client, req, nil)
}

// layout is Layout for a caller whose credential valid checks under
// meta's lock, where the capabilities' issue time is taken: a revocation
// covers every capability issued before it, and none is issued after it
// to a credential it revoked.
func (s *Service) layout(client ids.ClientID, req metaapi.LayoutReq, valid func() error) (metaapi.LayoutResp, error) {
	if req.Off < 0 || req.Len < 0 {
		return metaapi.LayoutResp{}, metaapi.Errorf(metaapi.EINVAL, "negative layout range off=%d len=%d", req.Off, req.Len)
	}
	if req.Off > metaapi.MaxFileSize || req.Len > metaapi.MaxFileSize-req.Off {
		return metaapi.LayoutResp{}, metaapi.Errorf(metaapi.EFBIG, "layout range [%d,+%d) beyond the maximum file size %d",
			req.Off, req.Len, int64(metaapi.MaxFileSize))
	}
	want := uint32(mayRead)
	if req.Write {
		want = mayWrite
	}
	// bounds computes the chunk index range to return.
	bounds := func(in *inode) (first, last int64, more bool, empty bool) {
		if req.Len == 0 {
			return 0, 0, false, true
		}
		cs := in.ChunkSize
		first, last = req.Off/cs, (req.Off+req.Len-1)/cs
		if req.Write && last-first+1 > metaapi.MaxLayoutChunks {
			last, more = first+metaapi.MaxLayoutChunks-1, true
		}
		return first, last, more, false
	}

	var p layoutPlan
	complete := false
	err := s.read(func(v view) error {
		if err := check(valid); err != nil {
			return err
		}
		in, err := fileForData(v, req.Ino, req.Who, want)
		if err != nil {
			return err
		}
		p = layoutPlan{at: s.opts.Now().UnixNano(), attr: in.Attr, epoch: s.ctr.Epoch}
		first, last, more, empty := bounds(in)
		if empty {
			complete = true
			return nil
		}
		chunks, moreExisting, err := chunksIn(v, in.Ino, first, last, metaapi.MaxLayoutChunks)
		if err != nil {
			return err
		}
		p.chunks, p.more = chunks, more || moreExisting
		complete = !req.Write || int64(len(chunks)) == last-first+1
		if complete {
			p.addrs = s.addrsLocked()
		}
		return nil
	})
	if err != nil {
		return metaapi.LayoutResp{}, err
	}
	if !complete {
		s.Sweep() // place on the freshest view of which nodes are live
		err = s.update(func(tx *txn) error {
			if err := check(valid); err != nil {
				return err
			}
			in, err := fileForData(tx, req.Ino, req.Who, want)
			if err != nil {
				return err
			}
			first, last, more, _ := bounds(in)
			existing, _, err := chunksIn(tx, in.Ino, first, last, metaapi.MaxLayoutChunks)
			if err != nil {
				return err
			}
			pol := metaapi.Policy{Replicas: s.opts.DefaultReplicas, Strategy: plan.Plan{Strategy: plan.Ring}}
			if in.Policy != nil {
				pol = *in.Policy
			}
			infos := s.placementInfosLocked()
			placed := charges{}
			chunks := make([]indexedChunk, 0, last-first+1)
			next := 0
			for idx := first; idx <= last; idx++ {
				if next < len(existing) && existing[next].index == idx {
					chunks = append(chunks, existing[next])
					next++
					continue
				}
				nodes, err := placement.Choose(infos, pol.Units(), nil, s.minFree, s.rng)
				if err != nil {
					return s.placementError(err)
				}
				placed.add(infos, nodes, placedBytes(pol, in.ChunkSize, idx, req.Off, req.Len))
				c := indexedChunk{index: idx, rec: chunkRec{ID: tx.ctr.NextChunk, Nodes: nodes}}
				tx.ctr.NextChunk++
				tx.ctr.Chunks++
				if in.Chunks == 0 || in.ChunkEnd > 0 { // else not known (Attr.ChunkEnd)
					in.ChunkEnd = max(in.ChunkEnd, idx+1)
				}
				in.Chunks++
				tx.dirty(in)
				if err := tx.setJSON(chunkKey(in.Ino, idx), &c.rec); err != nil {
					return err
				}
				if err := tx.b.Set(chunkIDKey(c.rec.ID), encodeChunkRef(in.Ino, idx), nil); err != nil {
					return err
				}
				chunks = append(chunks, c)
			}
			p = layoutPlan{at: tx.now, attr: in.Attr, epoch: tx.ctr.Epoch, chunks: chunks, more: more, addrs: s.addrsLocked()}
			tx.after = append(tx.after, func() { s.commitCharges(placed) })
			return nil
		})
		if err != nil {
			return metaapi.LayoutResp{}, err
		}
	}
	if req.Write {
		for _, c := range p.chunks {
			// Reconciling, or queued to be because a write failed on it
			// (a write retried before meta's worker takes the job up
			// would fail again on the same members, and the writer's
			// fail-overs run out — seen on a loaded machine).
			if c.rec.Reconciling || s.repairs.failoverPending(chunkRef{p.attr.Ino, c.index}) {
				// Its members are being fenced and made whole; a write
				// planned now would be refused. The client retries,
				// unless the repair is stuck.
				if err := s.repairs.stuckErr(chunkRef{p.attr.Ino, c.index}); err != nil {
					// A lost member nothing can replace: the writer's data
					// cannot meet its policy (an I/O error, not a full disk).
					return metaapi.LayoutResp{}, metaapi.Errorf(metaapi.EIO, "%v", err)
				}
				return metaapi.LayoutResp{}, metaapi.Errorf(metaapi.EAGAIN, "chunk %v of file %d is being repaired", c.rec.ID, p.attr.Ino)
			}
		}
	}
	rights := capability.Read
	if req.Write {
		rights |= capability.Write
	}
	return s.mintLayout(client, rights, &p), nil
}

// mintLayout turns a plan into the reply, minting one capability per chunk.
func (s *Service) mintLayout(client ids.ClientID, rights capability.Rights, p *layoutPlan) metaapi.LayoutResp {
	expiry := p.at + int64(s.opts.CapabilityTTL)
	// The capability says who may write the copies past the first: the
	// file's plan decides (only a flat file's client, or an erasure
	// code's, writes them itself).
	pol := p.attr.Policy
	fanout, data, unitLen := pol.Plan().Fanout(), uint8(0), p.attr.ChunkSize
	if pol != nil && pol.EC != nil {
		data = uint8(pol.EC.Data)
		unitLen = p.attr.ChunkSize / int64(pol.EC.Data) // each unit holds its share of the group
	}
	out := metaapi.LayoutResp{Attr: p.attr, Epoch: p.epoch, Chunks: make([]metaapi.ChunkLayout, 0, len(p.chunks)), More: p.more}
	for _, c := range p.chunks {
		cp := capability.Capability{
			Rights: rights,
			Fanout: fanout,
			Data:   data,
			Client: client,
			Ino:    p.attr.Ino,
			Chunk:  c.rec.ID,
			Off:    0,
			Len:    uint64(unitLen),
			Expiry: expiry,
			Issued: p.at,
			Epoch:  p.epoch,
		}
		if err := cp.SetReplicas(c.rec.Nodes); err != nil {
			panic(err) // policies allow at most MaxECUnits nodes
		}
		reps := make([]metaapi.Replica, len(c.rec.Nodes))
		for i, n := range c.rec.Nodes {
			reps[i] = metaapi.Replica{Node: n, Addr: p.addrs[n]}
		}
		out.Chunks = append(out.Chunks, metaapi.ChunkLayout{
			Index:    c.index,
			Chunk:    c.rec.ID,
			Version:  c.rec.Version,
			Replicas: reps,
			Cap:      s.keys.Mint(&cp),
			Expiry:   expiry,
			ZeroFrom: c.rec.ZeroFrom,
		})
	}
	return out
}

// Commit records a completed write: the size grows to at least Size, the
// listed chunks' versions to at least the given ones, and mtime is set.
func (s *Service) Commit(req metaapi.CommitReq) (metaapi.Attr, error) {
	var out metaapi.Attr
	switch {
	case req.Size < 0:
		return out, metaapi.Errorf(metaapi.EINVAL, "negative size %d", req.Size)
	case req.Size > metaapi.MaxFileSize:
		return out, metaapi.Errorf(metaapi.EFBIG, "size %d beyond the maximum %d", req.Size, int64(metaapi.MaxFileSize))
	case len(req.Chunks) > maxCommitChunks:
		return out, metaapi.Errorf(metaapi.EINVAL, "%d chunks in one commit, at most %d", len(req.Chunks), maxCommitChunks)
	}
	err := s.update(func(tx *txn) error {
		in, err := fileForData(tx, req.Ino, req.Who, mayWrite)
		if err != nil {
			return err
		}
		cs := in.ChunkSize
		for _, cv := range req.Chunks {
			if cv.End < 0 || cv.End > cs {
				return metaapi.Errorf(metaapi.EINVAL, "chunk %d: end %d outside the chunk size %d", cv.Index, cv.End, cs)
			}
			key := chunkKey(in.Ino, cv.Index)
			var rec chunkRec
			found, err := getJSON(tx.b, key, &rec)
			if err != nil {
				return err
			}
			if !found || rec.ID != cv.Chunk || cv.Index < 0 {
				return metaapi.Errorf(metaapi.EINVAL, "chunk %v is not chunk %d of file %d", cv.Chunk, cv.Index, in.Ino)
			}
			changed := false
			if cv.Version > rec.Version {
				rec.Version, changed = cv.Version, true
			}
			if rec.ZeroFrom > 0 {
				end := cv.End
				if end == 0 { // a writer that does not report End: assume it wrote up to the new size
					end = min(cs, req.Size-cv.Index*cs)
				}
				if end > rec.ZeroFrom {
					rec.ZeroFrom, changed = end, true
					if rec.ZeroFrom >= cs {
						rec.ZeroFrom = 0
					}
				}
			}
			if changed {
				if err := tx.setJSON(key, &rec); err != nil {
					return err
				}
			}
		}
		in.Size = max(in.Size, req.Size)
		in.Mtime = tx.now
		if req.Mtime != 0 {
			in.Mtime = req.Mtime
		}
		in.Ctime = tx.now
		tx.dirty(in)
		out = in.Attr
		return nil
	})
	return out, err
}

// resize sets a file's size. Shrinking drops the chunks wholly beyond the
// new size and queues them for deletion; a chunk the new end falls inside
// keeps its data but records where its stale bytes begin (ZeroFrom), so
// they read as zeros if the file grows again. Growing marks the stale
// tail of the chunk holding the old end the same way.
func (tx *txn) resize(in *inode, size int64) error {
	cs := in.ChunkSize
	old := in.Size
	switch {
	case size < old:
		if err := tx.dropChunks(in.Ino, (size+cs-1)/cs); err != nil {
			return err
		}
		if size%cs != 0 {
			if err := tx.zeroFrom(in.Ino, size/cs, size%cs); err != nil {
				return err
			}
		}
	case size > old && old%cs != 0:
		if err := tx.zeroFrom(in.Ino, old/cs, old%cs); err != nil {
			return err
		}
	}
	in.Size = size
	return nil
}

// zeroFrom lowers chunk index's ZeroFrom mark to off, if the chunk exists.
func (tx *txn) zeroFrom(ino ids.Ino, index, off int64) error {
	key := chunkKey(ino, index)
	var rec chunkRec
	found, err := getJSON(tx.b, key, &rec)
	if err != nil || !found {
		return err
	}
	if rec.ZeroFrom == 0 || off < rec.ZeroFrom {
		rec.ZeroFrom = off
		return tx.setJSON(key, &rec)
	}
	return nil
}

// MarkDegraded records or clears that a stripe group is degraded.
func (s *Service) MarkDegraded(req metaapi.MarkDegradedReq) error {
	return s.update(func(tx *txn) error {
		in, err := fileForData(tx, req.Ino, req.Who, mayWrite)
		if err != nil {
			return err
		}
		if in.Policy == nil || in.Policy.EC == nil {
			return metaapi.Errorf(metaapi.EINVAL, "file %d is not erasure-coded", in.Ino)
		}
		var rec chunkRec
		found, err := getJSON(tx.b, chunkKey(in.Ino, req.Index), &rec)
		if err != nil {
			return err
		}
		if !found || rec.ID != req.Chunk {
			return metaapi.Errorf(metaapi.EINVAL, "chunk %v is not chunk %d of file %d", req.Chunk, req.Index, in.Ino)
		}
		key := degradedKey(in.Ino, req.Index)
		if req.Degraded {
			return tx.b.Set(key, nil, nil)
		}
		return tx.b.Delete(key, nil)
	})
}

// ListDegraded returns the stripe groups recorded as degraded.
func (s *Service) ListDegraded() (metaapi.ListDegradedResp, error) {
	var out metaapi.ListDegradedResp
	err := s.read(func(v view) error {
		out = metaapi.ListDegradedResp{}
		return scan(v.reader(), []byte{pDegraded}, []byte{pDegraded + 1}, func(k, _ []byte) (bool, error) {
			if len(out.Groups) == metaapi.MaxDegradedList {
				out.More = true
				return false, nil
			}
			if len(k) != 17 {
				return true, nil
			}
			g := metaapi.DegradedGroup{Ino: ids.Ino(beUint64(k[1:])), Index: int64(beUint64(k[9:]))}
			var rec chunkRec
			if found, err := getJSON(v.reader(), chunkKey(g.Ino, g.Index), &rec); err != nil || !found {
				return err == nil, err
			}
			g.Chunk = rec.ID
			out.Groups = append(out.Groups, g)
			return true, nil
		})
	})
	return out, err
}

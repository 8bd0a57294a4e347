package policy

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// repairer rebuilds lost units of erasure-coded stripe groups at the node
// that will hold them (seed 003's receive-and-decode, with the healing at
// the owner). In distributed mode every survivor multiplies its unit by
// its decoding coefficient (a scaled read) and this node XORs the K
// products, so the decoding work is spread over the survivors; in gather
// mode the survivors send their units and this node decodes alone (the
// baseline). Either way the unit is rebuilt piece by piece into the store
// (bounded memory), committed at the group's version, and read back
// against its fresh checksums before the reply. A replicated chunk is
// copied the same way from one survivor (copy mode). Fence mode raises a
// member's fence and reports its state (docs/failures.md).
type repairer struct {
	d     *Deps
	codes *erasure.Codes
	slots chan struct{}
}

// repairPiece is how much of a unit is rebuilt per round.
const repairPiece = readPiece

type repairState struct {
	h         wire.RepairHeader // Cap, Survivors and Addrs copied out of the packet
	cap       capability.Capability
	survivors []int
	addrs     []string
}

func (x *repairer) context() *engine.Context {
	return &engine.Context{Name: "repair", Class: wire.OpRepair, Handlers: engine.Handlers{
		Header:     x.header,
		Completion: x.completion,
	}}
}

func (x *repairer) header(r *engine.Request, hdr []byte) error {
	st := &repairState{}
	h := &st.h
	if err := wire.ParseRepair(hdr, h); err != nil {
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	c := &st.cap
	if _, err := x.d.Keys.Open(h.Cap, x.d.Now(), c); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	if err := c.Allows(capability.Repair, h.Chunk, 0, h.Len); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	ec := c.Fanout == capability.FanoutEC
	switch {
	case c.RankOf(x.d.Self()) != int(h.Unit):
		return wire.Errorf(wire.StatusAuth, "node %v is not unit %d of chunk %v", x.d.Self(), h.Unit, h.Chunk)
	case h.Addrs.Len() != int(c.NReplicas):
		return wire.Errorf(wire.StatusBadRequest, "%d addresses for %d units", h.Addrs.Len(), c.NReplicas)
	case h.Mode == wire.RepairFence:
		r.State = st
		return nil // cheap: no repair slot
	case h.Mode == wire.RepairCopy && ec:
		return wire.Errorf(wire.StatusBadRequest, "chunk %v is erasure-coded: its units are rebuilt, not copied", h.Chunk)
	case h.Mode != wire.RepairCopy && !ec:
		return wire.Errorf(wire.StatusBadRequest, "chunk %v is not erasure-coded", h.Chunk)
	case h.Mode != wire.RepairCopy && len(h.Survivors) != int(c.Data):
		return wire.Errorf(wire.StatusBadRequest, "%d survivors for %d units of which %d data", len(h.Survivors), c.NReplicas, c.Data)
	case h.Version == 0:
		return wire.Errorf(wire.StatusBadRequest, "rebuilding version 0")
	}
	select {
	case x.slots <- struct{}{}:
	default:
		return wire.Errorf(wire.StatusBusy, "repairs in progress on this node")
	}
	for _, s := range h.Survivors {
		st.survivors = append(st.survivors, int(s))
	}
	for i := range h.Addrs.Len() {
		st.addrs = append(st.addrs, string(h.Addrs.At(i)))
	}
	h.Cap = append([]byte(nil), h.Cap...)
	h.Survivors, h.Addrs = nil, wire.Addrs{}
	r.State = st
	return nil
}

func (x *repairer) completion(r *engine.Request) {
	st := r.State.(*repairState)
	if st.h.Mode == wire.RepairFence {
		go func() {
			fs, err := x.d.Store.Fence(st.h.Chunk, st.cap.Epoch)
			if err == nil && fs.Doubt && st.h.Version != 0 && fs.Info.Version == st.h.Version {
				// Every member holds this version now: the doubt is over.
				if err = x.d.Store.ResolveDoubt(st.h.Chunk, st.h.Version); err == nil {
					fs.Doubt = false
				}
			}
			if err != nil {
				r.Finish(wire.AppendError(nil, storeError(err)))
				return
			}
			r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: fs.Info.Version,
				ChunkLen: uint64(fs.Info.Length), Partial: fs.Doubt}, nil, ""))
		}()
		return
	}
	go func() {
		defer func() { <-x.slots }()
		info, err := x.rebuild(st)
		if err != nil {
			r.Finish(wire.AppendError(nil, err))
			return
		}
		r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length)}, nil, ""))
	}()
}

func (x *repairer) rebuild(st *repairState) (store.Info, error) {
	h, c := &st.h, &st.cap
	k := int(c.Data)
	var code *erasure.Code
	var err error
	if h.Mode == wire.RepairCopy {
		k = 1
	} else if code, err = x.codes.Get(k, int(c.NReplicas)-k); err != nil {
		return store.Info{}, wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	var coef []byte
	if h.Mode == wire.RepairDistributed {
		if coef, err = code.DecodeCoefficients(int(h.Unit), st.survivors); err != nil {
			return store.Info{}, wire.Errorf(wire.StatusBadRequest, "%v", err)
		}
	}
	addrs := make([]string, k)
	for i, u := range st.survivors {
		if addrs[i], err = x.d.peerAddr(c.Replicas[u], []byte(st.addrs[u]), fmt.Sprintf("unit %d's node", u)); err != nil {
			return store.Info{}, err
		}
	}
	// No write planned before this repair may land here from now on; and
	// a repair planned before the member's fence (a newer one has run)
	// must not touch its copy.
	fs, err := x.d.Store.Fence(h.Chunk, c.Epoch)
	if err != nil {
		return store.Info{}, storeError(err)
	}
	if c.Epoch < fs.Fence {
		return store.Info{}, wire.Errorf(wire.StatusFenced, "chunk %v is fenced at epoch %d, this repair was planned on %d", h.Chunk, fs.Fence, c.Epoch)
	}
	// What this node holds of the unit (stale, corrupt or half-written)
	// is replaced whole.
	if err := x.d.Store.Delete(h.Chunk); err != nil {
		return store.Info{}, storeError(err)
	}
	w, err := x.d.Store.BeginFollow(h.Chunk, 0, int64(h.Len), h.Version, 0)
	if err != nil {
		return store.Info{}, storeError(err)
	}
	if err := planned(w, c.Epoch); err != nil {
		return store.Info{}, err
	}
	// Two rounds in flight: the next piece is fetched from the survivors
	// while this one is combined and stored.
	type round struct {
		off, n  int64
		bufs    [][]byte
		regions []*fabric.Region
		err     error
	}
	ep := x.d.Forward.Endpoint()
	free := make(chan *round, 2)
	for range 2 {
		rd := &round{bufs: make([][]byte, k), regions: make([]*fabric.Region, k)}
		for i := range k {
			rd.bufs[i] = make([]byte, repairPiece)
			rd.regions[i] = ep.Register(rd.bufs[i], fabric.RemoteWrite)
			defer ep.Deregister(rd.regions[i])
		}
		free <- rd
	}
	fetched := make(chan *round, 2)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(fetched)
		for off := int64(0); off < int64(h.Len); off += repairPiece {
			var rd *round
			select {
			case rd = <-free:
			case <-stop:
				return
			}
			rd.off, rd.n = off, min(repairPiece, int64(h.Len)-off)
			errs := make([]error, k)
			var wg sync.WaitGroup
			for i := range k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rh := wire.ReadHeader{Chunk: h.Chunk, Off: uint64(rd.off), Len: uint64(rd.n), RegionKey: rd.regions[i].Key(), Cap: h.Cap}
					if coef != nil {
						rh.Scaled, rh.Coef = true, coef[i]
					}
					if err := x.fetch(addrs[i], &rh, h.Version, rd.bufs[i][:rd.n]); err != nil {
						errs[i] = fmt.Errorf("survivor unit %d (%s): %w", st.survivors[i], addrs[i], err)
					}
				}()
			}
			wg.Wait()
			rd.err = errors.Join(errs...)
			fetched <- rd
			if rd.err != nil {
				return
			}
		}
	}()
	out := make([]byte, repairPiece)
	var shards [][]byte
	if code != nil {
		shards = make([][]byte, code.Units())
	}
	for rd := range fetched {
		if rd.err != nil {
			w.Abort()
			return store.Info{}, wire.Errorf(wire.StatusReplica, "rebuilding unit %d of chunk %v: %v", h.Unit, h.Chunk, rd.err)
		}
		res := out[:rd.n]
		switch {
		case code == nil: // a copy
			res = rd.bufs[0][:rd.n]
		case coef != nil:
			copy(res, rd.bufs[0][:rd.n])
			for i := 1; i < k; i++ {
				erasure.XOR(res, rd.bufs[i][:rd.n])
			}
		default:
			clear(shards)
			for i, u := range st.survivors {
				shards[u] = rd.bufs[i][:rd.n]
			}
			if err := code.ReconstructOne(shards, int(h.Unit)); err != nil {
				w.Abort()
				return store.Info{}, wire.Errorf(wire.StatusIO, "decoding unit %d of chunk %v: %v", h.Unit, h.Chunk, err)
			}
			copy(res, shards[h.Unit])
		}
		if err := w.Place(rd.off, res); err != nil {
			w.Abort()
			return store.Info{}, storeError(err)
		}
		free <- rd
	}
	if err := w.Sync(); err != nil {
		w.Abort()
		return store.Info{}, storeError(err)
	}
	info, err := w.Commit()
	if err != nil {
		return store.Info{}, storeError(err)
	}
	// Read the rebuilt unit back against the checksums just stored.
	if err := x.d.Store.Verify(h.Chunk); err != nil {
		return store.Info{}, wire.Errorf(wire.StatusIO, "rebuilt unit %d of chunk %v does not verify: %v", h.Unit, h.Chunk, err)
	}
	return info, nil
}

// fetch reads one piece of a survivor into buf (registered under rh's
// region) and checks it: the survivor's version must be the group's, and
// every block must match the checksum the survivor sent.
func (x *repairer) fetch(addr string, rh *wire.ReadHeader, version uint64, buf []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), x.d.ReplyTimeout)
	defer cancel()
	hdr, err := wire.AppendRead(nil, rh)
	if err != nil {
		return err
	}
	pc, err := x.d.Forward.Get(ctx, addr)
	if err != nil {
		return err
	}
	id := pc.NewID()
	replies := pc.Replies.Expect(id)
	if err := pc.Send(id, hdr); err != nil {
		pc.Close()
		return err
	}
	var rep wire.Reply
	select {
	case p, ok := <-replies:
		if !ok {
			return fmt.Errorf("connection lost: %v", pc.Err())
		}
		err := wire.ParseReply(p.Data, &rep)
		if err == nil {
			err = rep.Err()
		}
		crcs := make([]uint32, rep.NCRC())
		for i := range crcs {
			crcs[i] = rep.CRC(i)
		}
		p.Release()
		if err != nil {
			x.d.Forward.Put(pc)
			return err
		}
		x.d.Forward.Put(pc)
		return checkPiece(buf, &rep, crcs, rh.Off, version)
	case <-time.After(x.d.ReplyTimeout):
		pc.Close()
		return fmt.Errorf("no reply within %s", x.d.ReplyTimeout)
	}
}

func checkPiece(buf []byte, rep *wire.Reply, crcs []uint32, off uint64, version uint64) error {
	bs := int64(rep.BlockSize)
	switch {
	case rep.Version != version:
		return fmt.Errorf("at version %d, the group is at %d", rep.Version, version)
	case rep.DataOff != off || rep.DataLen != uint64(len(buf)):
		return fmt.Errorf("sent [%d,+%d) for [%d,+%d)", rep.DataOff, rep.DataLen, off, len(buf))
	case bs <= 0 || int64(len(crcs)) != (int64(len(buf))+bs-1)/bs:
		return fmt.Errorf("%d checksums of %d-byte blocks for %d bytes", len(crcs), bs, len(buf))
	}
	for i, want := range crcs {
		if got := crc32.Checksum(buf[int64(i)*bs:min(int64(i+1)*bs, int64(len(buf)))], castagnoli); got != want {
			return fmt.Errorf("checksum mismatch in the block at %d", int64(off)+int64(i)*bs)
		}
	}
	return nil
}

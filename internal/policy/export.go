package policy

import (
	"fmt"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/regionmac"
	"github.com/sluicefs/sluice/internal/wire"
)

// Export is a node's exported cache (issue 19, seed 004's ODAFS): chunk
// blocks kept in a registered region that clients read with one-sided
// operations. Small reads fill it, and their replies carry references to
// the blocks (wire.Export); the store's OnChange drops a chunk's blocks
// when it changes.
//
// Over a network the node serves each optimistic read itself (Guard),
// so it checks them: a reference carries a key of its own (RefKey), and
// a read must be signed with it, recent and not replayed, and find the
// slot still holding the fill the reference names. A client that read
// one block can therefore read that block's fill and nothing else of
// the arena — not the blocks other clients' reads put beside it.
type Export struct {
	Cache  *expcache.Cache
	Region uint64 // the arena's region key
	Epoch  uint64 // this run of the node
	// Secret is this run's (regionmac.SecretSize random bytes): the
	// references' keys derive from it.
	Secret []byte
	// Replays refuses an optimistic read's tag seen before.
	Replays *regionmac.Verifier
	// Now is the node's clock (Unix nanoseconds).
	Now func() int64
	// Clients, if set, gives each process on the node's host a cache of
	// its own in shared memory (the thesis' zero-CPU case): it maps it
	// and reads its slots with no work by the node, and since only
	// blocks that process's reads were allowed are ever put in it, it
	// needs no per-read check. Nil in a process's own Export.
	Clients ClientExports
}

// ClientExports are the exported caches in shared memory of the peers on
// the node's host, one per peer process.
type ClientExports interface {
	// For returns the cache of connection c's peer (made if need be),
	// with c allowed to map it, to be filled under a capability good until
	// (Unix nanoseconds), and done, to call once the caller has filled
	// it; nil if it has none. Until done the cache is not revoked.
	For(c *fabric.Conn, until int64) (x *Export, done func())
	// InvalidateChunk drops chunk's blocks from every client's cache.
	InvalidateChunk(chunk ids.ChunkID)
}

// ReplayWindow is how far an optimistic read's timestamp may be from the
// node's clock (clients' and nodes' clocks must agree to within it, or
// optimistic reads fall back to requests), and MaxReplayTags bounds the
// tags remembered within it (past it, reads fall back).
const (
	ReplayWindow  = 2 * time.Second
	MaxReplayTags = 1 << 19
)

// RefKey is the key of the reference to slot's fill under gen (none in a
// client's own cache, which is read without the node's check).
func (e *Export) RefKey(slot uint32, gen uint64) regionmac.Tag {
	if e.Secret == nil {
		return regionmac.Tag{}
	}
	return regionmac.RefKey(e.Secret, e.Region, uint64(slot)*uint64(expcache.HeaderSize+e.Cache.BlockSize()), gen)
}

// Guard serves an optimistic read of the arena (a fabric.Guard).
func (e *Export) Guard(key, off, wordOff uint64, auth, dst []byte) (uint64, error) {
	a, err := regionmac.ParseAuth(auth)
	if err != nil {
		return 0, err
	}
	// A stale reference is refused before its tag is remembered: tags
	// of references that no longer open anything cannot fill the
	// replay window.
	if !e.Cache.Holds(off, a.Gen) {
		return 0, fmt.Errorf("export: stale: slot at %d does not hold generation %d", off, a.Gen)
	}
	k := regionmac.RefKey(e.Secret, key, off, a.Gen)
	if len(dst) > 1<<32-1 {
		return 0, fmt.Errorf("export: read of %d bytes", len(dst))
	}
	if err := e.Replays.Verify(k[:], regionmac.Op{Region: key, Off: off, Len: uint32(len(dst)), Time: a.Time}, a.Tag, e.Now()); err != nil {
		return 0, err
	}
	return e.Cache.ReadSlot(dst, off, wordOff, a.Gen)
}

// maxExportSpan bounds the reads whose blocks are exported: small reads
// are what optimistic reads are for, and their references fit the reply.
const maxExportSpan = 64 << 10

// exportRefs fills the exported cache with the blocks of sp that its
// first piece holds — export blocks whole, or ending at the chunk's end,
// within the range cp allows — whose store blocks pass their checksums,
// and returns the references for the reply (Block 0: none). A client on
// the node's host (conn shared) gets references to its own cache.
func (x *reader) exportRefs(sp *span, conn *fabric.Conn, cp *capability.Capability) wire.Export {
	e := x.d.Export
	if e == nil || sp.end-sp.start > maxExportSpan || int64(len(sp.first)) < sp.end-sp.start || sp.end == sp.start {
		return wire.Export{}
	}
	var until int64
	if e.Clients != nil && conn.Shared() {
		ce, done := e.Clients.For(conn, cp.Expiry)
		if ce == nil {
			return wire.Export{}
		}
		defer done()
		e, until = ce, cp.Expiry
	}
	// Only intact data is exported: the client checks the slot's CRC,
	// which the cache computes over what it is given.
	bs := int64(x.d.Store.BlockSize())
	for i, want := range sp.crcs {
		b := sp.first[int64(i)*bs : min(int64(i+1)*bs, sp.end-sp.start)]
		if crc32c.Checksum(b) != want {
			return wire.Export{}
		}
	}
	eb := int64(e.Cache.BlockSize())
	lo, hi := sp.start, min(sp.end, sp.info.Length)
	if capEnd := cp.Off + cp.Len; capEnd >= cp.Off && uint64(hi) > capEnd {
		hi = int64(capEnd)
	}
	if uint64(lo) < cp.Off {
		lo = int64(min(cp.Off, uint64(hi)))
	}
	first := (lo + eb - 1) / eb
	var list []wire.ExportRef
	for b := first; len(list) < wire.MaxExportRefs; b++ {
		blo, bhi := b*eb, min((b+1)*eb, sp.info.Length)
		if bhi > hi || blo >= bhi {
			break
		}
		r, ok := e.Cache.Get(sp.chunk, uint64(b), sp.info.Version)
		if ok && r.Version > sp.info.Version {
			break // a newer read filled it: this one's bytes are old
		}
		if !ok {
			var err error
			if r, err = e.Cache.Fill(sp.chunk, uint64(b), sp.info.Version, sp.first[blo-sp.start:bhi-sp.start]); err != nil {
				break
			}
		}
		if until != 0 {
			e.Cache.Extend(r.Slot, r.Gen, until)
		}
		list = append(list, wire.ExportRef{Slot: r.Slot, Gen: r.Gen, Key: e.RefKey(r.Slot, r.Gen)})
	}
	if len(list) == 0 {
		return wire.Export{}
	}
	// A commit after this read's view dropped the chunk's blocks (the
	// store's OnChange) perhaps before they were filled: if the chunk has
	// moved on, drop them again. The store's index shows a commit before
	// its OnChange runs, so one of the two drops follows the fills.
	if info, err := x.d.Store.Stat(sp.chunk); err != nil || info.Version != sp.info.Version {
		e.Cache.InvalidateChunk(sp.chunk)
		return wire.Export{}
	}
	return wire.Export{Epoch: e.Epoch, Region: e.Region, Block: uint32(eb), First: uint64(first), List: list}
}

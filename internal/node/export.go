package node

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/policy"
	"github.com/sluicefs/sluice/internal/regionmac"
)

// DefaultExportBlock is the exported cache's block size unless set.
const DefaultExportBlock = 4 << 10

// startExport sets up the exported cache (Options.ExportCache): an arena
// registered with the fabric for optimistic reads alone, each checked
// by the export's Guard (a reference's key, a fresh timestamp, the slot
// still holding the fill), its slots filled by small reads. Every run of
// the node has a new epoch and secret and starts its generations above
// the last run's (the clock's), so no reference of an earlier run is
// ever taken for one of this run's.
func (n *Node) startExport() error {
	size := n.opts.ExportCache
	if size <= 0 {
		return nil
	}
	bs := n.opts.ExportBlock
	if bs == 0 {
		bs = DefaultExportBlock
	}
	if bs < 512 || bs > 1<<20 || bs&(bs-1) != 0 {
		return fmt.Errorf("node: export block %d: a power of two from 512 bytes to 1 MiB", bs)
	}
	if size < int64(expcache.HeaderSize+bs) {
		return fmt.Errorf("node: export cache of %d bytes holds no %d-byte block", size, bs)
	}
	// 8-byte aligned (a []uint64's memory): the slots' generations are
	// read and written atomically. Not shared memory: a peer mapping it
	// would read every slot, whoever's reads filled them.
	words := make([]uint64, size/8)
	arena := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*8)
	c, err := expcache.New(arena, bs, uint64(time.Now().UnixNano())<<1)
	if err != nil {
		return fmt.Errorf("node: export cache: %w", err)
	}
	var rnd [8 + regionmac.SecretSize]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("node: export epoch and secret: %w", err)
	}
	x := &policy.Export{Cache: c, Epoch: binary.LittleEndian.Uint64(rnd[:]) | 1, Secret: rnd[8:],
		Replays: regionmac.NewVerifier(policy.ReplayWindow, policy.MaxReplayTags),
		Now:     func() int64 { return time.Now().UnixNano() }}
	x.Region = n.ep.RegisterGuarded(arena, expcache.HeaderSize+bs, x.Guard).Key()
	if cs := n.opts.ExportClientCache; cs >= 0 {
		if cs == 0 {
			cs = min(DefaultExportClientCache, size)
		}
		if cs > size {
			return fmt.Errorf("node: a client's export cache of %d bytes is larger than the export cache (%d)", cs, size)
		}
		if cs < int64(expcache.HeaderSize+bs) {
			return fmt.Errorf("node: a client's export cache of %d bytes holds no %d-byte block", cs, bs)
		}
		ce := &clientExports{ep: n.ep, size: int(cs), block: bs, epoch: x.Epoch, now: x.Now, m: map[int32]*clientCache{}}
		x.Clients = ce
		n.exportStop = make(chan struct{})
		n.wg.Add(1)
		go ce.run(n.exportStop, n.wg.Done)
	}
	n.export.Store(x)
	n.log.Info("exported cache", "bytes", size, "block", bs, "slots", c.Slots())
	return nil
}

// exportChanged drops a changed chunk's exported blocks (store.OnChange).
func (n *Node) exportChanged(id ids.ChunkID) {
	if e := n.export.Load(); e != nil {
		e.Cache.InvalidateChunk(id)
		if e.Clients != nil {
			e.Clients.InvalidateChunk(id)
		}
	}
}

package node

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/policy"
)

// DefaultExportBlock is the exported cache's block size unless set.
const DefaultExportBlock = 4 << 10

// startExport sets up the exported cache (Options.ExportCache): an arena
// registered read-only with the fabric, its slots filled by small reads
// and read by clients with one-sided operations. Every run of the node
// has a new epoch and starts its generations above the last run's (the
// clock's), so no reference of an earlier run is ever taken for one of
// this run's.
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
	// Shared memory (a peer on this host reaching the node over the
	// shm fabric copies slots itself, and the node's CPU does nothing),
	// else the heap; 8-byte aligned either way (a page; a []uint64's
	// memory): the slots' generations are read and written atomically.
	arena, err := n.ep.Alloc(int(size))
	if err != nil {
		n.log.Warn("exported cache in private memory: peers on this host read it by packets", "err", err)
		words := make([]uint64, size/8)
		arena = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*8)
	}
	c, err := expcache.New(arena, bs, uint64(time.Now().UnixNano())<<1)
	if err != nil {
		return fmt.Errorf("node: export cache: %w", err)
	}
	var epoch [8]byte
	if _, err := rand.Read(epoch[:]); err != nil {
		return fmt.Errorf("node: export epoch: %w", err)
	}
	region := n.ep.Register(arena, fabric.RemoteRead)
	n.export.Store(&policy.Export{Cache: c, Region: region.Key(), Epoch: binary.LittleEndian.Uint64(epoch[:]) | 1})
	n.log.Info("exported cache", "bytes", size, "block", bs, "slots", c.Slots())
	return nil
}

// exportChanged drops a changed chunk's exported blocks (store.OnChange).
func (n *Node) exportChanged(id ids.ChunkID) {
	if e := n.export.Load(); e != nil {
		e.Cache.InvalidateChunk(id)
	}
}

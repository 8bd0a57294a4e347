package node

import (
	"context"
	"errors"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/store"
)

// Scrubbing: the node re-reads its chunks in the background, checking
// every block against its checksum, at most ScrubRate bytes a second,
// one pass every ScrubInterval. A chunk that fails goes to meta with the
// next heartbeat (until meta has it), and meta has the copy rebuilt from
// a healthy one (docs/failures.md). Reads meanwhile never return it: the
// client checks every block too and reads another replica.

func (n *Node) scrubLoop(ctx context.Context) {
	defer n.wg.Done()
	for {
		start := time.Now()
		chunks, bytes, bad := n.scrubPass(ctx)
		if ctx.Err() != nil {
			return
		}
		n.log.Info("scrub pass done", "chunks", chunks, "bytes", bytes, "corrupt", bad, "took", time.Since(start).Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(n.opts.ScrubInterval-time.Since(start), time.Second)):
		}
	}
}

// scrubPass verifies every chunk once.
func (n *Node) scrubPass(ctx context.Context) (chunks int, bytes int64, bad int) {
	var list []ids.ChunkID
	var sizes []int64
	n.store.List(func(id ids.ChunkID, info store.Info) bool {
		list, sizes = append(list, id), append(sizes, info.Length)
		return true
	})
	for i, id := range list {
		if ctx.Err() != nil {
			return
		}
		t0 := time.Now()
		// Bad blocks found go to meta (the store's OnCorrupt), which has
		// them healed from the other copies.
		_, err := n.store.Verify(id)
		chunks++
		bytes += sizes[i]
		if errors.Is(err, store.ErrCorrupt) {
			bad++
			n.log.Error("scrub found blocks failing their checksums; meta will have them healed", "chunk", id, "err", err)
		} else if err != nil && !errors.Is(err, store.ErrClosed) {
			n.log.Warn("scrub could not verify a chunk", "chunk", id, "err", err)
		}
		if r := n.opts.ScrubRate; r > 0 {
			// Spread the pass: this chunk's share of a second per r bytes.
			wait := time.Duration(float64(sizes[i])/float64(r)*float64(time.Second)) - time.Since(t0)
			select {
			case <-ctx.Done():
				return
			case <-time.After(max(wait, 0)):
			}
		}
	}
	return
}

// reportCorrupt queues for the next heartbeat that node's copy of chunk
// (node 0: this node's) at version holds bad blocks. Reports past
// metaapi.MaxCorruptCopies waiting are dropped: the scrub finds them again.
func (n *Node) reportCorrupt(chunk ids.ChunkID, node ids.NodeID, version uint64, bad extent.List) {
	if len(bad) > metaapi.MaxBadExtents {
		bad = nil // too many to list: meta counts the copy bad throughout
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, q := range n.corrupt {
		if q.Chunk == chunk && q.Node == node && q.Version == version && (q.Bad == nil || bad != nil && q.Bad.Union(bad).Bytes() == q.Bad.Bytes()) {
			return // already waiting to be reported
		}
	}
	if len(n.corrupt) >= metaapi.MaxCorruptCopies {
		n.log.Warn("too many corrupt copies waiting to be reported; dropping one", "chunk", chunk, "node", node)
		return
	}
	n.corrupt = append(n.corrupt, metaapi.CorruptCopy{Chunk: chunk, Node: node, Version: version, Bad: bad})
}

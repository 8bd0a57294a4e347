package node

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
)

// Scrubbing: the node re-reads its chunks in the background, checking
// every block against its checksum, at most ScrubRate bytes a second,
// one pass every ScrubInterval. A chunk that fails goes to meta with the
// next heartbeat (until meta has it), and meta has the copy rebuilt from
// a healthy one (docs/failures.md). Reads meanwhile never return it: the
// client checks every block too and reads another replica.

// maxCorruptReports bounds the corrupt chunks one heartbeat carries.
const maxCorruptReports = 1024

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
		err := n.store.Verify(id)
		chunks++
		bytes += sizes[i]
		if errors.Is(err, store.ErrCorrupt) {
			bad++
			n.log.Error("scrub found a corrupt chunk; meta will have it rebuilt", "chunk", id, "err", err)
			n.reportCorrupt(id)
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

// reportCorrupt queues a corrupt chunk for the next heartbeat.
func (n *Node) reportCorrupt(id ids.ChunkID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !slices.Contains(n.corrupt, id) && len(n.corrupt) < maxCorruptReports {
		n.corrupt = append(n.corrupt, id)
	}
}

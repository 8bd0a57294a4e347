package sdk

import (
	"context"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// capMargin: a cached capability is not used within this much of its
// expiry, so it cannot expire on the way to the node — or within a
// quarter of its lifetime, if that is less (a cluster with short
// capability lifetimes still caches them).
const capMargin = 30 * time.Second

// usableUntil is when a capability of this expiry, received at got, stops
// being used from the cache.
func usableUntil(got, expiry int64) int64 {
	return expiry - min(int64(capMargin), max(expiry-got, 0)/4)
}

// maxCachedFiles bounds the layout cache; past it, the cache is reset.
const maxCachedFiles = 4096

// layoutCache keeps chunk layouts and their capabilities per file, so a
// write costs one meta round trip per chunk allocation, not per write.
type layoutCache struct {
	mu    sync.Mutex
	files map[ids.Ino]map[int64]cached
}

type cached struct {
	l     metaapi.ChunkLayout
	write bool
	until int64 // usableUntil
}

func newLayoutCache() *layoutCache { return &layoutCache{files: map[ids.Ino]map[int64]cached{}} }

func (lc *layoutCache) get(ino ids.Ino, idx int64, write bool) (metaapi.ChunkLayout, bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	e, ok := lc.files[ino][idx]
	if !ok || (write && !e.write) || time.Now().UnixNano() > e.until {
		return metaapi.ChunkLayout{}, false
	}
	return e.l, true
}

func (lc *layoutCache) put(ino ids.Ino, ls []metaapi.ChunkLayout, write bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	m := lc.files[ino]
	if m == nil {
		if len(lc.files) >= maxCachedFiles {
			lc.files = map[ids.Ino]map[int64]cached{}
		}
		m = map[int64]cached{}
		lc.files[ino] = m
	}
	now := time.Now().UnixNano()
	for _, l := range ls {
		if old, ok := m[l.Index]; ok && old.write && !write && old.l.Chunk == l.Chunk && old.l.Expiry > l.Expiry {
			continue // keep the stronger capability
		}
		m[l.Index] = cached{l: l, write: write, until: usableUntil(now, l.Expiry)}
	}
}

// setVersion records a version this client committed, so its own reads
// never accept an older replica.
func (lc *layoutCache) setVersion(ino ids.Ino, idx int64, v uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if e, ok := lc.files[ino][idx]; ok && v > e.l.Version {
		e.l.Version = v
		lc.files[ino][idx] = e
	}
}

// written records a write this client committed as ver to chunk l.
func (lc *layoutCache) written(ino ids.Ino, l *metaapi.ChunkLayout, ver uint64) {
	if l.ZeroFrom > 0 {
		lc.dropChunk(ino, l.Index) // meta moves ZeroFrom on commit
		return
	}
	lc.setVersion(ino, l.Index, ver)
}

func (lc *layoutCache) drop(ino ids.Ino) {
	lc.mu.Lock()
	delete(lc.files, ino)
	lc.mu.Unlock()
}

func (lc *layoutCache) dropChunk(ino ids.Ino, idx int64) {
	lc.mu.Lock()
	delete(lc.files[ino], idx)
	lc.mu.Unlock()
}

// layouts returns the layouts of the chunks covering [off, off+n) of ino,
// from the cache or meta; with write, missing chunks are allocated. For
// reads, chunks that do not exist (holes) are absent from the map. The
// file's attributes come back when meta was asked (nil otherwise).
func (c *Client) chunkLayouts(ctx context.Context, ino ids.Ino, chunkSize, off, n int64, write bool) (map[int64]metaapi.ChunkLayout, *metaapi.Attr, error) {
	out := map[int64]metaapi.ChunkLayout{}
	if n <= 0 {
		return out, nil, nil
	}
	first, last := off/chunkSize, (off+n-1)/chunkSize
	missing := false
	for i := first; i <= last; i++ {
		l, ok := c.layouts.get(ino, i, write)
		if !ok {
			missing = true
			break
		}
		out[i] = l
	}
	if !missing {
		return out, nil, nil
	}
	var attr *metaapi.Attr
	for from := first; from <= last; {
		var resp metaapi.LayoutResp
		// The exact range, not whole chunks: meta counts what a write
		// puts on the nodes it places new chunks on (the same chunks are
		// returned either way).
		lo := max(off, from*chunkSize)
		req := metaapi.LayoutReq{Ino: ino, Off: lo, Len: off + n - lo, Write: write, Who: c.whoOf(ctx)}
		if err := c.meta.Call(ctx, metaapi.OpLayout, req, &resp); err != nil {
			return nil, nil, err
		}
		c.layouts.put(ino, resp.Chunks, write)
		a := resp.Attr
		attr = &a
		for _, l := range resp.Chunks {
			out[l.Index] = l
		}
		if !resp.More || len(resp.Chunks) == 0 {
			break
		}
		from = resp.Chunks[len(resp.Chunks)-1].Index + 1
	}
	return out, attr, nil
}

// bufferPool keeps receive buffers: a node's read reply lands in one by
// one-sided WRITE, with no copy through the message stream. A buffer is
// registered under a fresh key for each read and deregistered when the
// read is done, so no node can write into it outside its own read.
type bufferPool struct {
	ep   *fabric.Endpoint
	size int
	free chan []byte
}

func newBufferPool(ep *fabric.Endpoint, size int) *bufferPool {
	return &bufferPool{ep: ep, size: size, free: make(chan []byte, 32)}
}

func (b *bufferPool) get() *fabric.Region {
	var buf []byte
	select {
	case buf = <-b.free:
	default:
		buf = make([]byte, b.size)
	}
	return b.ep.Register(buf, fabric.RemoteWrite)
}

func (b *bufferPool) put(r *fabric.Region) {
	b.ep.Deregister(r)
	select {
	case b.free <- r.Bytes():
	default:
	}
}

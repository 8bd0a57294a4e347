package store

import (
	"sync"
	"sync/atomic"

	"github.com/sluicefs/sluice/internal/ids"
)

// chunkState is the in-memory coordination for one chunk. It exists only
// while someone uses the chunk (or while a redo is pending) so idle chunks
// cost nothing.
type chunkState struct {
	refs    int  // guarded by the shard mutex
	writing bool // an open Write or a Delete owns the chunk; guarded by the shard mutex

	// mu: Reads hold it shared for their lifetime; Commit holds it
	// exclusively while it publishes new metadata and applies staged bytes.
	mu sync.RWMutex

	// redoPending is set when a committed write could not apply (or sync)
	// its staged bytes. Until someone applies them the chunk's data lags
	// its metadata, so every user must settle it first.
	redoPending atomic.Bool
}

const chunkShards = 64

// chunkTable maps chunk IDs to their state. Sharded so chunks never
// contend with each other on one mutex.
type chunkTable struct {
	shards [chunkShards]chunkShard
}

type chunkShard struct {
	mu sync.Mutex
	m  map[ids.ChunkID]*chunkState
	_  [40]byte // keep shards on separate cache lines
}

func (t *chunkTable) shard(id ids.ChunkID) *chunkShard {
	// Fibonacci hashing: sequential IDs still spread over shards.
	return &t.shards[(uint64(id)*0x9e3779b97f4a7c15)>>58]
}

func (sh *chunkShard) getLocked(id ids.ChunkID) *chunkState {
	c := sh.m[id]
	if c == nil {
		if sh.m == nil {
			sh.m = make(map[ids.ChunkID]*chunkState)
		}
		c = &chunkState{}
		sh.m[id] = c
	}
	c.refs++
	return c
}

// acquire returns id's state with a reference held.
func (t *chunkTable) acquire(id ids.ChunkID) *chunkState {
	sh := t.shard(id)
	sh.mu.Lock()
	c := sh.getLocked(id)
	sh.mu.Unlock()
	return c
}

// acquireWriter returns id's state owned for writing, or false if someone
// else owns it.
func (t *chunkTable) acquireWriter(id ids.ChunkID) (*chunkState, bool) {
	sh := t.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.getLocked(id)
	if c.writing {
		c.refs--
		return nil, false
	}
	c.writing = true
	return c, true
}

// release drops a reference (and write ownership if writer) and forgets
// the chunk when nobody uses it.
func (t *chunkTable) release(id ids.ChunkID, c *chunkState, writer bool) {
	sh := t.shard(id)
	sh.mu.Lock()
	c.refs--
	if writer {
		c.writing = false
	}
	if c.refs == 0 && !c.redoPending.Load() {
		delete(sh.m, id)
	}
	sh.mu.Unlock()
}

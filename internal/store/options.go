package store

import (
	"fmt"
	"log/slog"
	"math/bits"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// Options configure a Store.
type Options struct {
	Dir          string       // data directory (created if missing)
	BlockSize    int          // checksum block size; default 16384 (power of two, 4 KiB..1 MiB)
	MaxChunkSize int64        // default 1 << 30; no write may end beyond it
	Logger       *slog.Logger // default: discard
	// RecycleBytes bounds the pool of deleted chunk files kept for reuse
	// (see recycle.go). 0 means DefaultRecycleBytes; negative disables it.
	RecycleBytes int64
	// OnCorrupt, if set, is told of every block the store finds failing
	// its checksum (by Verify, a write's edge check, or NoteCorrupt):
	// the chunk, its committed version and the bad bytes. It must not
	// block; the node passes it on to meta, which has the copy healed.
	OnCorrupt func(id ids.ChunkID, version uint64, bad extent.List)
	// OnNoSpace, if set, is called whenever the file system turns out
	// full (a write or the index met ENOSPC), so the caller can report
	// its space at once. It must not block.
	OnNoSpace func()
	// OnChange, if set, is told of every chunk whose committed data
	// changes (a write committed, the chunk deleted), at the moment it
	// does: a copy of its bytes kept elsewhere (the exported cache) is
	// stale from then on. It runs under the chunk's lock and must not
	// block.
	OnChange func(id ids.ChunkID)
}

const (
	defaultBlockSize    = 16 << 10
	minBlockSize        = 4 << 10
	maxBlockSize        = 1 << 20
	defaultMaxChunkSize = 1 << 30
)

// withDefaults fills in zero fields and rejects values the store cannot use.
func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, fmt.Errorf("store: options: Dir is empty")
	}
	if o.BlockSize == 0 {
		o.BlockSize = defaultBlockSize
	}
	if o.BlockSize < minBlockSize || o.BlockSize > maxBlockSize || bits.OnesCount(uint(o.BlockSize)) != 1 {
		return o, fmt.Errorf("store: options: block size %d is not a power of two in [%d, %d]",
			o.BlockSize, minBlockSize, maxBlockSize)
	}
	if o.MaxChunkSize == 0 {
		o.MaxChunkSize = defaultMaxChunkSize
	}
	if o.MaxChunkSize < 0 {
		return o, fmt.Errorf("store: options: negative max chunk size %d", o.MaxChunkSize)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RecycleBytes == 0 {
		o.RecycleBytes = DefaultRecycleBytes
	}
	return o, nil
}

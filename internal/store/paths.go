package store

import (
	"fmt"
	"path/filepath"

	"github.com/sluicefs/sluice/internal/ids"
)

// On-disk layout under Options.Dir.
const (
	indexDir   = "index"
	chunksDir  = "chunks"
	stagingDir = "staging"
)

// chunkFanout is the number of chunk subdirectories: keyed by the low byte
// of the ID, which meta allocates sequentially, so they fill evenly.
const chunkFanout = 256

func (s *Store) chunkSubdir(id ids.ChunkID) string {
	return filepath.Join(s.dir, chunksDir, fmt.Sprintf("%02x", uint64(id)&0xff))
}

func (s *Store) chunkPath(id ids.ChunkID) string {
	return filepath.Join(s.chunkSubdir(id), fmt.Sprintf("%016x.chunk", uint64(id)))
}

func (s *Store) stagingPath(id ids.ChunkID, version uint64) string {
	return filepath.Join(s.dir, stagingDir, fmt.Sprintf("%016x-%016x.stage", uint64(id), version))
}

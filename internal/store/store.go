package store

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/privfs"
	"github.com/sluicefs/sluice/internal/privfs/privpebble"
)

// Info is a chunk's committed state.
type Info struct {
	Version uint64 // committed version; 0 = chunk never written
	Length  int64  // committed length: highest committed byte offset + 1 (holes inside read as zeros)
	// Tag is the tag the write that made this version carried (0: none):
	// it lets a replica recognise a retried write it has already applied.
	Tag uint64
}

// Store is the chunk store of one storage node. It is safe for concurrent
// use.
type Store struct {
	dir        string
	blockSize  int
	blockShift uint
	maxChunk   int64
	log        *slog.Logger
	db         *pebble.DB

	gate    gate
	chunks  chunkTable
	pool    pool
	reserve reserve // the index's, for a full file system (space.go)
	doubts  doubts
	fences  fences
	// suspects are chunks found holding bad blocks; onCorrupt is told of
	// each finding (Options.OnCorrupt).
	suspects  suspects
	onCorrupt func(ids.ChunkID, uint64, extent.List)
	// onNoSpace is Options.OnNoSpace.
	onNoSpace func()
	// onChange is Options.OnChange.
	onChange func(ids.ChunkID)

	usedBytes atomic.Int64
	numChunks atomic.Int64
	footprint footprint
	disk      string // diskID of the file system, found at Open

	zeroBlockCRC uint32    // CRC32C of a full block of zeros
	copyBufs     sync.Pool // *[]byte of copyBufSize, for commit-time reads and copies

	hooks hooks
}

// hooks let tests stop a Commit at its crash-critical points. A hook that
// returns an error makes Commit return it at once, touching nothing more on
// disk, as if the process had died there.
type hooks struct {
	beforeIndexCommit func() error
	afterIndexCommit  func() error
	// applyFault, if it returns an error, fails the apply of staged bytes
	// as an I/O error would (not a crash: the store goes on).
	applyFault func() error
}

const copyBufSize = 256 << 10

// Open opens (creating if needed) the store in opts.Dir, applies any redo
// records a crash left behind and discards staging files of writes that
// never committed.
func Open(opts Options) (*Store, error) {
	blockSizeAsked := opts.BlockSize
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := makeDirs(opts.Dir); err != nil {
		return nil, fmt.Errorf("store: open %s: %w", opts.Dir, err)
	}
	s := &Store{
		dir:       opts.Dir,
		maxChunk:  opts.MaxChunkSize,
		log:       opts.Logger,
		gate:      newGate(),
		onCorrupt: opts.OnCorrupt,
		onNoSpace: opts.OnNoSpace,
		onChange:  opts.OnChange,
		disk:      diskID(opts.Dir),
	}
	s.copyBufs.New = func() any { b := make([]byte, copyBufSize); return &b }
	if err := s.pool.open(opts.Dir, opts.RecycleBytes); err != nil {
		return nil, fmt.Errorf("store: open recycle pool in %s: %w", opts.Dir, err)
	}
	if err := s.reserve.open(opts.Dir); err != nil {
		return nil, fmt.Errorf("store: open %s: %w", opts.Dir, err)
	}
	db, err := pebble.Open(filepath.Join(opts.Dir, indexDir), &pebble.Options{
		Logger: pebbleLogger{opts.Logger},
		FS:     vfs.OnDiskFull(privpebble.FS(vfs.Default), s.indexFull),
	})
	if err != nil {
		return nil, fmt.Errorf("store: open index in %s: %w", opts.Dir, err)
	}
	s.db = db
	if err := s.open(blockSizeAsked, opts.BlockSize); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: open %s: %w", opts.Dir, err)
	}
	return s, nil
}

func (s *Store) open(asked, dflt int) error {
	bs, err := s.loadFormat(asked, dflt)
	if err != nil {
		return err
	}
	s.blockSize = bs
	s.blockShift = uint(bits.TrailingZeros(uint(bs)))
	s.zeroBlockCRC = crcZeros(int64(bs))
	if err := s.replayAll(); err != nil {
		return err
	}
	if err := s.loadDoubts(); err != nil {
		return err
	}
	if err := s.loadFences(); err != nil {
		return err
	}
	return s.loadUsage()
}

// makeDirs creates the directory tree, private to this account (see
// privfs), syncing each parent whose entries changed so the tree survives
// a crash.
func makeDirs(dir string) error {
	if err := privfs.MkdirAll(dir); err != nil {
		return err
	}
	mk := func(parent, name string) (bool, error) {
		return privfs.Mkdir(filepath.Join(parent, name))
	}
	top := false
	for _, name := range []string{chunksDir, stagingDir} {
		made, err := mk(dir, name)
		if err != nil {
			return err
		}
		top = top || made
	}
	sub := false
	for i := range chunkFanout {
		made, err := mk(filepath.Join(dir, chunksDir), fmt.Sprintf("%02x", i))
		if err != nil {
			return err
		}
		sub = sub || made
	}
	if sub {
		if err := syncDir(filepath.Join(dir, chunksDir)); err != nil {
			return err
		}
	}
	if top {
		return syncDir(dir)
	}
	return nil
}

// loadFormat returns the block size the store was created with, recording
// it on first open. Checksums are only meaningful for that block size, so
// asking for another one is an error.
func (s *Store) loadFormat(asked, dflt int) (int, error) {
	v, closer, err := s.db.Get(formatKey())
	if errors.Is(err, pebble.ErrNotFound) {
		if err := s.db.Set(formatKey(), encodeFormat(dflt), pebble.Sync); err != nil {
			return 0, fmt.Errorf("record format: %w", err)
		}
		return dflt, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read format: %w", err)
	}
	bs, err := decodeFormat(v)
	closer.Close()
	if err != nil {
		return 0, err
	}
	if asked != 0 && asked != bs {
		return 0, fmt.Errorf("store has block size %d, options ask for %d", bs, asked)
	}
	return bs, nil
}

func (s *Store) loadUsage() error {
	var bytes, n int64
	err := s.List(func(_ ids.ChunkID, in Info) bool {
		bytes += in.Length
		n++
		return true
	})
	s.usedBytes.Store(bytes)
	s.numChunks.Store(n)
	return err
}

// Close waits for operations using the index to finish and closes it.
// Writes still open afterwards fail to commit with ErrClosed; Abort them.
func (s *Store) Close() error {
	if !s.gate.close() {
		return nil
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("store: close index: %w", err)
	}
	return nil
}

// BlockSize returns the checksum block size.
func (s *Store) BlockSize() int { return s.blockSize }

// Stat returns id's committed state; Info{} for a chunk never written.
func (s *Store) Stat(id ids.ChunkID) (Info, error) {
	if !s.gate.enter() {
		return Info{}, fmt.Errorf("store: stat %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c := s.chunks.acquire(id)
	defer s.chunks.release(id, c, false)
	if err := s.lockShared(id, c); err != nil {
		return Info{}, fmt.Errorf("store: stat %v: %w", id, err)
	}
	in, err := s.loadInfo(id)
	c.mu.RUnlock()
	if err != nil {
		return Info{}, fmt.Errorf("store: stat %v: %w", id, err)
	}
	return in, nil
}

// loadInfo reads id's committed Info from the index.
func (s *Store) loadInfo(id ids.ChunkID) (Info, error) {
	v, closer, err := s.db.Get(infoKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return Info{}, nil
	}
	if err != nil {
		return Info{}, fmt.Errorf("read info: %w", err)
	}
	defer closer.Close()
	return decodeInfo(v)
}

// lockShared takes c's shared lock once its data agrees with its
// metadata, applying a pending redo first if needed.
func (s *Store) lockShared(id ids.ChunkID, c *chunkState) error {
	for {
		if err := s.settle(id, c); err != nil {
			return err
		}
		c.mu.RLock()
		if !c.redoPending.Load() {
			return nil
		}
		c.mu.RUnlock()
	}
}

// List calls fn for every chunk with committed state, in ID order, until
// fn returns false.
func (s *Store) List(fn func(ids.ChunkID, Info) bool) error { return s.ListFrom(0, fn) }

// ListFrom is List starting at chunk from.
func (s *Store) ListFrom(from ids.ChunkID, fn func(ids.ChunkID, Info) bool) error {
	if !s.gate.enter() {
		return fmt.Errorf("store: list: %w", ErrClosed)
	}
	defer s.gate.exit()
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: infoKey(from),
		UpperBound: []byte{kindInfo + 1},
	})
	if err != nil {
		return fmt.Errorf("store: list: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		id, err := chunkIDFromKey(it.Key())
		if err != nil {
			it.Close()
			return fmt.Errorf("store: list: %w", err)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("store: list %v: %w", id, err)
		}
		in, err := decodeInfo(v)
		if err != nil {
			it.Close()
			return fmt.Errorf("store: list %v: %w", id, err)
		}
		if !fn(id, in) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("store: list: %w", err)
	}
	return nil
}

// Usage returns the committed bytes stored (the sum of chunk lengths,
// holes included) and the number of chunks.
func (s *Store) Usage() (bytes int64, chunks int64) {
	return s.usedBytes.Load(), s.numChunks.Load()
}

func (s *Store) getCopyBuf() *[]byte  { return s.copyBufs.Get().(*[]byte) }
func (s *Store) putCopyBuf(b *[]byte) { s.copyBufs.Put(b) }

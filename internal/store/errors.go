package store

import (
	"errors"

	"github.com/sluicefs/sluice/internal/admit"
)

// Sentinel errors. The store wraps them with what it was doing; match them
// with errors.Is. The refusals of admission are package admit's.
var (
	// ErrBusy: another write on the chunk is open (or a delete is running).
	// Retryable once it finishes.
	ErrBusy = admit.ErrBusy
	// ErrStale: the write's version does not follow the chunk's.
	ErrStale = admit.ErrStale
	// ErrInDoubt: an earlier write of the chunk may have reached only some
	// replicas, and this head write neither retries nor covers it (Doubt).
	// Retryable once that write is retried or covered.
	ErrInDoubt = admit.ErrInDoubt
	// ErrFenced: the write was planned on an epoch below the chunk's
	// fence (its replica set changed since): fetch a new layout.
	ErrFenced = admit.ErrFenced
	// ErrDeleted: the chunk was deleted (meta removed its file, or
	// truncated it away) and has a tombstone: nothing may write it again.
	ErrDeleted = admit.ErrDeleted
	// ErrRange: an offset or length outside what the call allows.
	ErrRange = admit.ErrRange
	// ErrIncomplete: Commit before every byte of the write was placed.
	ErrIncomplete = errors.New("write incomplete")
	// ErrCorrupt: stored data or metadata does not match its checksum or
	// its expected shape.
	ErrCorrupt = errors.New("corrupt")
	// ErrUnreadable: a copy cannot be read as a whole (its file is gone,
	// its checksums do not decode): it can only be replaced, not healed
	// block by block.
	ErrUnreadable = errors.New("copy unreadable")
	// ErrClosed: the store, or the write, is closed.
	ErrClosed = errors.New("closed")
)

package store

import "errors"

// Sentinel errors. The store wraps them with what it was doing; match them
// with errors.Is.
var (
	// ErrBusy: another write on the chunk is open (or a delete is running).
	// Retryable once it finishes.
	ErrBusy = errors.New("chunk busy")
	// ErrStale: the write's version does not follow the chunk's.
	ErrStale = errors.New("stale version")
	// ErrInDoubt: an earlier write of the chunk may have reached only some
	// replicas, and this head write neither retries nor covers it (Doubt).
	// Retryable once that write is retried or covered.
	ErrInDoubt = errors.New("unresolved write")
	// ErrFenced: the write was planned on an epoch below the chunk's
	// fence (its replica set changed since): fetch a new layout.
	ErrFenced = errors.New("fenced")
	// ErrDeleted: the chunk was deleted (meta removed its file, or
	// truncated it away) and has a tombstone: nothing may write it again.
	ErrDeleted = errors.New("chunk deleted")
	// ErrRange: an offset or length outside what the call allows.
	ErrRange = errors.New("out of range")
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

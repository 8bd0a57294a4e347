// Package admit decides whether a node accepts a write to a chunk: the
// version rules (a head chooses, a follower must follow), unresolved
// writes (Doubt), fences by epoch and tombstones, and the flat-write
// reservations of rank 0. It is pure — no sockets, no disk, no clock — in
// the style of go.etcd.io/raft's rawnode: the caller describes a chunk
// (Chunk), steps it with an event (Step) and gets the next state and a
// Decision, which it carries out (records written, files touched) itself.
// The store and the write policy call it where they decide; the rules are
// tested here with data-driven tables (testdata/).
package admit

import (
	"fmt"
	"math"

	"github.com/sluicefs/sluice/internal/ids"
)

// Tombstone is the fence epoch of a deleted chunk: above every real epoch,
// so no write passes it.
const Tombstone = math.MaxUint64

// Chunk is what admission knows of one chunk on one node.
type Chunk struct {
	ID      ids.ChunkID // for messages only
	Version uint64      // the committed version; 0: no copy
	Tag     uint64      // the tag of the write that made Version (0: none)
	Fence   uint64      // the lowest epoch a write must be planned on (Tombstone: none)
	Doubt   Doubt       // the head's unresolved write, if InDoubt
	InDoubt bool
	Write   Write // the open write, if Open (a chunk has at most one)
	Open    bool
}

// Values with presence flags, not pointers: a Chunk passed to and
// returned from Step stays on the caller's stack (the per-write path
// allocates nothing for admission).

// Write is the open write of a chunk, as admitted.
type Write struct {
	Version  uint64 // the version it commits as
	Base     uint64 // the oldest version the replicas below may hold
	Head     bool   // the version was chosen here
	Epoch    uint64 // the epoch it was planned on (Plan)
	Tag      uint64
	Off, End int64
	Resolves bool // it retries or covers the chunk's doubt: its commit clears it
}

// Event is something that happens to a chunk.
type Event interface{ event() }

// BeginHead opens a write of [Off, End) at the head replica, which
// chooses its version.
type BeginHead struct {
	Off, End int64
	Tag      uint64
}

// BeginFollow opens a write whose version a head chose: the chunk must
// be at a version from Base to Version-1. Wait is for flat writes, whose
// client writes every replica at once: a chunk below Base is then busy
// (the write before is still on its way), not stale.
type BeginFollow struct {
	Version, Base uint64
	Tag           uint64
	Wait          bool
}

// Plan declares the epoch the open write was planned on.
type Plan struct{ Epoch uint64 }

// Commit publishes the open write.
type Commit struct{}

// Abort discards the open write. InDoubt: some replica below may have
// committed it, so the head records a Doubt.
type Abort struct{ InDoubt bool }

// Fence raises the chunk's fence to Epoch (never lowers it).
type Fence struct{ Epoch uint64 }

// Drop discards the copy for a reconciliation planned at Epoch that
// found it at Version.
type Drop struct{ Epoch, Version uint64 }

// Collect discards the copy on meta's word, judged at Epoch.
type Collect struct{ Epoch uint64 }

// Resolve clears the doubt if the chunk is still at Version (every
// member was fenced and is at Version, so no replica holds the write).
type Resolve struct{ Version uint64 }

func (BeginHead) event()   {}
func (BeginFollow) event() {}
func (Plan) event()        {}
func (Commit) event()      {}
func (Abort) event()       {}
func (Fence) event()       {}
func (Drop) event()        {}
func (Collect) event()     {}
func (Resolve) event()     {}

// Decision is what the caller must do after a step. With Err set the
// write (or request) is refused; the Save flags may still be set (a Drop
// raises the fence even when it finds the copy moved on).
type Decision struct {
	Err           error
	Version, Base uint64 // BeginHead, BeginFollow: what the write commits as, and the oldest version below
	SaveFence     bool   // the fence rose: record it durably
	SaveDoubt     bool   // record the chunk's new Doubt durably
	ClearDoubt    bool   // delete the doubt record
	Delete        bool   // delete the copy
}

// Step applies ev to c: the next state and what to do. A refused event
// leaves the state as it was, except for what the Decision says to save
// and an Abort, which ends the write even when it refuses its doubt.
func Step(c Chunk, ev Event) (Chunk, Decision) {
	switch ev := ev.(type) {
	case BeginHead:
		return beginHead(c, ev)
	case BeginFollow:
		return beginFollow(c, ev)
	case Plan:
		if !c.Open {
			return c, refuse(ErrRange, "no write is open")
		}
		if err := c.CheckFence(ev.Epoch); err != nil {
			return c, Decision{Err: err}
		}
		c.Write.Epoch = ev.Epoch
		return c, Decision{Version: c.Write.Version, Base: c.Write.Base}
	case Commit:
		return commit(c)
	case Abort:
		return abort(c, ev)
	case Fence:
		if c.Fence == Tombstone {
			return c, Decision{Err: c.errDeleted()}
		}
		var d Decision
		if ev.Epoch > c.Fence {
			c.Fence, d.SaveFence = ev.Epoch, true
		}
		return c, d
	case Drop:
		return drop(c, ev)
	case Collect:
		if c.Open {
			return c, Decision{Err: fmt.Errorf("a write is open: %w", ErrBusy)}
		}
		if c.Fence != Tombstone && c.Fence > ev.Epoch {
			return c, Decision{} // meta placed a member here after it judged
		}
		c.Version, c.Tag, c.Doubt, c.InDoubt = 0, 0, Doubt{}, false
		return c, Decision{Delete: true}
	case Resolve:
		if c.Open {
			return c, Decision{Err: fmt.Errorf("a write is open: %w", ErrBusy)}
		}
		if !c.InDoubt || c.Version != ev.Version {
			return c, Decision{}
		}
		c.Doubt, c.InDoubt = Doubt{}, false
		return c, Decision{ClearDoubt: true}
	}
	// No %T of ev here: formatting it would make every caller's event
	// escape to the heap.
	return c, refuse(ErrRange, "unknown event")
}

func refuse(kind error, msg string) Decision { return Decision{Err: &refusal{msg: msg, kind: kind}} }

func (c Chunk) errDeleted() error {
	return fmt.Errorf("chunk %v was deleted, its file removed or truncated: %w", c.ID, ErrDeleted)
}

// CheckFence refuses a write planned on an epoch below the chunk's
// fence, and every write to a chunk with a tombstone. (Plan and Commit
// check it; a caller checks it alone where no write is open yet.)
func (c Chunk) CheckFence(epoch uint64) error {
	switch {
	case c.Fence == Tombstone:
		return c.errDeleted()
	case epoch < c.Fence:
		return fmt.Errorf("chunk is fenced at epoch %d, the write was planned on epoch %d: %w", c.Fence, epoch, ErrFenced)
	}
	return nil
}

// Applied reports whether write writeID (tag; 0 is none) is the one the
// chunk committed last — at version, if the write names one (below the
// head) — so a retry of it is answered "already applied" instead of
// being written again: a client's retry after a lost reply, or after a
// sibling replica refused it busy. (A replica commits only after the
// replicas below it, so they have it too.)
func (c Chunk) Applied(writeID, version uint64) bool {
	return writeID != 0 && c.Version != 0 && c.Tag == writeID && (version == 0 || c.Version == version)
}

// CheckFollow refuses versions no head chooses: a write after base as
// version, which must be above it.
func CheckFollow(version, base uint64) error {
	if version == 0 || base >= version {
		return fmt.Errorf("version %d after %d: %w", version, base, ErrRange)
	}
	return nil
}

func busyOpen() Decision {
	return Decision{Err: fmt.Errorf("another write is open: %w", ErrBusy)}
}

// beginHead chooses the version: the chunk's next one, unless its doubt
// decides otherwise or refuses the write.
func beginHead(c Chunk, ev BeginHead) (Chunk, Decision) {
	switch {
	case c.Open:
		return c, busyOpen()
	case c.Fence == Tombstone:
		return c, Decision{Err: c.errDeleted()}
	}
	w := Write{Version: c.Version + 1, Base: c.Version, Head: true, Tag: ev.Tag, Off: ev.Off, End: ev.End}
	if c.InDoubt {
		v, err := c.Doubt.admit(ev.Off, ev.End, ev.Tag)
		if err != nil {
			return c, Decision{Err: err}
		}
		w.Version, w.Resolves = v, true
	}
	c.Write, c.Open = w, true
	return c, Decision{Version: w.Version, Base: w.Base}
}

// beginFollow checks the chunk is where the head's version says it is.
func beginFollow(c Chunk, ev BeginFollow) (Chunk, Decision) {
	if err := CheckFollow(ev.Version, ev.Base); err != nil {
		return c, Decision{Err: err}
	}
	switch {
	case c.Open:
		return c, busyOpen()
	case c.Fence == Tombstone:
		return c, Decision{Err: c.errDeleted()}
	case ev.Wait && c.Version < ev.Base:
		return c, refuse(ErrBusy, fmt.Sprintf("chunk %v is at version %d, write %d must wait for %d", c.ID, c.Version, ev.Version, ev.Base))
	case ev.Base+1 == ev.Version && c.Version != ev.Base:
		return c, Decision{Err: fmt.Errorf("chunk is at version %d, want %d: %w", c.Version, c.Version+1, ErrStale)}
	case c.Version < ev.Base || c.Version >= ev.Version:
		return c, Decision{Err: fmt.Errorf("chunk is at version %d, write %d needs %d to %d: %w", c.Version, ev.Version, ev.Base, ev.Version-1, ErrStale)}
	}
	c.Write, c.Open = Write{Version: ev.Version, Base: ev.Base, Tag: ev.Tag}, true
	return c, Decision{Version: ev.Version, Base: ev.Base}
}

// commit publishes the open write unless a fence came since it was
// planned; a write that retries or covers the doubt resolves it.
func commit(c Chunk) (Chunk, Decision) {
	if !c.Open {
		return c, refuse(ErrRange, "no write is open")
	}
	if err := c.CheckFence(c.Write.Epoch); err != nil {
		return c, Decision{Err: err}
	}
	var d Decision
	if c.Write.Resolves {
		c.Doubt, c.InDoubt, d.ClearDoubt = Doubt{}, false, true
	}
	c.Version, c.Tag, c.Write, c.Open = c.Write.Version, c.Write.Tag, Write{}, false
	return c, d
}

// abort ends the open write; in doubt, the head records it (see Doubt).
// Only a head write can be in doubt: a follower's abort is plain.
func abort(c Chunk, ev Abort) (Chunk, Decision) {
	w := c.Write
	if !c.Open {
		return c, Decision{}
	}
	c.Write, c.Open = Write{}, false
	if !ev.InDoubt {
		return c, Decision{}
	}
	if !w.Head {
		return c, refuse(ErrRange, "not a head write")
	}
	c.Doubt, c.InDoubt = Doubt{Base: w.Base, Version: w.Version, Tag: w.Tag, Off: w.Off, End: w.End}, true
	return c, Decision{SaveDoubt: true}
}

// drop discards a copy a reconciliation planned at ev.Epoch found at
// ev.Version, unless a later one fenced the chunk or it moved on.
func drop(c Chunk, ev Drop) (Chunk, Decision) {
	var d Decision
	switch {
	case c.Open:
		return c, Decision{Err: fmt.Errorf("a write is open: %w", ErrBusy)}
	case c.Fence == Tombstone:
		return c, Decision{Err: c.errDeleted()}
	case c.Fence > ev.Epoch:
		return c, Decision{Err: fmt.Errorf("fenced at epoch %d, the drop was planned on %d: %w", c.Fence, ev.Epoch, ErrFenced)}
	case ev.Epoch > c.Fence:
		c.Fence, d.SaveFence = ev.Epoch, true
	}
	if c.Version != ev.Version {
		d.Err = fmt.Errorf("at version %d, the drop was planned at %d: %w", c.Version, ev.Version, ErrStale)
		return c, d
	}
	c.Version, c.Tag, c.Doubt, c.InDoubt, d.Delete = 0, 0, Doubt{}, false, true
	return c, d
}

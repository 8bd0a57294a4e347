// Package inventory decides which copies a storage node holds that no
// file needs there — strays — and when one may be collected. Meta feeds
// it what its records say of each copy a node lists (metaapi.InventoryReq);
// the package does no I/O, so the rules are tested on their own.
//
// Collecting a copy a file still needs is data loss, so the rules are
// conservative: a copy is collected only if no file's chunk record places
// it on that node (Judge), only once meta has found it so for the grace
// period across the node's rounds (Tracker), and — at the node — only if
// no reconciliation fenced it there after meta judged (store.Collect).
// An id meta never gave out is never collected: it means meta's state is
// older than the node's, which is for an operator to look at.
package inventory

import (
	"cmp"
	"slices"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Record is what meta's state says of one chunk id, for one node.
type Record struct {
	// Exists: a file's chunk record has this id.
	Exists bool
	// Member: that record places a member on this node — in its replica
	// set, or a former member a reconciliation under way still copies
	// from.
	Member bool
	// Queued: the chunk is queued for deletion on this node.
	Queued bool
}

// Verdict is the judgement of one copy.
type Verdict uint8

const (
	Keep Verdict = iota
	Unknown
	NotMember
	Queued
	Ahead
)

// Kind names a stray verdict for reports (Keep has none).
func (v Verdict) Kind() metaapi.StrayKind {
	switch v {
	case Unknown:
		return metaapi.StrayUnknown
	case NotMember:
		return metaapi.StrayNotMember
	case Queued:
		return metaapi.StrayQueued
	case Ahead:
		return metaapi.StrayAhead
	}
	return ""
}

// collectable: the verdicts whose copies are collected after the grace.
func (v Verdict) collectable() bool { return v == Unknown || v == NotMember }

// Judge decides one copy of chunk id on a node, given meta's record of
// it and next, meta's next chunk id (every id below it was given out
// once, and ids are never reused).
func Judge(id, next ids.ChunkID, r Record) Verdict {
	switch {
	case id >= next:
		return Ahead
	case r.Queued:
		// The heartbeat's garbage collection has it in hand.
		return Queued
	case !r.Exists:
		return Unknown
	case !r.Member:
		return NotMember
	}
	return Keep
}

// DefaultLimit bounds the strays a Tracker remembers per node.
const DefaultLimit = 1 << 16

// Tracker remembers, per node, the strays its inventories found and
// since when. It is not safe for concurrent use. Meta keeps it in memory:
// after a restart every stray waits a whole grace period again.
type Tracker struct {
	Grace time.Duration
	Limit int // strays remembered per node; DefaultLimit if 0
	nodes map[ids.NodeID]*nodeState
}

type nodeState struct {
	strays    map[ids.ChunkID]*stray
	held      int64 // copies listed in the round under way
	untracked int64 // strays of the round under way past Limit
	collected int64
	rounds    int64
	last      roundResult
}

type stray struct {
	verdict Verdict
	since   int64
	version uint64
	length  int64
}

// roundResult is what a complete round found.
type roundResult struct {
	done      int64
	held      int64
	untracked int64
	counts    map[metaapi.StrayKind]int64
}

func (t *Tracker) node(n ids.NodeID) *nodeState {
	if t.nodes == nil {
		t.nodes = map[ids.NodeID]*nodeState{}
	}
	ns := t.nodes[n]
	if ns == nil {
		ns = &nodeState{strays: map[ids.ChunkID]*stray{}}
		t.nodes[n] = ns
	}
	return ns
}

func (t *Tracker) limit() int {
	if t.Limit > 0 {
		return t.Limit
	}
	return DefaultLimit
}

// Page records one page of node's round at now (unix ns): the copies
// with ids above after, in increasing order, and their verdicts; done
// says the page covers every id above after (the round's last). A stray
// found before and not listed again in the range the page covers is
// gone from the node and forgotten. Page returns the strays to collect
// now: those still collectable that were first found at least Grace
// ago.
func (t *Tracker) Page(node ids.NodeID, after ids.ChunkID, held []metaapi.HeldChunk, verdicts []Verdict, done bool, now int64) []ids.ChunkID {
	ns := t.node(node)
	if after == 0 {
		ns.held, ns.untracked = 0, 0 // a new round
	}
	last := after
	if len(held) > 0 {
		last = held[len(held)-1].Chunk
	}
	// Forget first what the page shows gone, making room for new strays.
	listed := make(map[ids.ChunkID]bool, len(held))
	for i, h := range held {
		if verdicts[i] != Keep {
			listed[h.Chunk] = true
		}
	}
	for id := range ns.strays {
		if id > after && (done || id <= last) && !listed[id] {
			delete(ns.strays, id)
		}
	}
	var collect []ids.ChunkID
	for i, h := range held {
		ns.held++
		v := verdicts[i]
		if v == Keep {
			continue
		}
		s := ns.strays[h.Chunk]
		if s == nil {
			if len(ns.strays) >= t.limit() {
				ns.untracked++
				continue
			}
			s = &stray{since: now}
			ns.strays[h.Chunk] = s
		}
		if v.collectable() && !s.verdict.collectable() {
			s.since = now // the grace runs from when it became collectable
		}
		s.verdict, s.version, s.length = v, h.Version, h.Length
		if v.collectable() && now-s.since >= int64(t.Grace) {
			collect = append(collect, h.Chunk)
		}
	}
	ns.collected += int64(len(collect))
	if done {
		ns.rounds++
		ns.last = roundResult{done: now, held: ns.held, untracked: ns.untracked, counts: map[metaapi.StrayKind]int64{}}
		for _, s := range ns.strays {
			ns.last.counts[s.verdict.Kind()]++
		}
	}
	return collect
}

// Report is what node's last complete round found, with up to max of
// the strays it remembers now, lowest ids first.
func (t *Tracker) Report(node ids.NodeID, max int) metaapi.NodeStrayCount {
	out := metaapi.NodeStrayCount{Node: node, Strays: map[metaapi.StrayKind]int64{}}
	ns := t.nodes[node]
	if ns == nil {
		return out
	}
	out.Rounds, out.RoundDone, out.Held, out.Untracked, out.Collected = ns.rounds, ns.last.done, ns.last.held, ns.last.untracked, ns.collected
	for k, n := range ns.last.counts {
		out.Strays[k] = n
	}
	for id, s := range ns.strays {
		out.List = append(out.List, metaapi.StrayCopy{Chunk: id, Kind: s.verdict.Kind(), Version: s.version, Length: s.length, Since: s.since})
	}
	slices.SortFunc(out.List, func(a, b metaapi.StrayCopy) int { return cmp.Compare(a.Chunk, b.Chunk) })
	if len(out.List) > max {
		out.List = out.List[:max]
	}
	return out
}

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
//
// A copy of a file's chunk on a node its record does not name is
// collected only while every member the record names is up and listed an
// intact copy at least as new in its own inventory (Tracker.Covered):
// after meta is restored from a backup, the records name the members of
// the backup's time, and copies moved since (a repair, a drain) are the
// chunk's only ones. Until then such a copy is Displaced: kept, and meta
// may adopt it as a member.
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
	// Covered: every member the record names is up, whole as far as meta
	// knows, and holds an intact copy at least as new as this one
	// (Tracker.Covered): a copy elsewhere is surplus.
	Covered bool
}

// Verdict is the judgement of one copy.
type Verdict uint8

const (
	Keep Verdict = iota
	Unknown
	NotMember
	Queued
	Ahead
	Displaced
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
	case Displaced:
		return metaapi.StrayDisplaced
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
	case !r.Member && !r.Covered:
		// Perhaps the chunk's only copy (its members are down, gone or
		// lost it): kept.
		return Displaced
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
	// watch: for each chunk a node holds a Displaced or NotMember copy
	// of, what every node listed of it in its latest round.
	watch map[ids.ChunkID]*watched
}

// watched is what the nodes hold of a chunk some node holds a copy of
// that its record does not name.
type watched struct {
	refs int                   // strays keeping it watched
	held map[ids.NodeID]uint64 // the version of each intact copy listed
}

// watches: the verdicts whose strays are judged by what the chunk's
// members hold.
func watches(v Verdict) bool { return v == Displaced || v == NotMember }

func (t *Tracker) ref(id ids.ChunkID) {
	if t.watch == nil {
		t.watch = map[ids.ChunkID]*watched{}
	}
	w := t.watch[id]
	if w == nil {
		w = &watched{held: map[ids.NodeID]uint64{}}
		t.watch[id] = w
	}
	w.refs++
}

func (t *Tracker) unref(id ids.ChunkID) {
	if w := t.watch[id]; w != nil {
		if w.refs--; w.refs <= 0 {
			delete(t.watch, id)
		}
	}
}

// intact: the copy is listed with no block failing its checksum.
func intact(h metaapi.HeldChunk) bool { return len(h.Bad) == 0 && !h.BadUnlisted }

// Covered reports whether each of members listed an intact copy of
// chunk id at version or later in its latest round since a copy of it
// was found on a node its record does not name (Record.Covered; the
// caller knows whether the members are up). Until the members' rounds
// have been seen, it is not.
func (t *Tracker) Covered(id ids.ChunkID, members []ids.NodeID, version uint64) bool {
	w := t.watch[id]
	if w == nil || len(members) == 0 {
		return false
	}
	for _, m := range members {
		if v, ok := w.held[m]; !ok || v < version {
			return false
		}
	}
	return true
}

// Found is a Displaced copy: a node holding an intact copy of a chunk
// its record does not place there.
type Found struct {
	Node    ids.NodeID
	Version uint64
	Length  int64
}

// Displaced lists the intact Displaced copies of chunk id the last
// rounds found, by node id.
func (t *Tracker) Displaced(id ids.ChunkID) []Found {
	var out []Found
	for n, ns := range t.nodes {
		if s := ns.strays[id]; s != nil && s.verdict == Displaced && s.intact {
			out = append(out, Found{Node: n, Version: s.version, Length: s.length})
		}
	}
	slices.SortFunc(out, func(a, b Found) int { return cmp.Compare(a.Node, b.Node) })
	return out
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
	intact  bool
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
	inRange := func(id ids.ChunkID) bool { return id > after && (done || id <= last) }
	for id, s := range ns.strays {
		if inRange(id) && !listed[id] {
			if watches(s.verdict) {
				t.unref(id)
			}
			delete(ns.strays, id)
		}
	}
	// What the node holds of watched chunks, for Covered.
	if len(t.watch) > 0 {
		seen := map[ids.ChunkID]bool{}
		for _, h := range held {
			if w := t.watch[h.Chunk]; w != nil {
				seen[h.Chunk] = true
				if intact(h) {
					w.held[node] = h.Version
				} else {
					delete(w.held, node)
				}
			}
		}
		for id, w := range t.watch {
			if inRange(id) && !seen[id] {
				delete(w.held, node)
			}
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
		switch was := watches(s.verdict); {
		case watches(v) && !was:
			t.ref(h.Chunk)
		case !watches(v) && was:
			t.unref(h.Chunk)
		}
		s.verdict, s.version, s.length, s.intact = v, h.Version, h.Length, intact(h)
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

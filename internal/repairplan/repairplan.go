// Package repairplan is the decision logic of reconciling a chunk after
// a failure (docs/failures.md): given what fencing found on each member
// of a replica set or stripe group, which version is the chunk's, which
// member it is copied or rebuilt from, and which members receive it; and
// in which order chunks are repaired. It is pure: meta and its repair
// worker do the I/O.
package repairplan

import (
	"cmp"
	"fmt"
	"slices"
)

// Member is what fencing found on one member.
type Member struct {
	// Answered: the member was reached and fenced. A member that was not
	// can neither serve nor receive a copy.
	Answered bool
	Version  uint64 // committed version (0: holds nothing)
	Length   int64  // committed length
	Doubt    bool   // holds an unresolved write (a head whose write failed midway)
	// Fresh: placed by this reconciliation, so whatever it holds is not
	// the chunk's (a copy from before it was last moved away).
	Fresh bool
	// Corrupt: blocks of its copy fail their checksums (a scrub, a read
	// or the member itself found them). Only those blocks are lost: it
	// still holds its version, serves every other block, and is healed in
	// place.
	Corrupt bool
}

// Plan says how to make a chunk's members whole.
type Plan struct {
	Version uint64
	Length  int64
	// Sources are the members holding Version, whole ones first then
	// corrupt ones: each block is taken from the first whose copy of it
	// passes its checksum (for a stripe group, from the first K such).
	Sources []int
	// Targets receive the chunk (a copy, or a rebuilt unit).
	Targets []int
	// Heal are corrupt sources: they keep their copy, and only its bad
	// blocks are replaced from the other sources.
	Heal []int
	// Resolve are sources holding an unresolved write: once every
	// member holds Version, nothing can hold the write in doubt but
	// copies already discarded, and the doubt is cleared.
	Resolve []int
	// Drop are members whose copy is discarded (its fence stays): the
	// chunk's version is 0, no write to it ever completed, and they hold
	// an incomplete one or the doubt of one. Left in place, a version no
	// member can serve would stay recorded at them: the head would never
	// give that version out again, nor let a write read it back.
	Drop []int
}

// Done reports whether nothing needs copying, healing, resolving or
// dropping.
func (p Plan) Done() bool {
	return len(p.Targets) == 0 && len(p.Heal) == 0 && len(p.Resolve) == 0 && len(p.Drop) == 0
}

// holds reports whether the member's version is the chunk's to judge by:
// it answered and was not just placed. A corrupt copy holds its version
// (its bad blocks are judged one by one).
func (m Member) holds() bool { return m.Answered && !m.Fresh }

// Replicated plans a replica set. Every replica commits only whole
// writes, so any version a replica holds is complete; the highest one
// among the members is the chunk's (a write that reached only some
// replicas was never acknowledged, and keeping it is as good as dropping
// it). Members at another version, or fresh, receive a copy; corrupt
// ones at it are healed. recorded is the version meta recorded a commit
// of: a plan below it is an error (the members holding it are not
// reachable; wait for them).
func Replicated(ms []Member, recorded uint64) (Plan, error) {
	var p Plan
	for _, m := range ms {
		if m.holds() && m.Version > p.Version {
			p.Version, p.Length = m.Version, m.Length
		}
	}
	if err := atLeast(p.Version, recorded); err != nil {
		return Plan{}, err
	}
	if p.Version == 0 {
		return empty(ms, false)
	}
	return classify(p, ms, false)
}

// Striped plans a stripe group of k data units: its version is the
// newest at least k units hold (a version k units hold is a complete
// write; fewer cannot be decoded), version 0 — nothing written —
// included: k units holding nothing prove that no write completed, so
// the units a failed first write reached are dropped. Units not at the
// version are rebuilt from those that are, block by block from k intact
// there; corrupt units at it are healed. recorded is as for Replicated.
func Striped(ms []Member, k int, recorded uint64) (Plan, error) {
	count := map[uint64]int{}
	for _, m := range ms {
		if m.holds() {
			count[m.Version]++
		}
	}
	p, found := Plan{}, false
	for v, n := range count {
		if n >= k && (!found || v > p.Version) {
			p.Version, found = v, true
		}
	}
	if !found {
		return Plan{}, fmt.Errorf("fewer than %d of %d units hold one version (%v): the group cannot be rebuilt", k, len(ms), count)
	}
	if err := atLeast(p.Version, recorded); err != nil {
		return Plan{}, err
	}
	if p.Version == 0 {
		return empty(ms, true)
	}
	for _, m := range ms {
		if m.holds() && m.Version == p.Version {
			p.Length = max(p.Length, m.Length)
		}
	}
	return classify(p, ms, true)
}

// atLeast refuses a plan below the version meta recorded.
func atLeast(version, recorded uint64) error {
	if version < recorded {
		return fmt.Errorf("no reachable member holds version %d, which meta recorded (the newest held is %d)", recorded, version)
	}
	return nil
}

// empty plans a chunk whose version is 0: no write to it completed.
// Every member must have answered (one that did not may hold a write
// that did). Fencing told the fresh ones the chunk's epoch; the members
// holding an incomplete write, or the doubt of one, drop it. A fresh
// member holding a version is dropped only in a stripe group, where k
// units at version 0 prove no write completed; a replica set is refused
// instead (such a copy may be the last one of a write meta has not
// recorded yet).
func empty(ms []Member, striped bool) (Plan, error) {
	var p Plan
	for i, m := range ms {
		switch {
		case !m.Answered:
			return Plan{}, fmt.Errorf("member %d did not answer", i)
		case m.Version > 0 && !m.holds() && !striped:
			return Plan{}, fmt.Errorf("no copy is left to judge by (member %d holds version %d, but it was just placed)", i, m.Version)
		case m.Version > 0 || m.Doubt:
			p.Drop = append(p.Drop, i)
		}
	}
	return p, nil
}

// classify sorts members into sources, targets, members to heal and
// doubts to resolve, for the version (not 0) and length p carries. Units
// of a stripe group may be shorter than the longest (striped).
func classify(p Plan, ms []Member, striped bool) (Plan, error) {
	var corrupt []int
	for i, m := range ms {
		switch {
		case m.holds() && m.Version == p.Version && (m.Length == p.Length || striped):
			if m.Corrupt {
				corrupt = append(corrupt, i)
			} else {
				p.Sources = append(p.Sources, i)
			}
			if m.Doubt {
				p.Resolve = append(p.Resolve, i)
			}
		case !m.Answered:
			return Plan{}, fmt.Errorf("member %d did not answer", i)
		default:
			p.Targets = append(p.Targets, i)
		}
	}
	p.Sources = append(p.Sources, corrupt...)
	p.Heal = corrupt
	return p, nil
}

// Margin is how many more members a chunk can lose before its data is
// lost: the members on live nodes beyond the minimum that must hold it
// (1 of a replica set, k of a stripe group). Repair takes chunks in
// increasing margin: fewest remaining copies first.
func Margin(live, minimum int) int { return live - minimum }

// SortByMargin orders chunks by margin, keeping the order of equals.
func SortByMargin[T any](items []T, margin func(T) int) {
	slices.SortStableFunc(items, func(a, b T) int { return cmp.Compare(margin(a), margin(b)) })
}

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
}

// Done reports whether nothing needs copying, healing or resolving.
func (p Plan) Done() bool { return len(p.Targets) == 0 && len(p.Heal) == 0 && len(p.Resolve) == 0 }

// holds reports whether the member's version is the chunk's to judge by:
// it answered and was not just placed. A corrupt copy holds its version
// (its bad blocks are judged one by one).
func (m Member) holds() bool { return m.Answered && !m.Fresh }

// Replicated plans a replica set. Every replica commits only whole
// writes, so any version a replica holds is complete; the highest one
// among the members is the chunk's (a write that reached only some
// replicas was never acknowledged, and keeping it is as good as dropping
// it). Members at another version, or fresh, receive a copy; corrupt
// ones at it are healed.
func Replicated(ms []Member) (Plan, error) {
	var p Plan
	for _, m := range ms {
		if m.holds() && m.Version > p.Version {
			p.Version, p.Length = m.Version, m.Length
		}
	}
	return classify(p, ms, false)
}

// Striped plans a stripe group of k data units: its version is the
// newest at least k units hold (a version k units hold is a complete
// write; fewer cannot be decoded). Units not at it are rebuilt from those
// that are, block by block from k intact there; corrupt units at it are
// healed.
func Striped(ms []Member, k int) (Plan, error) {
	count := map[uint64]int{}
	written := false
	for _, m := range ms {
		written = written || m.Version > 0
		if m.holds() && m.Version > 0 {
			count[m.Version]++
		}
	}
	var p Plan
	for v, n := range count {
		if n >= k && v > p.Version {
			p.Version = v
		}
	}
	if p.Version == 0 && written {
		return Plan{}, fmt.Errorf("fewer than %d of %d units hold one version (%v): the group cannot be rebuilt", k, len(ms), count)
	}
	for _, m := range ms {
		if m.holds() && m.Version == p.Version {
			p.Length = max(p.Length, m.Length)
		}
	}
	return classify(p, ms, true)
}

// classify sorts members into sources, targets, members to heal and
// doubts to resolve, for the version and length p carries. Units of a
// stripe group may be shorter than the longest (striped).
func classify(p Plan, ms []Member, striped bool) (Plan, error) {
	if p.Version == 0 {
		for i, m := range ms {
			if m.Version > 0 {
				return Plan{}, fmt.Errorf("no copy is left to judge by (member %d holds version %d, but it was just placed)", i, m.Version)
			}
		}
		// Never written anywhere: no member holds data; fencing told the
		// fresh ones the chunk's epoch, and nobody needs a copy.
		for i, m := range ms {
			if !m.Answered {
				return Plan{}, fmt.Errorf("member %d did not answer", i)
			}
		}
		return p, nil
	}
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

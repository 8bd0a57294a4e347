// Package extent is byte ranges of a chunk and sets of them: the blocks a
// node found failing their checksums, the parts of a read that must come
// from another copy. Corruption is judged block by block (a copy with one
// bad block still holds every other block), so the places that find,
// report, tally and repair bad blocks all speak in these.
package extent

import (
	"fmt"
	"slices"
)

// Extent is the bytes [Off, Off+Len).
type Extent struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// End is the offset just past the extent.
func (e Extent) End() int64 { return e.Off + e.Len }

func (e Extent) String() string { return fmt.Sprintf("[%d, %d)", e.Off, e.End()) }

// List is a set of bytes: extents sorted by offset, non-empty, neither
// overlapping nor touching. The zero value is the empty set.
type List []Extent

// Add returns l with [off, off+n) added (merged with its neighbours).
func (l List) Add(off, n int64) List {
	if n <= 0 {
		return l
	}
	end := off + n
	i := 0
	for i < len(l) && l[i].End() < off {
		i++
	}
	j := i
	for j < len(l) && l[j].Off <= end {
		off, end = min(off, l[j].Off), max(end, l[j].End())
		j++
	}
	return slices.Replace(l, i, j, Extent{off, end - off})
}

// Remove returns l without the bytes [off, off+n).
func (l List) Remove(off, n int64) List {
	if n <= 0 {
		return l
	}
	end := off + n
	var out List
	for _, e := range l {
		if e.End() <= off || e.Off >= end {
			out = append(out, e)
			continue
		}
		if e.Off < off {
			out = append(out, Extent{e.Off, off - e.Off})
		}
		if e.End() > end {
			out = append(out, Extent{end, e.End() - end})
		}
	}
	return out
}

// Union returns l with every extent of o added.
func (l List) Union(o List) List {
	for _, e := range o {
		l = l.Add(e.Off, e.Len)
	}
	return l
}

// Bytes is how many bytes l covers.
func (l List) Bytes() int64 {
	var n int64
	for _, e := range l {
		n += e.Len
	}
	return n
}

// Contains reports whether byte off is in l.
func (l List) Contains(off int64) bool {
	_, found := slices.BinarySearchFunc(l, off, func(e Extent, off int64) int {
		switch {
		case e.End() <= off:
			return -1
		case e.Off > off:
			return 1
		}
		return 0
	})
	return found
}

// Clip returns the part of l within [off, off+n), as a new list.
func (l List) Clip(off, n int64) List {
	var out List
	for _, e := range l {
		s, t := max(e.Off, off), min(e.End(), off+n)
		if s < t {
			out = append(out, Extent{s, t - s})
		}
	}
	return out
}

// Valid reports whether l is sorted, non-empty, disjoint and within
// [0, limit): what a decoder of a List from the network must check.
func (l List) Valid(limit int64) bool {
	var prev int64 = -1
	for _, e := range l {
		if e.Len <= 0 || e.Off <= prev || e.Off < 0 || e.End() > limit || e.End() < e.Off {
			return false
		}
		prev = e.End()
	}
	return true
}

// Segment is a stretch of bytes over which the same copies are good.
type Segment struct {
	Extent
	Good []int // indexes of the copies whose bytes here are intact
}

// Segments cuts [off, off+n) where the set of intact copies changes:
// bad[i] are copy i's bad bytes (nil: all intact). A copy whose bad list
// is nil and that absent marks does not exist (absent[i]) is never good.
// It is how a reader or a rebuilder picks, block by block, the copies to
// use.
func Segments(off, n int64, bad []List, absent []bool) []Segment {
	cuts := []int64{off, off + n}
	for _, l := range bad {
		for _, e := range l.Clip(off, n) {
			cuts = append(cuts, e.Off, e.End())
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []Segment
	for i := 0; i+1 < len(cuts); i++ {
		s := Segment{Extent: Extent{cuts[i], cuts[i+1] - cuts[i]}}
		for c := range bad {
			if (absent == nil || !absent[c]) && !bad[c].Contains(s.Off) {
				s.Good = append(s.Good, c)
			}
		}
		if len(out) > 0 && slices.Equal(out[len(out)-1].Good, s.Good) {
			out[len(out)-1].Len += s.Len
			continue
		}
		out = append(out, s)
	}
	return out
}

// MinGood is the fewest intact copies of any byte: the copies present,
// less those bad there (bad and absent as for Segments).
func MinGood(bad []List, absent []bool) int {
	present := 0
	lo, hi := int64(-1), int64(-1)
	for c, l := range bad {
		if absent == nil || !absent[c] {
			present++
		}
		if len(l) > 0 {
			if lo < 0 || l[0].Off < lo {
				lo = l[0].Off
			}
			hi = max(hi, l[len(l)-1].End())
		}
	}
	least := present
	if lo >= 0 {
		for _, s := range Segments(lo, hi-lo, bad, absent) {
			least = min(least, len(s.Good))
		}
	}
	return least
}

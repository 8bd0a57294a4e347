package extent

import (
	"math/rand/v2"
	"testing"
)

// naive is a bitmap model of a List over [0, 256).
type naive [256]bool

func (b *naive) list() List {
	var l List
	for i := 0; i < len(b); i++ {
		if b[i] {
			j := i
			for j < len(b) && b[j] {
				j++
			}
			l = append(l, Extent{int64(i), int64(j - i)})
			i = j
		}
	}
	return l
}

func TestAddMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 2000; iter++ {
		var m naive
		var l List
		for k := 0; k < 1+r.IntN(8); k++ {
			off, n := int64(r.IntN(250)), int64(r.IntN(20))
			for i := off; i < min(off+n, 256); i++ {
				m[i] = true
			}
			l = l.Add(off, min(n, 256-off))
		}
		want := m.list()
		if len(l) != len(want) {
			t.Fatalf("Add gave %v, want %v", l, want)
		}
		for i := range l {
			if l[i] != want[i] {
				t.Fatalf("Add gave %v, want %v", l, want)
			}
		}
		if !l.Valid(256) {
			t.Fatalf("%v not valid", l)
		}
		for i := int64(0); i < 256; i++ {
			if l.Contains(i) != m[i] {
				t.Fatalf("Contains(%d) = %v in %v", i, !m[i], l)
			}
		}
		var bytes int64
		for _, b := range m {
			if b {
				bytes++
			}
		}
		if l.Bytes() != bytes {
			t.Fatalf("Bytes %d, want %d", l.Bytes(), bytes)
		}
	}
}

func TestValidRejects(t *testing.T) {
	for _, l := range []List{
		{{0, 0}},
		{{-1, 2}},
		{{5, 2}, {7, 1}}, // touching
		{{5, 2}, {1, 1}}, // unsorted
		{{0, 11}},        // past the limit
		{{1 << 62, 1 << 62}},
	} {
		if l.Valid(10) {
			t.Errorf("%v accepted", l)
		}
	}
	if !(List{{0, 2}, {3, 7}}).Valid(10) || !List(nil).Valid(0) {
		t.Error("a valid list refused")
	}
}

func TestSegments(t *testing.T) {
	// Three copies of 100 bytes, each bad in a different place.
	bad := []List{{{10, 5}}, {{40, 10}}, {{12, 30}}}
	segs := Segments(0, 100, bad, nil)
	want := []struct {
		off, n int64
		good   []int
	}{
		{0, 10, []int{0, 1, 2}},
		{10, 2, []int{1, 2}},
		{12, 3, []int{1}},
		{15, 25, []int{0, 1}},
		{40, 2, []int{0}},
		{42, 8, []int{0, 2}},
		{50, 50, []int{0, 1, 2}},
	}
	if len(segs) != len(want) {
		t.Fatalf("segments %v", segs)
	}
	for i, w := range want {
		s := segs[i]
		if s.Off != w.off || s.Len != w.n || len(s.Good) != len(w.good) {
			t.Fatalf("segment %d is %v %v, want [%d,+%d) %v", i, s.Extent, s.Good, w.off, w.n, w.good)
		}
		for j := range w.good {
			if s.Good[j] != w.good[j] {
				t.Fatalf("segment %d is %v %v, want %v", i, s.Extent, s.Good, w.good)
			}
		}
	}
	if got := MinGood(bad, nil); got != 1 {
		t.Errorf("MinGood = %d, want 1", got)
	}
	if got := MinGood(bad, []bool{false, true, false}); got != 0 {
		t.Errorf("MinGood with copy 1 absent = %d, want 0", got)
	}
	if got := MinGood([]List{nil, nil, nil}, []bool{false, false, true}); got != 2 {
		t.Errorf("MinGood of intact copies = %d, want 2", got)
	}
	// Disjoint single bad blocks: every byte still has two copies.
	if got := MinGood([]List{{{0, 16}}, {{300, 16}}, {{700, 16}}}, nil); got != 2 {
		t.Errorf("MinGood = %d, want 2", got)
	}
}

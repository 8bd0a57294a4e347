package repairplan

import (
	"slices"
	"testing"
)

func at(v uint64, n int64) Member { return Member{Answered: true, Version: v, Length: n} }

func TestReplicated(t *testing.T) {
	doubt := at(4, 100)
	doubt.Doubt = true
	fresh := at(0, 0)
	fresh.Fresh = true
	stale := at(3, 100)
	stale.Fresh = true // an old copy on a node the chunk moved back to
	corrupt := at(5, 120)
	corrupt.Corrupt = true
	for _, c := range []struct {
		name    string
		ms      []Member
		version uint64
		sources []int
		targets []int
		resolve []int
		err     bool
	}{
		{"healthy", []Member{at(5, 120), at(5, 120), at(5, 120)}, 5, []int{0, 1, 2}, nil, nil, false},
		{"a new member", []Member{at(5, 120), fresh, at(5, 120)}, 5, []int{0, 2}, []int{1}, nil, false},
		{"a write reached only the tail", []Member{doubt, at(4, 100), at(5, 120)}, 5, []int{2}, []int{0, 1}, nil, false},
		{"the head in doubt, nobody got the write", []Member{doubt, at(4, 100), fresh}, 4, []int{0, 1}, []int{2}, []int{0}, false},
		{"an old copy is not trusted", []Member{stale, at(2, 50), at(2, 50)}, 2, []int{1, 2}, []int{0}, nil, false},
		{"corrupt copies are replaced", []Member{corrupt, at(5, 120), fresh}, 5, []int{1}, []int{0, 2}, nil, false},
		{"never written", []Member{at(0, 0), fresh, at(0, 0)}, 0, nil, nil, nil, false},
		{"a member did not answer", []Member{at(5, 120), {}, fresh}, 0, nil, nil, nil, true},
		{"no intact copy", []Member{corrupt, fresh, fresh}, 0, nil, nil, nil, true},
	} {
		p, err := Replicated(c.ms)
		if (err != nil) != c.err {
			t.Errorf("%s: error %v", c.name, err)
			continue
		}
		if c.err {
			continue
		}
		if p.Version != c.version || !slices.Equal(p.Sources, c.sources) || !slices.Equal(p.Targets, c.targets) || !slices.Equal(p.Resolve, c.resolve) {
			t.Errorf("%s: %+v, want version %d sources %v targets %v resolve %v", c.name, p, c.version, c.sources, c.targets, c.resolve)
		}
		if p.Done() != (len(c.targets) == 0 && len(c.resolve) == 0) {
			t.Errorf("%s: Done %v", c.name, p.Done())
		}
	}
}

func TestStriped(t *testing.T) {
	fresh := Member{Answered: true, Fresh: true}
	// RS(3,2): two units lost, one a version behind.
	p, err := Striped([]Member{at(7, 40), fresh, at(7, 40), at(6, 40), at(7, 40)}, 3)
	if err != nil || p.Version != 7 || !slices.Equal(p.Sources, []int{0, 2, 4}) || !slices.Equal(p.Targets, []int{1, 3}) {
		t.Fatalf("%+v %v", p, err)
	}
	// A newer version held by fewer than k units is not the group's.
	p, err = Striped([]Member{at(8, 40), at(7, 40), at(7, 40), at(7, 40), at(8, 40)}, 3)
	if err != nil || p.Version != 7 || !slices.Equal(p.Targets, []int{0, 4}) {
		t.Fatalf("%+v %v", p, err)
	}
	// Too few units: an error, not a wrong rebuild.
	if _, err := Striped([]Member{at(7, 40), fresh, fresh, at(6, 40), at(7, 40)}, 3); err == nil {
		t.Fatal("rebuilt from 2 units of an RS(3,2) group")
	}
	if p, err := Striped([]Member{at(0, 0), fresh, at(0, 0)}, 2); err != nil || !p.Done() {
		t.Fatalf("never written: %+v %v", p, err)
	}
}

func TestSortByMargin(t *testing.T) {
	type ch struct {
		name      string
		live, min int
	}
	items := []ch{{"a", 3, 1}, {"b", 1, 1}, {"c", 4, 3}, {"d", 2, 1}, {"e", 1, 1}}
	SortByMargin(items, func(c ch) int { return Margin(c.live, c.min) })
	var got []string
	for _, c := range items {
		got = append(got, c.name)
	}
	if want := []string{"b", "e", "c", "d", "a"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

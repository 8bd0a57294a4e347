package rangelock

import (
	"math/rand/v2"
	"testing"
)

const span = 48 // bytes the model tracks; ranges stay inside it

// cells expands an owner's locks into one Type per byte.
func cells(t *testing.T, ls []Lock) [span]Type {
	t.Helper()
	var c [span]Type
	for i, l := range ls {
		if l.Start > l.End || l.End >= span {
			t.Fatalf("lock %d out of range: %+v", i, l)
		}
		if l.Type != Read && l.Type != Write {
			t.Fatalf("lock %d has type %d", i, l.Type)
		}
		if i > 0 {
			p := ls[i-1]
			if p.End >= l.Start {
				t.Fatalf("locks %d and %d overlap or are out of order: %+v %+v", i-1, i, p, l)
			}
			if p.End+1 == l.Start && p.Type == l.Type {
				t.Fatalf("locks %d and %d touch with one type but were not merged: %+v %+v", i-1, i, p, l)
			}
		}
		for b := l.Start; b <= l.End; b++ {
			c[b] = l.Type
		}
	}
	return c
}

// TestApplyMatchesByteModel sets random ranges for a few owners and checks
// Apply and Conflict against a model that tracks every byte.
func TestApplyMatchesByteModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	owners := []Owner{{1, 1}, {1, 2}, {2, 1}}
	for round := 0; round < 200; round++ {
		held := map[Owner][]Lock{}
		model := map[Owner]*[span]Type{}
		for _, o := range owners {
			model[o] = new([span]Type)
		}
		for step := 0; step < 60; step++ {
			o := owners[rng.IntN(len(owners))]
			start := uint64(rng.IntN(span))
			end := start + uint64(rng.IntN(span-int(start)))
			typ := Type(rng.IntN(3))

			var others []Lock
			for _, x := range owners {
				if x != o {
					others = append(others, held[x]...)
				}
			}
			c, conflict := Conflict(others, o, start, end, typ)
			want := false
			for b := start; b <= end && typ != Unlock; b++ {
				for _, x := range owners {
					if x != o && model[x][b] != Unlock && (typ == Write || model[x][b] == Write) {
						want = true
					}
				}
			}
			if conflict != want {
				t.Fatalf("round %d step %d: Conflict(%v %d-%d type %d) = %v, model says %v", round, step, o, start, end, typ, conflict, want)
			}
			if conflict {
				if c.Owner == o || c.Start > end || start > c.End || (typ != Write && c.Type != Write) {
					t.Fatalf("reported conflict %+v does not conflict with %d-%d type %d", c, start, end, typ)
				}
				continue
			}
			held[o] = Apply(held[o], o, start, end, typ, 7)
			for b := start; b <= end; b++ {
				model[o][b] = typ
			}
			if got := cells(t, held[o]); got != *model[o] {
				t.Fatalf("round %d step %d: after %d-%d type %d, owner %v holds\n%v\nmodel\n%v", round, step, start, end, typ, o, got, *model[o])
			}
			for _, l := range held[o] {
				if l.Owner != o {
					t.Fatalf("lock %+v does not carry its owner %v", l, o)
				}
			}
		}
	}
}

func TestApplyDoesNotModifyInput(t *testing.T) {
	o := Owner{1, 1}
	mine := []Lock{{Owner: o, Start: 0, End: 99, Type: Write}}
	_ = Apply(mine, o, 10, 19, Unlock, 0)
	if mine[0] != (Lock{Owner: o, Start: 0, End: 99, Type: Write}) {
		t.Fatalf("input changed: %+v", mine[0])
	}
}

func TestWholeFileRanges(t *testing.T) {
	const eof = 1<<63 - 1 // the kernel's OFFSET_MAX
	o := Owner{1, 1}
	got := Apply(nil, o, 0, eof, Write, 1)
	got = Apply(got, o, 100, eof, Read, 1)
	if len(got) != 2 || got[0].End != 99 || got[1].Start != 100 || got[1].End != eof || got[1].Type != Read {
		t.Fatalf("got %+v", got)
	}
	// The top of the range space: nothing overflows.
	top := ^uint64(0)
	got = Apply(nil, o, 0, top, Read, 1)
	got = Apply(got, o, top, top, Write, 1)
	got = Apply(got, o, 5, top, Unlock, 1)
	if len(got) != 1 || got[0].Start != 0 || got[0].End != 4 {
		t.Fatalf("got %+v", got)
	}
	if _, c := Conflict(got, Owner{2, 2}, 4, top, Read); c {
		t.Fatal("shared locks conflicted")
	}
	if _, c := Conflict(got, Owner{2, 2}, 4, top, Write); !c {
		t.Fatal("an exclusive lock over a shared one did not conflict")
	}
	if _, c := Conflict(got, o, 0, top, Write); c {
		t.Fatal("an owner conflicted with itself")
	}
}

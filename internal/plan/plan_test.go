package plan

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	if got, want := Names(), []string{"ring", "tree", "flat", "host-ring", "host-tree"}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, p := range Replicated() {
		q, err := Parse(p.String())
		if err != nil || q != p {
			t.Errorf("Parse(%q) = %v, %v", p, q, err)
		}
	}
	for _, bad := range []string{"carrier-pigeon", "ec", "pull-ring", "host-flat", "Ring", " ring"} {
		if p, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "known: ring, tree") {
			t.Errorf("Parse(%q) = %v, %v: want an error naming the known plans", bad, p, err)
		}
	}
	if p, err := Parse(""); err != nil || !p.IsZero() {
		t.Errorf(`Parse("") = %v, %v`, p, err)
	}
}

func TestFanout(t *testing.T) {
	for _, tc := range []struct {
		p    Plan
		want Fanout
	}{
		{Plan{Strategy: Ring}, FanoutNodes}, {Plan{Strategy: Tree, Mode: Host}, FanoutNodes},
		{Plan{Strategy: Flat}, FanoutClient}, {Plan{Strategy: EC}, FanoutEC}, {Plan{Strategy: EC, Mode: Host}, FanoutEC},
	} {
		if got := tc.p.Fanout(); got != tc.want {
			t.Errorf("%v.Fanout() = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestChildrenAndParent(t *testing.T) {
	for _, s := range []Strategy{Ring, Tree} {
		for n := 1; n <= 9; n++ {
			seen := map[int]bool{0: true}
			for r := range n {
				for _, c := range s.Children(r, n) {
					if c >= n || seen[c] || s.Parent(c) != r {
						t.Fatalf("%v n=%d: child %d of %d (parent %d, seen %v)", s, n, c, r, s.Parent(c), seen[c])
					}
					seen[c] = true
				}
			}
			if len(seen) != n {
				t.Fatalf("%v n=%d: reaches %d ranks", s, n, len(seen))
			}
		}
	}
	if Flat.Children(0, 3) != nil || EC.Children(0, 3) != nil {
		t.Fatal("flat and ec replicas forward")
	}
}

// Policies keep their JSON form: a plan is its name.
func TestJSON(t *testing.T) {
	type pol struct {
		Replicas int  `json:"replicas,omitempty"`
		Strategy Plan `json:"strategy,omitzero"`
	}
	for _, js := range []string{`{"replicas":3,"strategy":"host-tree"}`, `{"replicas":2,"strategy":"flat"}`, `{"replicas":1}`} {
		var p pol
		if err := json.Unmarshal([]byte(js), &p); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		out, err := json.Marshal(p)
		if err != nil || string(out) != js {
			t.Errorf("%s: round trip %s, %v", js, out, err)
		}
	}
	var p pol
	if err := json.Unmarshal([]byte(`{"replicas":3,"strategy":"carrier-pigeon"}`), &p); err == nil {
		t.Error("an unknown plan name decoded")
	}
	if _, err := json.Marshal(pol{Strategy: Plan{Strategy: EC}}); err == nil {
		t.Error("a plan no policy names encoded")
	}
}

// Naming and parsing a plan, which every layout meta sends does, cost no
// allocation.
func TestNamesAllocateNothing(t *testing.T) {
	p := Plan{Strategy: Tree, Mode: Host}
	b := []byte("host-tree")
	if n := testing.AllocsPerRun(100, func() {
		if p.String() != "host-tree" {
			t.Fatal("name")
		}
		if out, _ := p.MarshalText(); len(out) != len(b) {
			t.Fatal("text")
		}
		var q Plan
		if q.UnmarshalText(b) != nil || q != p {
			t.Fatal("parse")
		}
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// node is a node with free of capacity bytes free.
func node(id ids.NodeID, domain string, state metaapi.NodeState, free, capacity int64) metaapi.NodeInfo {
	return metaapi.NodeInfo{ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 7000+id), Domain: domain, State: state, Free: free, Capacity: capacity}
}

func up(id ids.NodeID, domain string) metaapi.NodeInfo {
	return node(id, domain, metaapi.NodeUp, 1<<40, 1<<40)
}

func TestChooseErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   []metaapi.NodeInfo
		k       int
		exclude []ids.NodeID
		code    metaapi.Code
		msg     []string // substrings of the message
	}{
		{"too few up", []metaapi.NodeInfo{up(1, ""), up(2, "")}, 3, nil, metaapi.ENOSPC,
			[]string{"needs 3 replicas", "only 2 storage nodes are up"}},
		{"down nodes do not count", []metaapi.NodeInfo{up(1, ""), up(2, ""), node(3, "", metaapi.NodeDown, 0, 0)}, 3, nil, metaapi.ENOSPC,
			[]string{"needs 3", "only 2"}},
		{"no nodes", nil, 1, nil, metaapi.ENOSPC, []string{"needs 1 replicas", "only 0 storage nodes"}},
		{"excluded do not count", []metaapi.NodeInfo{up(1, ""), up(2, ""), up(3, "")}, 3, []ids.NodeID{2}, metaapi.ENOSPC,
			[]string{"needs 3", "only 2", "excluded"}},
		{"full nodes do not count", []metaapi.NodeInfo{up(1, ""), up(2, ""), node(3, "", metaapi.NodeUp, 0, 100)}, 3, nil, metaapi.ENOSPC,
			[]string{"needs 3", "only 2", "1 full"}},
		{"duplicate ids count once", []metaapi.NodeInfo{up(1, ""), up(1, ""), up(2, "")}, 3, nil, metaapi.ENOSPC,
			[]string{"needs 3", "only 2"}},
		{"node id 0 is invalid", []metaapi.NodeInfo{up(0, ""), up(1, "")}, 2, nil, metaapi.ENOSPC,
			[]string{"needs 2", "only 1"}},
		{"k zero", []metaapi.NodeInfo{up(1, "")}, 0, nil, metaapi.EINVAL, []string{"at least 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Choose(tc.nodes, tc.k, tc.exclude, MinFree{}, rand.New(rand.NewPCG(1, 2)))
			if err == nil {
				t.Fatalf("Choose = %v, want error %s", got, tc.code)
			}
			if !metaapi.IsCode(err, tc.code) {
				t.Fatalf("err = %v, want code %s", err, tc.code)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
}

func TestChooseSelects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   []metaapi.NodeInfo
		k       int
		exclude []ids.NodeID
		want    []ids.NodeID // as a set; nil means only check validity
		domains int          // distinct domains the result must span
	}{
		{"exactly k", []metaapi.NodeInfo{up(1, ""), up(2, ""), up(3, "")}, 3, nil, []ids.NodeID{1, 2, 3}, 3},
		{"skips down", []metaapi.NodeInfo{up(1, ""), node(2, "", metaapi.NodeDown, 0, 10), up(3, "")}, 2, nil, []ids.NodeID{1, 3}, 2},
		{"skips excluded", []metaapi.NodeInfo{up(1, ""), up(2, ""), up(3, "")}, 2, []ids.NodeID{1}, []ids.NodeID{2, 3}, 2},
		{"skips full", []metaapi.NodeInfo{up(1, ""), node(2, "", metaapi.NodeUp, 0, 10), up(3, "")}, 2, nil, []ids.NodeID{1, 3}, 2},
		{"unknown capacity is usable", []metaapi.NodeInfo{node(1, "", metaapi.NodeUp, 5, 0), up(2, "")}, 2, nil, []ids.NodeID{1, 2}, 2},
		{"one per domain first", []metaapi.NodeInfo{
			up(1, "a"), up(2, "a"), up(3, "a"), up(4, "b"), up(5, "c"),
		}, 3, nil, nil, 3},
		{"domains then fill", []metaapi.NodeInfo{
			up(1, "a"), up(2, "a"), up(3, "b"), up(4, "b"),
		}, 3, nil, nil, 2},
		{"all in one domain", []metaapi.NodeInfo{up(1, "rack"), up(2, "rack"), up(3, "rack")}, 3, nil, []ids.NodeID{1, 2, 3}, 1},
		{"empty domain is its own", []metaapi.NodeInfo{up(1, ""), up(2, ""), up(3, "a"), up(4, "a")}, 3, nil, nil, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(0); seed < 50; seed++ {
				got, err := Choose(tc.nodes, tc.k, tc.exclude, MinFree{}, rand.New(rand.NewPCG(seed, 7)))
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				checkValid(t, tc.nodes, tc.k, tc.exclude, got)
				if tc.want != nil {
					s := slices.Clone(got)
					slices.Sort(s)
					if !slices.Equal(s, tc.want) {
						t.Fatalf("seed %d: chose %v, want %v", seed, got, tc.want)
					}
				}
				if d := domainsOf(tc.nodes, got); d != tc.domains {
					t.Fatalf("seed %d: chose %v spanning %d domains, want %d", seed, got, d, tc.domains)
				}
			}
		})
	}
}

// checkValid asserts the invariants every result must satisfy.
func checkValid(t *testing.T, nodes []metaapi.NodeInfo, k int, exclude []ids.NodeID, got []ids.NodeID) {
	t.Helper()
	if len(got) != k {
		t.Fatalf("chose %d nodes %v, want %d", len(got), got, k)
	}
	seen := map[ids.NodeID]bool{}
	for _, id := range got {
		if seen[id] {
			t.Fatalf("node %v chosen twice in %v", id, got)
		}
		seen[id] = true
		if slices.Contains(exclude, id) {
			t.Fatalf("excluded node %v chosen", id)
		}
		i := slices.IndexFunc(nodes, func(n metaapi.NodeInfo) bool { return n.ID == id })
		if i < 0 {
			t.Fatalf("unknown node %v chosen", id)
		}
		if nodes[i].State != metaapi.NodeUp {
			t.Fatalf("node %v chosen while %s", id, nodes[i].State)
		}
	}
}

func domainKey(n metaapi.NodeInfo) string {
	if n.Domain == "" {
		return "node " + n.ID.String()
	}
	return "domain " + n.Domain
}

func domainsOf(nodes []metaapi.NodeInfo, chosen []ids.NodeID) int {
	d := map[string]bool{}
	for _, id := range chosen {
		for _, n := range nodes {
			if n.ID == id {
				d[domainKey(n)] = true
			}
		}
	}
	return len(d)
}

// TestFailureDomainProperty checks on random clusters that the result
// always spans min(k, live domains) failure domains.
func TestFailureDomainProperty(t *testing.T) {
	gen := rand.New(rand.NewPCG(42, 42))
	for iter := 0; iter < 2000; iter++ {
		n := 1 + gen.IntN(12)
		var nodes []metaapi.NodeInfo
		for i := 1; i <= n; i++ {
			st := metaapi.NodeUp
			if gen.IntN(5) == 0 {
				st = metaapi.NodeDown
			}
			dom := ""
			if gen.IntN(4) != 0 {
				dom = string(rune('a' + gen.IntN(4)))
			}
			nodes = append(nodes, node(ids.NodeID(i), dom, st, 1+gen.Int64N(100), 100+gen.Int64N(100)))
		}
		var exclude []ids.NodeID
		if gen.IntN(3) == 0 {
			exclude = append(exclude, ids.NodeID(1+gen.IntN(n)))
		}
		k := 1 + gen.IntN(5)
		live := map[string]bool{}
		nlive := 0
		for _, nd := range nodes {
			if nd.State == metaapi.NodeUp && !slices.Contains(exclude, nd.ID) {
				live[domainKey(nd)] = true
				nlive++
			}
		}
		got, err := Choose(nodes, k, exclude, MinFree{}, rand.New(rand.NewPCG(uint64(iter), 1)))
		if nlive < k {
			if !metaapi.IsCode(err, metaapi.ENOSPC) {
				t.Fatalf("iter %d: %d live < k=%d but err = %v", iter, nlive, k, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		checkValid(t, nodes, k, exclude, got)
		if want, d := min(k, len(live)), domainsOf(nodes, got); d != want {
			t.Fatalf("iter %d: %v spans %d domains, want %d (nodes %+v)", iter, got, d, want, nodes)
		}
	}
}

// TestSpread checks that equal nodes receive an equal share of replicas.
func TestSpread(t *testing.T) {
	var nodes []metaapi.NodeInfo
	for i := 1; i <= 10; i++ {
		nodes = append(nodes, up(ids.NodeID(i), ""))
	}
	const rounds, k = 20000, 3
	count := map[ids.NodeID]int{}
	first := map[ids.NodeID]int{}
	rng := rand.New(rand.NewPCG(3, 4))
	for r := 0; r < rounds; r++ {
		got, err := Choose(nodes, k, nil, MinFree{}, rng)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range got {
			count[id]++
		}
		first[got[0]]++
	}
	want := float64(rounds*k) / 10
	for _, n := range nodes {
		if c := float64(count[n.ID]); c < want*0.95 || c > want*1.05 {
			t.Errorf("node %v got %v replicas, want %.0f ±5%%", n.ID, c, want)
		}
		// The chain head should rotate too, or one node carries every
		// client's first hop.
		if f := float64(first[n.ID]); f < rounds/10*0.9 || f > rounds/10*1.1 {
			t.Errorf("node %v was first %v times, want %d ±10%%", n.ID, f, rounds/10)
		}
	}
}

// TestPrefersEmptier checks the load bias: with two choices, the node
// with more free space wins 3/4 of single-replica placements.
func TestPrefersEmptier(t *testing.T) {
	nodes := []metaapi.NodeInfo{
		node(1, "", metaapi.NodeUp, 10, 100),
		node(2, "", metaapi.NodeUp, 90, 100),
	}
	rng := rand.New(rand.NewPCG(5, 6))
	const rounds = 10000
	low := 0
	for r := 0; r < rounds; r++ {
		got, err := Choose(nodes, 1, nil, MinFree{}, rng)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] == 2 {
			low++
		}
	}
	if frac := float64(low) / rounds; frac < 0.72 || frac > 0.78 {
		t.Fatalf("emptier node chosen %.3f of the time, want about 0.75", frac)
	}
}

func TestDeterministic(t *testing.T) {
	var nodes []metaapi.NodeInfo
	for i := 1; i <= 20; i++ {
		nodes = append(nodes, up(ids.NodeID(i), string(rune('a'+i%4))))
	}
	a, _ := Choose(nodes, 5, nil, MinFree{}, rand.New(rand.NewPCG(9, 9)))
	b, _ := Choose(nodes, 5, nil, MinFree{}, rand.New(rand.NewPCG(9, 9)))
	if !slices.Equal(a, b) {
		t.Fatalf("same seed gave %v and %v", a, b)
	}
}

// TestReplace: a chunk's replacement members avoid every member (kept or
// lost) and go first to failure domains its kept members do not occupy;
// only when none is left do they double up; too few candidates is
// ENOSPC naming the numbers.
func TestReplace(t *testing.T) {
	// Racks a, b, c with two nodes each. The chunk is on 1 (a), 3 (b), 5
	// (c); 5 died. Kept members occupy a and b: the replacement must be
	// 6, rack c's other node, every time.
	nodes := []metaapi.NodeInfo{up(1, "a"), up(2, "a"), up(3, "b"), up(4, "b"), up(5, "c"), up(6, "c")}
	nodes[4].State = metaapi.NodeDown
	members, kept := []ids.NodeID{1, 3, 5}, []ids.NodeID{1, 3}
	for seed := range uint64(200) {
		got, err := Replace(nodes, 1, members, kept, MinFree{}, rand.New(rand.NewPCG(seed, 1)))
		if err != nil || len(got) != 1 || got[0] != 6 {
			t.Fatalf("seed %d: replacement %v, %v; want node 6 (the only free rack)", seed, got, err)
		}
	}
	// No free rack left: it doubles up, never on a member.
	nodes = []metaapi.NodeInfo{up(1, "a"), up(2, "a"), up(3, "b"), up(4, "b")}
	for seed := range uint64(50) {
		got, err := Replace(nodes, 1, []ids.NodeID{1, 3}, []ids.NodeID{1}, MinFree{}, rand.New(rand.NewPCG(seed, 2)))
		if err != nil || len(got) != 1 || got[0] == 1 || got[0] == 3 {
			t.Fatalf("seed %d: replacement %v, %v", seed, got, err)
		}
		if got[0] != 4 {
			t.Fatalf("seed %d: replacement %v in the kept member's rack while rack b had room", seed, got)
		}
	}
	// Every live node is a member: a clear ENOSPC.
	_, err := Replace(nodes, 1, []ids.NodeID{1, 2, 3, 4}, []ids.NodeID{1, 2, 3}, MinFree{}, rand.New(rand.NewPCG(1, 1)))
	var me *metaapi.Error
	if !errors.As(err, &me) || me.Code != metaapi.ENOSPC || !strings.Contains(me.Message, "outside its 4 members, but 0 are up") {
		t.Fatalf("no candidate: %v", err)
	}
}

func TestMinFree(t *testing.T) {
	const gib = 1 << 30
	m := MinFree{Bytes: gib, Percent: 5}
	for _, tc := range []struct {
		capacity, want int64
	}{
		{0, gib},             // unknown: the fixed part
		{10 * gib, gib},      // 5% is less
		{100 * gib, 5 * gib}, // 5% is more
		{-1, gib},            // nonsense capacity: no negative share
	} {
		if got := m.Of(tc.capacity); got != tc.want {
			t.Errorf("Of(%d) = %d, want %d", tc.capacity, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		n    metaapi.NodeInfo
		full bool
	}{
		{"plenty", node(1, "", metaapi.NodeUp, 50*gib, 100*gib), false},
		{"at the margin", node(1, "", metaapi.NodeUp, 5*gib, 100*gib), true},
		{"just above", node(1, "", metaapi.NodeUp, 5*gib+1, 100*gib), false},
		{"small disk, fixed part", node(1, "", metaapi.NodeUp, gib/2, 4*gib), true},
		{"nothing free", node(1, "", metaapi.NodeUp, 0, 100*gib), true},
		{"placed past its report", node(1, "", metaapi.NodeUp, -gib, 100*gib), true},
		{"unknown capacity", node(1, "", metaapi.NodeUp, 0, 0), false},
	} {
		if got := m.Full(&tc.n); got != tc.full {
			t.Errorf("%s: Full = %v, want %v", tc.name, got, tc.full)
		}
	}
}

// TestMarginIsShareOfFileSystem: the margin's share is of the node's
// file system, not of its Capacity (free space plus what Sluice takes).
// On a 1 TB disk other programs fill to 940 GB, a share of Capacity
// (60 GB) is 3 GB, and the file system would run at its last 0.3%; the
// margin is 5% of the disk, as before capacity counted only Sluice's own
// use. A node that does not report its file system's size (an older
// one) keeps the share of its Capacity.
func TestMarginIsShareOfFileSystem(t *testing.T) {
	const gb = 1000 * 1000 * 1000
	m := MinFree{Bytes: 1 << 30, Percent: 5}
	for _, tc := range []struct {
		name                   string
		free, capacity, fsSize int64
		full                   bool
	}{
		{"shared disk, 40 GB free of 1 TB", 40 * gb, 60 * gb, 1000 * gb, true},
		{"shared disk, 50 GB free of 1 TB", 50 * gb, 70 * gb, 1000 * gb, true},
		{"shared disk, 51 GB free of 1 TB", 51 * gb, 71 * gb, 1000 * gb, false},
		{"own disk, 40 GB free of 1 TB", 40 * gb, 1000 * gb, 1000 * gb, true},
		{"own disk, 60 GB free of 1 TB", 60 * gb, 1000 * gb, 1000 * gb, false},
		{"size not reported: share of capacity", 40 * gb, 60 * gb, 0, false},
		{"size not reported, below the share", 2 * gb, 60 * gb, 0, true},
		{"small file system: the fixed part", gb, 2 * gb, 4 * gb, true},
		{"nothing reported", 0, 0, 0, false},
	} {
		n := node(1, "", metaapi.NodeUp, tc.free, tc.capacity)
		n.FSSize = tc.fsSize
		if got := m.Full(&n); got != tc.full {
			t.Errorf("%s: Full = %v, want %v (margin %d)", tc.name, got, tc.full, m.Of(tc.fsSize))
		}
	}
}

// TestFullByFreeSpace is issue 15's defect 5 in miniature: a node whose
// chunks hold little (Used far below Capacity) but whose file system has
// no room left (Free below the margin) gets no new chunk, from Choose or
// from Replace; with too few nodes left the error says how many are full.
func TestFullByFreeSpace(t *testing.T) {
	const gib = 1 << 30
	m := MinFree{Bytes: gib, Percent: 5}
	nodes := []metaapi.NodeInfo{
		node(1, "", metaapi.NodeUp, 40*gib, 50*gib),
		node(2, "", metaapi.NodeUp, 40*gib, 50*gib),
		node(3, "", metaapi.NodeUp, 40*gib, 50*gib),
		node(4, "", metaapi.NodeUp, gib/2, 50*gib),
	}
	nodes[3].Used = gib // its index, recycled files or another tenant took the rest
	for seed := range uint64(200) {
		got, err := Choose(nodes, 3, nil, m, rand.New(rand.NewPCG(seed, 3)))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if slices.Contains(got, 4) {
			t.Fatalf("seed %d: chose %v, with the full node 4", seed, got)
		}
	}
	_, err := Choose(nodes, 4, nil, m, rand.New(rand.NewPCG(1, 1)))
	if !metaapi.IsCode(err, metaapi.ENOSPC) || !strings.Contains(err.Error(), "only 3 storage nodes are up with free space (4 up, 1 full)") {
		t.Fatalf("4 replicas with one node full: %v", err)
	}
	// Repair: node 1 died; the replacement is never the full node.
	nodes[0].State = metaapi.NodeDown
	for seed := range uint64(50) {
		got, err := Replace(nodes, 1, []ids.NodeID{1, 2}, []ids.NodeID{2}, m, rand.New(rand.NewPCG(seed, 4)))
		if err != nil || len(got) != 1 || got[0] != 3 {
			t.Fatalf("seed %d: replacement %v, %v; want 3, the only node with room", seed, got, err)
		}
	}
	_, err = Replace(nodes, 1, []ids.NodeID{1, 2, 3}, []ids.NodeID{2, 3}, m, rand.New(rand.NewPCG(1, 1)))
	if !metaapi.IsCode(err, metaapi.ENOSPC) || !strings.Contains(err.Error(), "(1 full)") {
		t.Fatalf("replacement with only the full node left: %v", err)
	}
}

// TestPrefersShareFree: nodes of different sizes are compared by the
// share of their capacity that is free, so they fill at the same pace.
func TestPrefersShareFree(t *testing.T) {
	nodes := []metaapi.NodeInfo{
		node(1, "", metaapi.NodeUp, 300, 1000), // 30% free, more bytes
		node(2, "", metaapi.NodeUp, 80, 100),   // 80% free
	}
	rng := rand.New(rand.NewPCG(8, 9))
	small := 0
	for range 10000 {
		got, err := Choose(nodes, 1, nil, MinFree{}, rng)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] == 2 {
			small++
		}
	}
	if frac := float64(small) / 10000; frac < 0.72 || frac > 0.78 {
		t.Fatalf("the node with the larger share free was chosen %.3f of the time, want about 0.75", frac)
	}
}

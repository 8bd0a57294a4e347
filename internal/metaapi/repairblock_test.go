package metaapi

import "testing"

func TestRepairBlockString(t *testing.T) {
	for _, tc := range []struct {
		b    RepairBlock
		want string
	}{
		{RepairBlock{Kind: BlockNoPlace, Policy: "RS(3,2)", EC: true, Need: 5, Up: 4, Usable: 4, Chunks: 3}, "3 stripe groups of RS(3,2) need 5 nodes, 4 are up"},
		{RepairBlock{Kind: BlockNoPlace, Policy: "3 replicas", Need: 3, Up: 4, Usable: 2, Chunks: 7},
			"7 chunks of 3 replicas need 3 nodes, 4 are up and 2 of them can take data (the others are full or draining)"},
		{RepairBlock{Kind: BlockNoSource, Policy: "RS(4,2)", EC: true, Need: 4, Chunks: 1},
			"1 stripe groups of RS(4,2) have fewer than 4 live whole members to rebuild from: waiting for nodes to return"},
		{RepairBlock{Kind: BlockFailing, Policy: "2 replicas", Reason: "node n3 does not answer", Chunks: 2}, "2 chunks of 2 replicas fail to repair: node n3 does not answer"},
	} {
		if got := tc.b.String(); got != tc.want {
			t.Errorf("%+v:\ngot  %q\nwant %q", tc.b, got, tc.want)
		}
	}
	if got := PolicyName(&Policy{EC: &ErasureCode{Data: 6, Parity: 3}}); got != "RS(6,3)" {
		t.Errorf("PolicyName: %q", got)
	}
}

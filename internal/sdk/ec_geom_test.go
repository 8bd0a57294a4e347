package sdk

import (
	"bytes"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestCellsOf: a data unit's cells of a run of stripes are the file bytes
// at stripe s, cell j, in stripe order — gathered or aliased.
func TestCellsOf(t *testing.T) {
	for _, cell := range []int64{512, 4096, 64 << 10} {
		a := metaapi.Attr{Policy: &metaapi.Policy{EC: &metaapi.ErasureCode{Data: 3, Parity: 2, Cell: cell}}}
		a.ChunkSize = a.Policy.EC.ChunkSize()
		g, ok := ecGeomOf(&a)
		if !ok || g.width != 3*cell || g.group%g.width != 0 {
			t.Fatalf("cell %d: geometry %+v %v", cell, g, ok)
		}
		const stripes = 4
		buf := make([]byte, stripes*g.width)
		for i := range buf {
			buf[i] = byte(i / int(cell)) // cell number in file order
		}
		for j := 0; j < 3; j++ {
			got := bytes.Join(cellsOf(buf, g, j), nil)
			if int64(len(got)) != stripes*cell {
				t.Fatalf("cell %d unit %d: %d bytes", cell, j, len(got))
			}
			for s := int64(0); s < stripes; s++ {
				want := byte(s*3 + int64(j))
				if c := got[s*cell : (s+1)*cell]; c[0] != want || c[len(c)-1] != want {
					t.Fatalf("cell %d unit %d stripe %d holds file cell %d, want %d", cell, j, s, c[0], want)
				}
			}
		}
	}
	if _, ok := ecGeomOf(&metaapi.Attr{Policy: &metaapi.Policy{Replicas: 3}}); ok {
		t.Fatal("a replicated file has an EC geometry")
	}
}

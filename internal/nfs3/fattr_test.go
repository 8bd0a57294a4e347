package nfs3

import (
	"encoding/binary"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/xdr"
)

// TestFattrUsedCountsStoredData: a fattr3's used is what the file stores
// (Attr.Allocated), not its size: a 1 GiB file with one 64 MiB chunk uses
// 64 MiB, 4 KiB if that chunk is known to be the last and to hold the
// file's last 4 KiB; a dense one its size; files from before chunks were counted,
// and symlinks, their size.
func TestFattrUsedCountsStoredData(t *testing.T) {
	const G, M = 1 << 30, 1 << 20
	for _, tc := range []struct {
		name string
		a    metaapi.Attr
		used uint64
	}{
		{"sparse", metaapi.Attr{Type: metaapi.TypeFile, Size: G + 4096, ChunkSize: 64 * M, Chunks: 1, Counted: true}, 64 * M},
		{"sparse, its last chunk known", metaapi.Attr{Type: metaapi.TypeFile, Size: G + 4096, ChunkSize: 64 * M, Chunks: 1, ChunkEnd: 17, Counted: true}, 4096},
		{"dense", metaapi.Attr{Type: metaapi.TypeFile, Size: 100*M + 1, ChunkSize: 64 * M, Chunks: 2, Counted: true}, 100*M + 4096},
		{"empty", metaapi.Attr{Type: metaapi.TypeFile, Size: G, ChunkSize: 64 * M, Counted: true}, 0},
		{"not counted", metaapi.Attr{Type: metaapi.TypeFile, Size: G, ChunkSize: 64 * M}, G},
		{"symlink", metaapi.Attr{Type: metaapi.TypeSymlink, Target: "abc"}, 4096},
	} {
		var w xdr.Writer
		putFattr(&w, &tc.a)
		if len(w.B) != fattrSize {
			t.Fatalf("fattr3 of %d bytes", len(w.B))
		}
		if used := binary.BigEndian.Uint64(w.B[28:]); used != tc.used {
			t.Errorf("%s: used %d, want %d", tc.name, used, tc.used)
		}
	}
}

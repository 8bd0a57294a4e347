package sdk_test

import (
	"context"
	"math"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestWriteNearMaxOffset: a write whose end would wrap past the largest
// int64 is refused at once, not turned into a write at a negative
// offset.
func TestWriteNearMaxOffset(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	f, err := cl.Create(ctx, "/edge", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 16)
	for _, off := range []int64{math.MaxInt64 - 8, math.MaxInt64, metaapi.MaxFileSize - 8} {
		if _, err := f.WriteAtContext(ctx, p, off); !metaapi.IsCode(err, metaapi.EFBIG) {
			t.Errorf("WriteAt(+16 at %d) = %v, want EFBIG", off, err)
		}
		if _, err := f.WriteData(ctx, p, off); !metaapi.IsCode(err, metaapi.EINVAL) {
			t.Errorf("WriteData(+16 at %d) = %v, want EINVAL", off, err)
		}
	}
	if f.Size() != 0 {
		t.Fatalf("size %d after refused writes", f.Size())
	}
}

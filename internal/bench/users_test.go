package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFloorOnce: the store floor receives every byte into a new file or
// the reused one, and reports a positive rate; the reused file stays for
// the next call and a new one does not.
func TestFloorOnce(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, reuse := range []bool{false, true, true} {
		if r, err := floorOnce(ctx, dir, 3<<20+5, reuse); err != nil || r <= 0 {
			t.Fatalf("reuse %v: %v, %v", reuse, r, err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "floor-reused" {
		t.Fatalf("left in the directory: %v", ents)
	}
}

// TestFloorOnceReceiverFails: when the receiving end cannot keep the
// bytes (no such directory), the error says so, not merely that the
// sender's write broke when the receiver hung up.
func TestFloorOnceReceiverFails(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := floorOnce(context.Background(), dir, 64<<20, false)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("error %v, want the receiver's (about %s)", err, dir)
	}
}

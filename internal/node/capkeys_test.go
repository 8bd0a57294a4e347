package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/secret"
)

// TestCapKeysOutliveRestart: a node restarted while meta is away accepts
// the keys and enforces the revocations it last heard of, not key 1.
func TestCapKeysOutliveRestart(t *testing.T) {
	dir := t.TempDir()
	sec, err := secret.Parse("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	if err != nil {
		t.Fatal(err)
	}
	start := func() *Node {
		n := &Node{opts: Options{DataDir: dir}, creds: credentials{secret: sec}, log: slog.New(slog.DiscardHandler)}
		n.keys = n.newKeyring()
		return n
	}
	n := start()
	if got := n.keys.Accepted(); !got.Equal(capability.Accepted{Keys: []uint32{1}}) {
		t.Fatalf("a node that never heard from meta accepts %+v, want key 1", got)
	}
	told := &metaapi.CapKeys{Keys: []uint32{4, 6, 5}, Revoked: []metaapi.RevokedClient{{Client: 3, Before: 77}}}
	n.applyCapKeys(told)
	n.applyCapKeys(nil) // meta said nothing: keep it
	if got := n.keys.Accepted(); !got.Equal(told.Accepted()) || n.keys.CurrentKey() != 5 {
		t.Fatalf("accepts %+v, told %+v", got, told.Accepted())
	}
	// Out of bounds: refused, the ring and its file unchanged.
	n.applyCapKeys(&metaapi.CapKeys{Keys: make([]uint32, capability.MaxKeys+1)})
	if got := n.keys.Accepted(); !got.Equal(told.Accepted()) {
		t.Fatalf("an oversized set changed the ring: %+v", got)
	}

	if got := start().keys.Accepted(); !got.Equal(told.Accepted()) {
		t.Fatalf("after a restart accepts %+v, was told %+v", got, told.Accepted())
	}
	if fi, err := os.Stat(filepath.Join(dir, capKeysFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, %v", capKeysFile, fi.Mode(), err)
	}
	// A damaged file is ignored (meta tells the node again at registration).
	if err := os.WriteFile(filepath.Join(dir, capKeysFile), []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := start().keys.Accepted(); !got.Equal(capability.Accepted{Keys: []uint32{1}}) {
		t.Fatalf("with a damaged file accepts %+v", got)
	}
}

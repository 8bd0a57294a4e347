package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestCapKeysOutliveRestart: a node restarted while meta is away accepts
// the keys and enforces the revocations it last heard of, not key 1.
func TestCapKeysOutliveRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *Node {
		n := &Node{opts: Options{DataDir: dir}, log: slog.New(slog.DiscardHandler)}
		n.keys = n.newKeyring()
		return n
	}
	n := start()
	if got := n.keys.Accepted(); len(got.Keys) != 0 {
		t.Fatalf("a node that never heard from meta accepts keys %v, want none", got.Keys)
	}
	var keys []metaapi.CapKey
	for _, id := range []uint32{4, 6, 5} {
		k, err := capability.GenerateKey(id)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, metaapi.CapKeyOf(k))
	}
	told := &metaapi.CapKeys{Keys: keys, Revoked: []metaapi.RevokedClient{{Client: 3, Before: 77}}}
	want, err := told.Accepted()
	if err != nil {
		t.Fatal(err)
	}
	n.applyCapKeys(told)
	n.applyCapKeys(nil) // meta said nothing: keep it
	if got := n.keys.Accepted(); !got.Equal(want) || n.keys.CurrentKey() != 5 {
		t.Fatalf("accepts %v, told %v", told.IDs(), told.IDs())
	}
	// Out of bounds or damaged: refused, the ring and its file unchanged.
	for _, bad := range []*metaapi.CapKeys{
		{Keys: make([]metaapi.CapKey, capability.MaxKeys+1)},
		{Keys: []metaapi.CapKey{{ID: 1, MAC: []byte("short")}}},
		{Keys: []metaapi.CapKey{{ID: 1, MAC: make([]byte, capability.KeySize)}}}, // all zeros
	} {
		n.applyCapKeys(bad)
		if got := n.keys.Accepted(); !got.Equal(want) {
			t.Fatalf("a bad set changed the ring: %+v", got)
		}
	}

	if got := start().keys.Accepted(); !got.Equal(want) {
		t.Fatalf("after a restart accepts %+v, was told %+v", got, want)
	}
	if fi, err := os.Stat(filepath.Join(dir, capKeysFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, %v", capKeysFile, fi.Mode(), err)
	}
	// A damaged file is ignored (meta tells the node again at registration).
	if err := os.WriteFile(filepath.Join(dir, capKeysFile), []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := start().keys.Accepted(); len(got.Keys) != 0 {
		t.Fatalf("with a damaged file accepts keys %+v", got.Keys)
	}
}

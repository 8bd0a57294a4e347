package client_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/sluicefs/sluice/client"
)

// TestECPutFromFile: a mapped 24 MiB file, 16 MiB messages of whole stripes.
func TestECPutFromFile(t *testing.T) {
	c := startCluster(t, 6)
	cl := newClient(t, c, client.Options{})
	ecDir(t, cl, "/ec", 4, 2, 64<<10)
	data := randBytes(rand.New(rand.NewPCG(1, 2)), 24<<20+4321)
	src := t.TempDir() + "/src"
	os.WriteFile(src, data, 0o644)
	fh, _ := os.Open(src)
	defer fh.Close()
	if _, err := cl.Put(context.Background(), "/ec/f", fh, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("differs")
	}
}

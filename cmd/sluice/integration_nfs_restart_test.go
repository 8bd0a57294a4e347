package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/xdr"
)

// TestNFSVerifierAfterKill: UNSTABLE WRITEs buffered by a gateway that is
// then killed (-9) are gone; a COMMIT to the gateway started in its place
// must answer another write verifier, so that the client sends them
// again.
func TestNFSVerifierAfterKill(t *testing.T) {
	c := startUp(t, filepath.Join(baseDir(t), "data"), 3)
	chmodPath(t, c.conf, "/", 0o777) // root is squashed to nobody
	base := filepath.Dir(filepath.Dir(c.conf))
	start := func() (*proc, string) {
		p := startDaemon(t, base, "nfs-"+fmt.Sprint(time.Now().UnixNano()), "nfs", "--listen", "127.0.0.1:0", "--conf", c.conf)
		r := p.waitReady(t, 20*time.Second)
		return p, r.NFS
	}
	p, addr := start()
	n := dialNFS(t, addr)
	fh := n.create(n.root(), "k")
	const mib = 1 << 20
	data := bytes.Repeat([]byte("k"), 4*mib)
	var verf []byte
	buffered := false
	for off := 0; off < len(data); off += mib {
		r := n.call("WRITE", nfs3.ProcWrite, func(w *xdr.Writer) {
			w.Opaque(fh)
			w.Uint64(uint64(off))
			w.Uint32(mib)
			w.Uint32(nfs3.Unstable)
			w.Opaque(data[off : off+mib])
		})
		nfs3.SkipWcc(r)
		_, committed, v := r.Uint32(), r.Uint32(), r.Fixed(8)
		if r.Err() != nil {
			t.Fatal(r.Err())
		}
		verf = bytes.Clone(v)
		buffered = buffered || committed == nfs3.Unstable
	}
	if !buffered {
		t.Fatal("no WRITE was buffered")
	}
	p.kill()
	_, addr = start()
	n = dialNFS(t, addr)
	r := n.call("COMMIT", nfs3.ProcCommit, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(0) })
	nfs3.SkipWcc(r)
	if v := r.Fixed(8); r.Err() != nil || bytes.Equal(v, verf) {
		t.Fatalf("COMMIT after a restart answered the killed gateway's verifier %x (%v): the client would not send its lost writes again", verf, r.Err())
	}
}

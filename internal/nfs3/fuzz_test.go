package nfs3

import (
	"context"
	"sync"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

var (
	fuzzOnce sync.Once
	fuzzGW   *Gateway
)

// fuzzGateway is one gateway over one in-process cluster for every
// fuzz input (a cluster per input would be far too slow).
func fuzzGateway(f *testing.F) *Gateway {
	fuzzOnce.Do(func() {
		cl, _ := StartTestCluster(f, 1)
		// Root as root, so that the procedures that change things run.
		exports, err := nfsexport.Parse("exports", "/ 127.0.0.1(rw,no_root_squash)")
		if err != nil {
			f.Fatal(err)
		}
		if fuzzGW, err = New(Options{Client: cl, Exports: exports}); err != nil {
			f.Fatal(err)
		}
	})
	return fuzzGW
}

// FuzzProcedures feeds arbitrary argument bytes to every NFS and MOUNT
// procedure: a call either does not decode (GARBAGE_ARGS, nothing done)
// or is answered; nothing panics and no reply grows past a READ's.
func FuzzProcedures(f *testing.F) {
	g := fuzzGateway(f)
	root := g.Handle("/", ids.RootIno)
	seed := func(prog uint8, proc uint8, build func(w *xdr.Writer)) {
		var w xdr.Writer
		build(&w)
		f.Add(prog, proc, w.B)
	}
	seed(0, ProcGetattr, func(w *xdr.Writer) { w.Opaque(root) })
	seed(0, ProcLookup, func(w *xdr.Writer) { w.Opaque(root); w.String("a") })
	seed(0, ProcCreate, func(w *xdr.Writer) { w.Opaque(root); w.String("f"); w.Uint32(2); w.Fixed([]byte("12345678")) })
	seed(0, ProcWrite, func(w *xdr.Writer) { w.Opaque(root); w.Uint64(0); w.Uint32(3); w.Uint32(2); w.Opaque([]byte("abc")) })
	seed(0, ProcReaddirplus, func(w *xdr.Writer) {
		w.Opaque(root)
		w.Uint64(0)
		w.Fixed(make([]byte, 8))
		w.Uint32(4096)
		w.Uint32(8192)
	})
	seed(0, ProcSetattr, func(w *xdr.Writer) {
		w.Opaque(root)
		w.Bool(true)
		w.Uint32(0o755)
		w.Bool(false)
		w.Bool(false)
		w.Bool(false)
		w.Uint32(2)
		w.Uint32(1)
		w.Uint32(2)
		w.Uint32(1)
		w.Bool(false)
	})
	seed(1, MountMnt, func(w *xdr.Writer) { w.String("/") })
	f.Fuzz(func(t *testing.T, prog uint8, proc uint8, args []byte) {
		// The caller: admitted as root, or refused (another network, an
		// unprivileged port), or with no address at all.
		remote := [...]string{"127.0.0.1:700", "127.0.0.1:40000", "127.0.0.2:700", ""}[prog/2%4]
		c := &oncrpc.Call{Prog: ProgNFS, Vers: Version, Proc: uint32(proc % 24), CredFlavor: oncrpc.AuthSys, Remote: remote}
		h := g.nfs
		if prog%2 == 1 {
			c.Prog, c.Proc, h = ProgMount, uint32(proc%7), g.mount
		}
		var w xdr.Writer
		h(context.Background(), c, xdr.NewReader(args), &w)
		if len(w.B) > MaxData+64<<10 {
			t.Fatalf("reply of %d bytes", len(w.B))
		}
	})
}

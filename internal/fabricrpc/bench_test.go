package fabricrpc

import (
	"bytes"
	"context"
	"net"
	"testing"

	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// BenchmarkRead1MiB: a READ-like call whose reply carries 1 MiB of the
// server's memory, over the fabric (the client pulls it into its buffer
// and sends DONE) and over TCP (oncrpc, copied into the reply record).
func BenchmarkRead1MiB(b *testing.B) {
	const n = 1 << 20
	b.Run("fabricrpc", func(b *testing.B) {
		_, svc, addr := startServer(b, nil)
		c := dialClient(b, addr, ClientOptions{})
		ctx := context.Background()
		dst := make([]byte, n)
		args := &xdr.Writer{B: make([]byte, 0, 4)}
		b.SetBytes(n)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			args.B = args.B[:0]
			args.Uint32(n)
			r, err := c.Call(ctx, testProg, testVers, procHeld, nil, args, dst)
			if err != nil {
				b.Fatal(err)
			}
			if got := r.Opaque(n); len(got) != n || &got[0] != &dst[0] {
				b.Fatalf("reply of %d bytes, in dst %v (%v)", len(got), len(got) > 0 && &got[0] == &dst[0], r.Err())
			}
		}
		b.StopTimer()
		if !bytes.Equal(dst, svc.static[:n]) {
			b.Fatal("data differs")
		}
	})
	b.Run("tcp", func(b *testing.B) {
		svc := newService()
		srv := newRPC(svc)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go srv.Serve(ln)
		defer srv.Close()
		c, err := oncrpc.Dial(context.Background(), ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		ctx := context.Background()
		args := words(n)
		var got []byte
		b.SetBytes(n)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			res, err := c.Call(ctx, testProg, testVers, procHeld, nil, args)
			if err != nil {
				b.Fatal(err)
			}
			r := xdr.NewReader(res)
			if got = r.Opaque(n); len(got) != n {
				b.Fatalf("reply of %d bytes (%v)", len(got), r.Err())
			}
		}
		b.StopTimer()
		if !bytes.Equal(got, svc.static[:n]) {
			b.Fatal("data differs")
		}
	})
}

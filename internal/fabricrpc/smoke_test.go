package fabricrpc

import (
	"bytes"
	"context"
	"testing"

	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

func TestSmokeEcho(t *testing.T) {
	rpc := &oncrpc.Server{Programs: []oncrpc.Program{{Prog: 0x20000001, Low: 1, High: 1,
		Handle: func(ctx context.Context, c *oncrpc.Call, args *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
			p := args.Opaque(2 << 20)
			if args.Err() != nil {
				return oncrpc.GarbageArgs
			}
			for range int(c.Proc) {
				res.Uint32(7)
			}
			res.Opaque(p)
			return oncrpc.Success
		}}}}
	s := &Server{RPC: rpc}
	a, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := Dial(context.Background(), a.String(), ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{0, 1, 1023, 1024, 64 << 10, 1 << 20} {
		for _, pad := range []int{0, 2000} {
			data := bytes.Repeat([]byte{byte(n)}, n)
			w := &xdr.Writer{ChunkMin: c.ChunkMin()}
			w.Opaque(data)
			dst := make([]byte, 1<<20)
			r, err := c.Call(context.Background(), 0x20000001, 1, uint32(pad), nil, w, dst)
			if err != nil {
				t.Fatalf("%d: %v", n, err)
			}
			for range pad {
				r.Uint32()
			}
			got := r.Opaque(2 << 20)
			if r.Err() != nil || !bytes.Equal(got, data) {
				t.Fatalf("%d/%d: %v", n, pad, r.Err())
			}
			if n >= 1024 && &got[0] != &dst[0] {
				t.Fatalf("%d: not placed in dst", n)
			}
		}
	}
	t.Logf("server %+v client %+v", s.Stats(), c.Stats())
}

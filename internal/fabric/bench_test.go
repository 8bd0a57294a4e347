package fabric

import (
	"context"
	"fmt"
	"testing"
)

// Per-packet and per-operation costs, for comparing transports and
// changes to the send and receive paths (BenchmarkSend64K measures bulk).

func benchPair(b *testing.B, h Handler) (*Endpoint, *PeerConn) {
	return benchPairWith(b, Options{}, h)
}

func benchPairWith(b *testing.B, o Options, h Handler) (*Endpoint, *PeerConn) {
	b.Helper()
	srv, err := NewEndpoint(o)
	if err != nil {
		b.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0", h)
	if err != nil {
		b.Fatal(err)
	}
	cli, err := NewEndpoint(o)
	if err != nil {
		b.Fatal(err)
	}
	pc, err := NewPool(cli, 1).Get(context.Background(), addr.String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close(); srv.Close() })
	return srv, pc
}

// BenchmarkSendPacketSmall: one-packet messages of 128 bytes, streamed.
func BenchmarkSendPacketSmall(b *testing.B) {
	_, pc := benchPair(b, discard{})
	head, body := make([]byte, 64), make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := pc.SendPacket(pc.NewID(), head, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead4K: one-sided READs of 4 KiB, one at a time.
func BenchmarkRead4K(b *testing.B) {
	srv, pc := benchPair(b, discard{})
	r := srv.Register(make([]byte, 1<<20), RemoteRead)
	dst := make([]byte, 4096)
	ctx := context.Background()
	b.SetBytes(int64(len(dst)))
	b.ReportAllocs()
	for b.Loop() {
		if err := pc.Read(ctx, r.Key(), 4096, dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteSignaled4K: signaled one-sided WRITEs of 4 KiB, one at a
// time.
func BenchmarkWriteSignaled4K(b *testing.B) {
	srv, pc := benchPair(b, discard{})
	r := srv.Register(make([]byte, 1<<20), RemoteWrite)
	src := make([]byte, 4096)
	ctx := context.Background()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		if err := pc.Write(ctx, r.Key(), 8192, src, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadFabric: one-sided READs of 4 and 64 KiB, one at a time,
// over TCP, over shared memory (copies by the initiator), and over the
// shared-memory link's packets (a region in heap memory).
func BenchmarkReadFabric(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		for _, v := range []struct {
			name string
			mode Fabric
			heap bool
		}{{"tcp", FabricTCP, false}, {"shm", FabricShm, false}, {"shm-packets", FabricShm, true}} {
			b.Run(fmt.Sprintf("%s/%dK", v.name, size>>10), func(b *testing.B) {
				srv, pc := benchPairWith(b, Options{Fabric: v.mode}, discard{})
				mem := make([]byte, 1<<20)
				if !v.heap {
					var err error
					if mem, err = srv.Alloc(1 << 20); err != nil {
						b.Fatal(err)
					}
				}
				r := srv.Register(mem, RemoteRead)
				dst := make([]byte, size)
				ctx := context.Background()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if err := pc.Read(ctx, r.Key(), uint64(size), dst); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

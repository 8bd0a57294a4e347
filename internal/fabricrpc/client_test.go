package fabricrpc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// rawServer answers every call with whatever answer makes of its xid.
type rawServer struct {
	answer func(c *fabric.Conn, xid uint32)
}

func (s *rawServer) HandlePacket(p *fabric.Packet) {
	var h header
	err := parseHeader(p.Data, &h, MaxChunk, 2*MaxChunk)
	c := p.Conn
	p.Release()
	if err == nil && h.proc == procMsg {
		go s.answer(c, h.xid)
	}
}

func (s *rawServer) Closed(*fabric.Conn, error) {}

func okReply(xid uint32) []byte {
	w := xdr.Writer{}
	oncrpc.AppendAccepted(&w, xid, oncrpc.Success)
	return w.B
}

// TestClientBadReply: a server's malformed answer fails the call with a
// protocol error and closes the connection; the call does not hang.
func TestClientBadReply(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(c *fabric.Conn, xid uint32)
		proto  bool // the error is an ErrProtocol
	}{
		{"DONE", func(c *fabric.Conn, xid uint32) { c.SendPacket(1, doneMsg(xid), nil) }, true},
		{"bad version", func(c *fabric.Conn, xid uint32) { c.SendPacket(1, words(xid, 9, procMsg, 0), nil) }, true},
		{"multi-packet", func(c *fabric.Conn, xid uint32) {
			c.Send(1, appendHeader(nil, xid, nil), make([]byte, 2*DefaultBufSize))
		}, true},
		{"chunk of no region", func(c *fabric.Conn, xid uint32) {
			m := append(appendHeader(nil, xid, []chunkRef{{pos: replyHeaderLen + 4, len: 2000, key: 99}}), okReply(xid)...)
			c.SendPacket(1, append(m, words(2000)...), nil)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := fabric.NewEndpoint(fabric.Options{MTU: DefaultBufSize, Quota: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			a, err := ep.Listen("127.0.0.1:0", &rawServer{answer: tc.answer})
			if err != nil {
				t.Fatal(err)
			}
			c := dialClient(t, a.String(), ClientOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = c.Call(ctx, testProg, testVers, procNull, nil, &xdr.Writer{}, nil)
			switch {
			case err == nil:
				t.Fatal("call succeeded")
			case errors.Is(err, context.DeadlineExceeded):
				t.Fatal("call hung")
			case tc.proto && !errors.Is(err, ErrProtocol):
				t.Fatalf("error %v is not a protocol error", err)
			case !tc.proto && !errors.As(err, new(*fabric.AccessError)):
				t.Fatalf("error %v is not an access error", err)
			}
			if _, err := c.Call(ctx, testProg, testVers, procNull, nil, &xdr.Writer{}, nil); err == nil {
				t.Fatal("a call succeeded on the broken connection")
			}
		})
	}
}

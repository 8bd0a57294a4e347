package fabricrpc

import (
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/xdr"
)

// TestRetransmitNonIdempotent: a non-idempotent call retransmitted with
// the same xid over the fabric is answered from the duplicate-request
// cache: the procedure does not run again.
func TestRetransmitNonIdempotent(t *testing.T) {
	_, svc, addr := startServer(t, nil)
	r := dialRaw(t, addr)
	count := func(xid uint32, args []byte) uint32 {
		t.Helper()
		if err := r.send(callMsg(xid, procCount, nil, args)); err != nil {
			t.Fatal(err)
		}
		m := r.next(5 * time.Second)
		if m == nil {
			t.Fatal("no reply")
		}
		rep := decodeReply(t, m)
		if rep.err != nil || rep.h.xid != xid || len(rep.h.refs) != 0 {
			t.Fatalf("reply: xid %#x, %v, refs %+v", rep.h.xid, rep.err, rep.h.refs)
		}
		n := rep.rd.Uint32()
		if rep.rd.Err() != nil || rep.rd.Len() != 0 {
			t.Fatalf("reply results: %v, %d bytes left", rep.rd.Err(), rep.rd.Len())
		}
		return n
	}
	if n := count(1000, nil); n != 1 {
		t.Fatalf("first call counted %d", n)
	}
	for range 3 {
		if n := count(1000, nil); n != 1 {
			t.Fatalf("retransmission counted %d, want the cached 1", n)
		}
	}
	if n := count(1001, nil); n != 2 {
		t.Fatalf("a new call counted %d, want 2", n)
	}
	// The same xid with other arguments is another call.
	if n := count(1000, words(9)); n != 3 {
		t.Fatalf("same xid, other arguments: counted %d, want 3", n)
	}
	if got := svc.count.Load(); got != 3 {
		t.Fatalf("procedure ran %d times, want 3", got)
	}
	// And through a Client, on a second connection from the same host.
	c := dialClient(t, addr, ClientOptions{})
	rd, err := c.Call(testCtx(t), testProg, testVers, procCount, nil, &xdr.Writer{}, nil)
	if err != nil || rd.Uint32() != 4 {
		t.Fatalf("client call: %v", err)
	}
}

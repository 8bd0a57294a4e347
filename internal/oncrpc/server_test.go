package oncrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/xdr"
)

const testProg = 0x20000001

// Procedures of the test program (versions 2 and 3).
const (
	procNull      = 0
	procEcho      = 1 // opaque<4096> back
	procCount     = 2 // non-idempotent: counts its runs, returns the count
	procCountIdem = 3 // the same, idempotent
	procBlock     = 4 // non-idempotent: waits for release
	procBlockIdem = 5 // idempotent: waits for release, tracks concurrency
	procWaitCtx   = 6 // waits for the server to close
	procPanic     = 7
	procWhoAmI    = 8  // uid, gid count, Remote
	procMismatch  = 9  // returns ProgMismatch
	procBadStat   = 10 // returns an accept_stat RFC 5531 does not have
)

type service struct {
	count      atomic.Int32
	blocks     atomic.Int32
	running    atomic.Int32
	maxRunning atomic.Int32
	ctxDone    atomic.Bool
	started    chan uint32   // xid of each blocking call as it starts
	release    chan struct{} // closed to let blocking calls return
}

func newService() *service {
	return &service{started: make(chan uint32, 100), release: make(chan struct{})}
}

func (s *service) handle(ctx context.Context, c *Call, args *xdr.Reader, res *xdr.Writer) AcceptStat {
	switch c.Proc {
	case procNull:
	case procEcho:
		p := args.Opaque(4096)
		if args.Err() != nil || args.Len() != 0 {
			return GarbageArgs
		}
		time.Sleep(time.Duration(len(p)%5) * 100 * time.Microsecond) // reorder replies
		res.Opaque(p)
	case procCount, procCountIdem:
		res.Uint32(uint32(s.count.Add(1)))
	case procBlock, procBlockIdem:
		n := s.running.Add(1)
		defer s.running.Add(-1)
		for m := s.maxRunning.Load(); n > m && !s.maxRunning.CompareAndSwap(m, n); m = s.maxRunning.Load() {
		}
		s.started <- c.XID
		select {
		case <-s.release:
		case <-ctx.Done():
			return SystemErr
		}
		res.Uint32(uint32(s.blocks.Add(1)))
	case procWaitCtx:
		s.started <- c.XID
		<-ctx.Done()
		s.ctxDone.Store(true)
		return SystemErr
	case procPanic:
		panic("handler bug")
	case procWhoAmI:
		res.Uint32(c.Cred.UID)
		res.Uint32(uint32(len(c.Cred.GIDs)))
		res.String(c.Remote)
	case procMismatch:
		res.Uint32(1) // discarded
		return ProgMismatch
	case procBadStat:
		return 42
	default:
		return ProcUnavail
	}
	return Success
}

func idempotent(vers, proc uint32) bool { return proc != procCount && proc != procBlock }

// start serves svc on a loopback port until the test ends.
func start(t *testing.T, svc *service, tune func(*Server)) (*Server, string) {
	t.Helper()
	srv := &Server{Programs: []Program{{Prog: testProg, Low: 2, High: 3, Handle: svc.handle, Idempotent: idempotent}}}
	if tune != nil {
		tune(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve after Close: %v", err)
		}
	})
	return srv, ln.Addr().String()
}

func dial(t *testing.T, addr string) *Client {
	t.Helper()
	c, err := Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

func rawCall(xid, vers, proc uint32, args []byte) []byte {
	var w xdr.Writer
	AppendCall(&w, xid, testProg, vers, proc, nil)
	return append(w.B, args...)
}

// exchange sends one record on nc and reads one back.
func exchange(t *testing.T, nc net.Conn, rec []byte) []byte {
	t.Helper()
	if err := WriteRecord(nc, rec); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, err := ReadRecord(nc, nil, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return reply
}

func wait[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

func TestNullCallOverTCP(t *testing.T) {
	_, addr := start(t, newService(), nil)
	c := dial(t, addr)
	res, err := c.Call(context.Background(), testProg, 3, procNull, nil, nil)
	if err != nil || len(res) != 0 {
		t.Fatalf("NULL: % x, %v", res, err)
	}

	// AUTH_SYS reaches the handler, and so does the caller's address.
	cred := &AuthSysCred{Machine: "client", UID: 1000, GID: 100, GIDs: []uint32{1, 2}}
	res, err = c.Call(context.Background(), testProg, 2, procWhoAmI, cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := xdr.NewReader(res)
	uid, ngids, remote := r.Uint32(), r.Uint32(), r.String(100)
	if r.Err() != nil || uid != 1000 || ngids != 2 || remote != c.nc.LocalAddr().String() {
		t.Fatalf("handler saw uid %d, %d gids, remote %q (client at %s), %v", uid, ngids, remote, c.nc.LocalAddr(), r.Err())
	}

	// A credential the server would refuse is not sent.
	if _, err := c.Call(context.Background(), testProg, 2, procNull, &AuthSysCred{GIDs: make([]uint32, 17)}, nil); err == nil {
		t.Fatal("17 gids sent")
	}
}

func TestStatusesOverTCP(t *testing.T) {
	_, addr := start(t, newService(), nil)
	c := dial(t, addr)
	ctx := context.Background()
	cases := []struct {
		name             string
		prog, vers, proc uint32
		args             []byte
		want             error
	}{
		{"unknown program", 99, 3, procNull, nil, &AcceptError{Stat: ProgUnavail}},
		{"version 1", testProg, 1, procNull, nil, &AcceptError{Stat: ProgMismatch, Low: 2, High: 3}},
		{"version 4", testProg, 4, procNull, nil, &AcceptError{Stat: ProgMismatch, Low: 2, High: 3}},
		{"unknown procedure", testProg, 3, 99, nil, &AcceptError{Stat: ProcUnavail}},
		{"short arguments", testProg, 3, procEcho, []byte{0, 0}, &AcceptError{Stat: GarbageArgs}},
		{"long arguments", testProg, 3, procEcho, []byte{0, 0, 0, 0, 1, 2, 3, 4}, &AcceptError{Stat: GarbageArgs}},
		{"handler panic", testProg, 3, procPanic, nil, &AcceptError{Stat: SystemErr}},
		{"handler mismatch", testProg, 2, procMismatch, nil, &AcceptError{Stat: ProgMismatch, Low: 2, High: 3}},
		{"unknown status", testProg, 2, procBadStat, nil, &AcceptError{Stat: SystemErr}},
	}
	for _, tc := range cases {
		res, err := c.Call(ctx, tc.prog, tc.vers, tc.proc, nil, tc.args)
		if !reflect.DeepEqual(err, tc.want) || res != nil {
			t.Errorf("%s: % x, %v; want %v", tc.name, res, err, tc.want)
		}
	}

	// Denied replies, which the Client cannot provoke, on a raw connection.
	nc := dialRaw(t, addr)
	bad := rawCall(21, 3, procNull, nil)
	binary.BigEndian.PutUint32(bad[8:], 3) // RPC version 3
	_, err := parseReply(exchange(t, nc, bad))
	if want := (&RejectError{RPCMismatch: true, Low: 2, High: 2}); !reflect.DeepEqual(err, want) {
		t.Errorf("RPC version 3: %v", err)
	}
	bad = rawCall(22, 3, procNull, nil)
	binary.BigEndian.PutUint32(bad[24:], 6) // credential flavor 6 (RPCSEC_GSS)
	_, err = parseReply(exchange(t, nc, bad))
	if want := (&RejectError{AuthStat: authBadCred}); !reflect.DeepEqual(err, want) {
		t.Errorf("flavor 6: %v", err)
	}

	// A reply sent to the server, and a record too short for a header,
	// are dropped without a word, and the connection goes on.
	var w xdr.Writer
	AppendAccepted(&w, 23, Success)
	for _, junk := range [][]byte{w.B, {1, 2}} {
		if err := WriteRecord(nc, junk); err != nil {
			t.Fatal(err)
		}
	}
	reply := exchange(t, nc, rawCall(24, 3, procNull, nil))
	if xid := binary.BigEndian.Uint32(reply); xid != 24 {
		t.Fatalf("first reply after junk has xid %d, want 24", xid)
	}
}

func TestProgramVersions(t *testing.T) {
	s := &Server{Programs: []Program{{Prog: 7, Low: 1, High: 1}, {Prog: 8, Low: 1, High: 9}, {Prog: 7, Low: 3, High: 4}}}
	if p, _, _, _ := s.program(7, 3); p != &s.Programs[2] {
		t.Errorf("version 3 of 7 served by %v", p)
	}
	if p, served, low, high := s.program(7, 2); p != nil || !served || low != 1 || high != 4 {
		t.Errorf("version 2 of 7: %v %v %d..%d, want mismatch 1..4", p, served, low, high)
	}
	if p, served, _, _ := s.program(9, 1); p != nil || served {
		t.Errorf("program 9: %v %v", p, served)
	}
}

func TestPipelinedCalls(t *testing.T) {
	_, addr := start(t, newService(), nil)
	c := dial(t, addr)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			payload := bytes.Repeat([]byte{byte(i)}, i*7%300)
			var w xdr.Writer
			w.Opaque(payload)
			res, err := c.Call(context.Background(), testProg, 3, procEcho, nil, w.B)
			if err != nil {
				errs <- fmt.Errorf("call %d: %w", i, err)
				return
			}
			r := xdr.NewReader(res)
			if got := r.Opaque(4096); r.Err() != nil || r.Len() != 0 || !bytes.Equal(got, payload) {
				errs <- fmt.Errorf("call %d: got % x, want % x", i, got, payload)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMaxInFlight(t *testing.T) {
	svc := newService()
	_, addr := start(t, svc, func(s *Server) { s.MaxInFlight = 2 })
	c := dial(t, addr)
	const n = 6
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Call(context.Background(), testProg, 3, procBlockIdem, nil, nil)
			errs <- err
		}()
	}
	wait(t, svc.started)
	wait(t, svc.started)
	select {
	case <-svc.started:
		t.Fatal("a third call started with MaxInFlight 2")
	case <-time.After(100 * time.Millisecond):
	}
	close(svc.release)
	for range n {
		if err := wait(t, errs); err != nil {
			t.Fatal(err)
		}
	}
	if m := svc.maxRunning.Load(); m != 2 {
		t.Fatalf("%d calls ran at once, want 2", m)
	}
}

// TestOversizedRecord: a header claiming 1 GiB closes that connection only,
// and costs no memory.
func TestOversizedRecord(t *testing.T) {
	svc := newService()
	_, addr := start(t, svc, nil)
	c := dial(t, addr)
	ctx := context.Background()
	if _, err := c.Call(ctx, testProg, 3, procNull, nil, nil); err != nil {
		t.Fatal(err)
	}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	nc := dialRaw(t, addr)
	huge := binary.BigEndian.AppendUint32(nil, lastFragment|1<<30)
	if _, err := nc.Write(append(huge, "abcd"...)); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := nc.Read(make([]byte, 10))
	if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
		t.Fatalf("connection still open after a 1 GiB record: %v", err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("allocated %d bytes for a rejected record", grew)
	}

	// A connection is closed at such a record even while a call it made
	// still runs: the rest of its stream means nothing.
	nc = dialRaw(t, addr)
	if err := WriteRecord(nc, rawCall(5, 3, procBlockIdem, nil)); err != nil {
		t.Fatal(err)
	}
	wait(t, svc.started)
	if _, err := nc.Write(append(huge, "abcd"...)); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = nc.Read(make([]byte, 10))
	if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
		t.Fatalf("connection with a call running still open after a 1 GiB record: %v", err)
	}
	close(svc.release)

	// The other connection and new ones are served.
	if _, err := c.Call(ctx, testProg, 3, procNull, nil, nil); err != nil {
		t.Fatalf("existing connection: %v", err)
	}
	if _, err := dial(t, addr).Call(ctx, testProg, 3, procNull, nil, nil); err != nil {
		t.Fatalf("new connection: %v", err)
	}
}

// TestHugeClaimUnderLimit: with a limit over the claim, the server's
// buffer still grows only with the bytes that came.
func TestHugeClaimUnderLimit(t *testing.T) {
	_, addr := start(t, newService(), func(s *Server) { s.MaxRecord = maxFragment })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	nc := dialRaw(t, addr)
	huge := binary.BigEndian.AppendUint32(nil, lastFragment|1<<30)
	if _, err := nc.Write(append(huge, make([]byte, 1000)...)); err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).CloseWrite()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := nc.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("after a truncated record: %d bytes, %v; want the server to close", n, err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("allocated %d bytes for 1000 bytes of a record claiming 1 GiB", grew)
	}
}

func TestDuplicateRequestCache(t *testing.T) {
	svc := newService()
	_, addr := start(t, svc, nil)
	count := func(reply []byte) uint32 {
		t.Helper()
		res, err := parseReply(reply)
		if err != nil || len(res) != 4 {
			t.Fatalf("reply % x: %v", res, err)
		}
		return binary.BigEndian.Uint32(res)
	}

	// A non-idempotent call retransmitted on a new connection (a new port
	// of the same IP) gets the first reply, without a second run.
	call := rawCall(0x1234, 3, procCount, []byte{0, 0, 0, 7})
	c1, c2 := dialRaw(t, addr), dialRaw(t, addr)
	r1 := exchange(t, c1, call)
	r2 := exchange(t, c2, call)
	if !bytes.Equal(r1, r2) || count(r1) != 1 || svc.count.Load() != 1 {
		t.Fatalf("replies % x and % x, %d runs; want the same reply and one run", r1, r2, svc.count.Load())
	}

	// The same xid with other arguments is another call.
	if n := count(exchange(t, c2, rawCall(0x1234, 3, procCount, []byte{0, 0, 0, 8}))); n != 2 {
		t.Fatalf("other arguments answered with count %d, want a second run", n)
	}

	// An idempotent call runs again.
	call = rawCall(0x5678, 3, procCountIdem, []byte{0, 0, 0, 7})
	a, b := count(exchange(t, c1, call)), count(exchange(t, c2, call))
	if a != 3 || b != 4 {
		t.Fatalf("idempotent call counted %d then %d, want 3 then 4", a, b)
	}
}

// TestDuplicateRequestCacheReservedPort: a process on an unprivileged
// port that sends the same call as a client on a reserved port of the
// same host (root's) does not get that call's cached reply: the call runs
// again, as its own.
func TestDuplicateRequestCacheReservedPort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding a reserved port needs root")
	}
	svc := newService()
	_, addr := start(t, svc, nil)
	call := rawCall(0x4321, 3, procCount, []byte{0, 0, 0, 7})
	root, err := DialTCP(context.Background(), "tcp", addr, ResvRequired)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	r1 := exchange(t, root, call)
	r2 := exchange(t, dialRaw(t, addr), call)
	if bytes.Equal(r1, r2) || svc.count.Load() != 2 {
		t.Fatalf("replies % x and % x, %d runs: the unprivileged port got the reserved port's reply", r1, r2, svc.count.Load())
	}
}

func TestDuplicateWhileRunning(t *testing.T) {
	svc := newService()
	_, addr := start(t, svc, nil)
	call := rawCall(0x99, 3, procBlock, nil)
	c1, c2 := dialRaw(t, addr), dialRaw(t, addr)
	if err := WriteRecord(c1, call); err != nil {
		t.Fatal(err)
	}
	wait(t, svc.started)

	// The duplicate of a running call gets no reply.
	if err := WriteRecord(c2, call); err != nil {
		t.Fatal(err)
	}
	c2.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if rec, err := ReadRecord(c2, nil, 1000); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("duplicate of a running call answered: % x, %v", rec, err)
	}

	close(svc.release)
	c1.SetReadDeadline(time.Now().Add(5 * time.Second))
	r1, err := ReadRecord(c1, nil, 1000)
	if err != nil {
		t.Fatal(err)
	}
	// Once it finished, a duplicate gets the same reply.
	if r2 := exchange(t, c2, call); !bytes.Equal(r1, r2) {
		t.Fatalf("replies % x and % x", r1, r2)
	}
	if n := svc.blocks.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestCloseCancelsHandlers(t *testing.T) {
	svc := newService()
	srv, addr := start(t, svc, nil)
	c := dial(t, addr)
	errs := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), testProg, 3, procWaitCtx, nil, nil)
		errs <- err
	}()
	wait(t, svc.started)
	closed := make(chan struct{})
	go func() {
		srv.Close()
		close(closed)
	}()
	wait(t, closed)
	if !svc.ctxDone.Load() {
		t.Fatal("Close returned before the handler saw its context cancelled")
	}
	if err := wait(t, errs); err == nil {
		t.Fatal("call succeeded on a closed server")
	}
	if _, err := c.Call(context.Background(), testProg, 3, procNull, nil, nil); err == nil {
		t.Fatal("call succeeded after the server closed")
	}
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Fatal("listener still open after Close")
	}
}

func TestClientConnectionBreaks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const n = 10
	go func() {
		// A server that reads the calls and hangs up without a reply.
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		for range n {
			if _, err := ReadRecord(nc, nil, 1000); err != nil {
				break
			}
		}
		nc.Close()
	}()
	c, err := Dial(context.Background(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Call(context.Background(), testProg, 3, procNull, nil, nil)
			errs <- err
		}()
	}
	for range n {
		if err := wait(t, errs); !errors.Is(err, io.EOF) {
			t.Fatalf("pending call: %v, want the connection's io.EOF", err)
		}
	}
	if _, err := c.Call(context.Background(), testProg, 3, procNull, nil, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("call on a broken connection: %v", err)
	}
}

// lateConn holds back the end of each write until the client has seen
// its connection end, so that the call's reply and the breakage are both
// waiting when the call starts to wait.
type lateConn struct {
	net.Conn
	c *Client
}

func (l *lateConn) Write(p []byte) (int, error) {
	n, err := l.Conn.Write(p)
	select {
	case <-l.c.done:
	case <-time.After(5 * time.Second):
	}
	return n, err
}

// TestClientReplyThenHangUp: a reply that arrives just before the
// connection ends is still the call's result.
func TestClientReplyThenHangUp(t *testing.T) {
	for range 50 {
		cc, sc := net.Pipe()
		go func() {
			defer sc.Close()
			rec, err := ReadRecord(sc, nil, 1000)
			if err != nil || len(rec) < 4 {
				return
			}
			var w xdr.Writer
			AppendAccepted(&w, binary.BigEndian.Uint32(rec), Success)
			w.Uint32(7)
			WriteRecord(sc, w.B)
		}()
		lc := &lateConn{Conn: cc}
		c := NewClient(lc)
		lc.c = c
		res, err := c.Call(context.Background(), testProg, 3, procNull, nil, nil)
		c.Close()
		if err != nil || !bytes.Equal(res, []byte{0, 0, 0, 7}) {
			t.Fatalf("reply before hang-up: % x, %v", res, err)
		}
	}
}

func TestClientContextAndClose(t *testing.T) {
	svc := newService()
	_, addr := start(t, svc, nil)
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, testProg, 3, procBlockIdem, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call past its deadline: %v", err)
	}
	close(svc.release) // the late reply is dropped; the connection goes on
	if _, err := c.Call(context.Background(), testProg, 3, procNull, nil, nil); err != nil {
		t.Fatal(err)
	}

	// Close fails the calls in flight, then every call.
	svc2 := newService()
	_, addr2 := start(t, svc2, nil)
	c2 := dial(t, addr2)
	errs := make(chan error, 1)
	go func() {
		_, err := c2.Call(context.Background(), testProg, 3, procBlockIdem, nil, nil)
		errs <- err
	}()
	wait(t, svc2.started)
	c2.Close()
	if err := wait(t, errs); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("call in flight at Close: %v", err)
	}
	if _, err := c2.Call(context.Background(), testProg, 3, procNull, nil, nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	close(svc2.release)
}

func TestCloseBeforeServe(t *testing.T) {
	var s Server
	s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln); err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	if _, err := ln.Accept(); err == nil {
		t.Fatal("listener left open")
	}
}

func benchmarkCalls(b *testing.B, proc uint32, args []byte) {
	svc := newService()
	srv := &Server{Programs: []Program{{Prog: testProg, Low: 2, High: 3, Handle: svc.handle, Idempotent: idempotent}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c, err := Dial(context.Background(), ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(int64(len(args)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Call(context.Background(), testProg, 3, proc, nil, args); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkNullCall(b *testing.B) { benchmarkCalls(b, procNull, nil) }

// BenchmarkCall1MiB sends 1 MiB of arguments (an NFS WRITE's worth) per
// call; the non-idempotent procedure also checksums them for the
// duplicate-request cache.
func BenchmarkCall1MiB(b *testing.B) { benchmarkCalls(b, procCount, make([]byte, 1<<20)) }

// TestMaxConns: connections beyond the bound are closed as they come;
// those served keep working, and a slot frees when one closes.
func TestMaxConns(t *testing.T) {
	_, addr := start(t, newService(), func(s *Server) { s.MaxConns = 2 })
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	for _, nc := range []net.Conn{a, b} {
		exchange(t, nc, rawCall(1, 2, procNull, nil))
	}
	extra := dialRaw(t, addr)
	WriteRecord(extra, rawCall(2, 2, procNull, nil))
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := ReadRecord(extra, nil, 1<<20); err == nil {
		t.Fatal("a third connection was served with MaxConns 2")
	}
	exchange(t, a, rawCall(3, 2, procNull, nil))
	b.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		nc := dialRaw(t, addr)
		WriteRecord(nc, rawCall(4, 2, procNull, nil))
		nc.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := ReadRecord(nc, nil, 1<<20); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection served after one of two closed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWriteTimeout: a client that sends calls and never reads the
// replies loses its connection after WriteTimeout instead of holding its
// calls forever; the server goes on serving others.
func TestWriteTimeout(t *testing.T) {
	_, addr := start(t, newService(), func(s *Server) { s.WriteTimeout = 200 * time.Millisecond })
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4096)
	big := make([]byte, 4000)
	var w xdr.Writer
	w.Opaque(big)
	// Echo replies pile up in the socket buffers until the server's
	// write blocks; it must then give up and close. (The client's own
	// writes block too once the server stops reading: their deadline
	// ends the sending.)
	for i := 0; i < 20000; i++ {
		nc.SetWriteDeadline(time.Now().Add(time.Second))
		if err := WriteRecord(nc, rawCall(uint32(i+1), 2, procEcho, w.B)); err != nil {
			break
		}
	}
	// The server has closed its side: reading drains what it sent, then
	// ends (EOF, or a reset for the calls it never read) — not a timeout.
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the stalled connection was not closed by the server")
	}
	c := dial(t, addr)
	if _, err := c.Call(context.Background(), testProg, 2, procNull, nil, nil); err != nil {
		t.Fatalf("a new connection after the stalled one: %v", err)
	}
}

// TestIdleTimeout: a connection that sends no whole call for IdleTimeout
// (here one that sends half a record and stalls) is closed, and a call
// already running on it still gets its reply first.
func TestIdleTimeout(t *testing.T) {
	svc := newService()
	_, addr := start(t, svc, func(s *Server) { s.IdleTimeout = 300 * time.Millisecond })
	nc := dialRaw(t, addr)
	if err := WriteRecord(nc, rawCall(1, 2, procBlock, nil)); err != nil {
		t.Fatal(err)
	}
	wait(t, svc.started)
	nc.Write([]byte{0x80, 0, 0, 100, 1, 2}) // a record that never finishes
	time.Sleep(600 * time.Millisecond)      // past the idle timeout
	close(svc.release)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := ReadRecord(nc, nil, 1<<20); err != nil {
		t.Fatalf("the running call's reply: %v", err)
	}
	if _, err := ReadRecord(nc, nil, 1<<20); err == nil {
		t.Fatal("a second record on a connection that went idle")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the idle connection was not closed by the server")
	}
}

// TestMaxConnsPerHost: one host's connections beyond its bound are
// closed as they come, while another host is still served.
func TestMaxConnsPerHost(t *testing.T) {
	_, addr := start(t, newService(), func(s *Server) { s.MaxConnsPerHost = 2 })
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	for _, nc := range []net.Conn{a, b} {
		exchange(t, nc, rawCall(1, 2, procNull, nil))
	}
	extra := dialRaw(t, addr)
	WriteRecord(extra, rawCall(2, 2, procNull, nil))
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := ReadRecord(extra, nil, 1<<20); err == nil {
		t.Fatal("a third connection from one host was served with MaxConnsPerHost 2")
	}
	// Another loopback address is another host.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	other, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot dial from 127.0.0.2: %v", err)
	}
	defer other.Close()
	exchange(t, other, rawCall(3, 2, procNull, nil))
}

package fabricrpc

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/xdr"
)

// heldCall calls procHeld for n bytes and checks the data.
func heldCall(t *testing.T, c *Client, svc *service, n int, dst []byte) {
	t.Helper()
	w := &xdr.Writer{}
	w.Uint32(uint32(n))
	r, err := c.Call(testCtx(t), testProg, testVers, procHeld, nil, w, dst)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Opaque(len(svc.static)); r.Err() != nil || !bytes.Equal(got, svc.static[:n]) {
		t.Fatalf("held reply of %d bytes differs (%v)", n, r.Err())
	}
}

func waitHeld(t *testing.T, svc *service, d time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-svc.held:
		return at
	case <-time.After(d):
		t.Fatalf("the reply's hold was not released within %v", d)
		return time.Time{}
	}
}

// TestDoneReleases: after pulling a chunked reply the client sends DONE
// and the server releases the reply's holds at once, not at the timeout;
// an inline reply's holds go as soon as it is sent.
func TestDoneReleases(t *testing.T) {
	s, svc, addr := startServer(t, func(s *Server) { s.DoneTimeout = time.Minute })
	c := dialClient(t, addr, ClientOptions{})
	for _, n := range []int{64 << 10, 1 << 20, 100, 0} {
		heldCall(t, c, svc, n, make([]byte, n))
		waitHeld(t, svc, 5*time.Second)
	}
	// A long reply (no data chunk) holds until DONE too.
	s2, svc2, addr2 := startServer(t, func(s *Server) { s.DoneTimeout = time.Minute; s.ChunkMin = 1 << 30 })
	c2 := dialClient(t, addr2, ClientOptions{})
	heldCall(t, c2, svc2, 64<<10, nil)
	waitHeld(t, svc2, 5*time.Second)
	for _, st := range []Stats{s.Stats(), s2.Stats()} {
		if st.DoneTimeouts != 0 {
			t.Errorf("%d DONE timeouts", st.DoneTimeouts)
		}
	}
	if svc.heldLive.Load() != 0 || svc2.heldLive.Load() != 0 {
		t.Error("holds left unreleased")
	}
}

// rawHeld sends procHeld for n bytes as xid and returns the reply's data
// chunk reference.
func rawHeld(t *testing.T, r *rawClient, xid uint32, n int) chunkRef {
	t.Helper()
	if err := r.send(callMsg(xid, procHeld, nil, words(uint32(n)))); err != nil {
		t.Fatal(err)
	}
	m := r.next(5 * time.Second)
	if m == nil {
		t.Fatal("no reply")
	}
	rep := decodeReply(t, m)
	if rep.err != nil || rep.h.xid != xid || len(rep.h.refs) != 1 || rep.h.long {
		t.Fatalf("reply: xid %#x, %v, refs %+v", rep.h.xid, rep.err, rep.h.refs)
	}
	ref := rep.h.refs[0]
	if want := (chunkRef{pos: replyHeaderLen + 4, len: uint32(n), key: ref.key}); ref != want {
		t.Fatalf("reply chunk %+v, want %+v", ref, want)
	}
	return ref
}

// TestDoneTimeout: a client that never sends DONE has its reply's
// regions revoked and holds released after DoneTimeout; a later pull
// fails with a remote access error.
func TestDoneTimeout(t *testing.T) {
	const timeout = 150 * time.Millisecond
	s, svc, addr := startServer(t, func(s *Server) { s.DoneTimeout = timeout })
	r := dialRaw(t, addr)
	sent := time.Now()
	ref := rawHeld(t, r, 77, 64<<10)
	buf := make([]byte, ref.len)
	ctx := testCtx(t)
	if err := r.conn.Read(ctx, ref.key, ref.addr, buf); err != nil || !bytes.Equal(buf, svc.static[:ref.len]) {
		t.Fatalf("pulling the reply chunk: %v", err)
	}
	at := waitHeld(t, svc, 5*time.Second)
	if at.Sub(sent) < timeout {
		t.Errorf("released after %v, before DoneTimeout %v", at.Sub(sent), timeout)
	}
	if st := s.Stats(); st.DoneTimeouts != 1 {
		t.Errorf("DoneTimeouts = %d, want 1", st.DoneTimeouts)
	}
	err := r.conn.Read(ctx, ref.key, ref.addr, buf)
	var ae *fabric.AccessError
	if !errors.As(err, &ae) {
		t.Fatalf("pull after the timeout: %v, want an access error", err)
	}
	if !r.closedWithin(5 * time.Second) {
		t.Error("connection survived a refused pull")
	}
}

// TestPendingBound: a client that never sends DONE pins at most
// 2×BufCount replies; then the oldest is released early (counted as a
// timeout) and its region revoked, and closing the connection releases
// the rest.
func TestPendingBound(t *testing.T) {
	const bufs = 4
	s, svc, addr := startServer(t, func(s *Server) { s.BufCount = bufs; s.DoneTimeout = time.Minute })
	r := dialRaw(t, addr)
	var refs []chunkRef
	for i := range 2 * bufs {
		refs = append(refs, rawHeld(t, r, uint32(100+i), 2048))
	}
	select {
	case <-svc.held:
		t.Fatalf("a hold released with %d replies pending", 2*bufs)
	default:
	}
	refs = append(refs, rawHeld(t, r, 200, 2048))
	waitHeld(t, svc, 5*time.Second)
	if st := s.Stats(); st.DoneTimeouts != 1 {
		t.Errorf("DoneTimeouts = %d, want 1", st.DoneTimeouts)
	}
	if n := svc.heldLive.Load(); n != 2*bufs {
		t.Errorf("%d replies held, want %d", n, 2*bufs)
	}
	ctx := testCtx(t)
	buf := make([]byte, 2048)
	if err := r.conn.Read(ctx, refs[1].key, 0, buf); err != nil {
		t.Fatalf("second oldest reply: %v", err)
	}
	// DONE for one releases it.
	if err := r.send(doneMsg(101)); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, svc, 5*time.Second)
	var ae *fabric.AccessError
	if err := r.conn.Read(ctx, refs[0].key, 0, buf); !errors.As(err, &ae) {
		t.Fatalf("pull of the evicted reply: %v, want an access error", err)
	}
	if !waitFor(5*time.Second, func() bool { return svc.heldLive.Load() == 0 }) {
		t.Errorf("%d holds left after the connection closed", svc.heldLive.Load())
	}
	if st := s.Stats(); st.DoneTimeouts != 1 {
		t.Errorf("DoneTimeouts = %d after the close, want 1", st.DoneTimeouts)
	}
}

// TestRetransmitPending: a call retransmitted while its first reply
// awaits DONE replaces it (the first is released, not as a timeout);
// DONE then releases the second.
func TestRetransmitPending(t *testing.T) {
	s, svc, addr := startServer(t, func(s *Server) { s.DoneTimeout = time.Minute })
	r := dialRaw(t, addr)
	first := rawHeld(t, r, 5, 4096)
	second := rawHeld(t, r, 5, 4096)
	if first.key == second.key {
		t.Fatal("the retransmission's reply reuses the region")
	}
	waitHeld(t, svc, 5*time.Second)
	buf := make([]byte, 4096)
	if err := r.conn.Read(testCtx(t), second.key, 0, buf); err != nil || !bytes.Equal(buf, svc.static[:4096]) {
		t.Fatalf("pulling the second reply: %v", err)
	}
	if err := r.send(doneMsg(5)); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, svc, 5*time.Second)
	if st := s.Stats(); st.DoneTimeouts != 0 {
		t.Errorf("DoneTimeouts = %d", st.DoneTimeouts)
	}
	// The connection is still good.
	if err := r.send(callMsg(6, procNull, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if m := r.next(5 * time.Second); m == nil || decodeReply(t, m).err != nil {
		t.Fatal("no reply to a call after the DONE")
	}
}

// TestRetransmitAfterRevokedReply: a reply whose regions are gone before
// the client pulls them (a DONE timeout) fails the pull, which breaks
// the connection; the client connects again and retransmits the call
// once, with the same xid, and gets its data.
func TestRetransmitAfterRevokedReply(t *testing.T) {
	s, svc, addr := startServer(t, nil)
	c := dialClient(t, addr, ClientOptions{})
	data := pattern(7, 64<<10)
	s.revokeNext.Store(true)
	got, err := echo(testCtx(t), c, data, make([]byte, len(data)))
	if err != nil {
		t.Fatalf("echo after a revoked reply: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("wrong data after the retransmission")
	}
	if st := c.Stats(); st.Retransmits != 1 {
		t.Fatalf("%d retransmissions, want 1", st.Retransmits)
	}
	if st := s.Stats(); st.DoneTimeouts != 1 || st.Calls != 2 {
		t.Fatalf("server stats %+v: want the call answered twice, one early release", st)
	}
	// On the new connection a non-idempotent call runs once. (Only a
	// reply with chunks can be revoked, and the duplicate-request cache's
	// replies are inline, so a retransmitted non-idempotent call meets
	// the cache as over TCP: see TestRetransmitNonIdempotent.)
	before := svc.count.Load()
	w := &xdr.Writer{ChunkMin: c.ChunkMin()}
	if _, err := c.Call(testCtx(t), testProg, testVers, procCount, nil, w, nil); err != nil {
		t.Fatal(err)
	}
	if n := svc.count.Load() - before; n != 1 {
		t.Fatalf("a counter call ran %d times", n)
	}
	// The connection works on.
	if got, err := echo(testCtx(t), c, data, nil); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo after reconnecting: %v", err)
	}
}

// TestPendingBytesBound: replies awaiting DONE on all connections pin at
// most MaxPendingBytes; past it the oldest, whichever connection it is
// on, is released early.
func TestPendingBytesBound(t *testing.T) {
	const size, limit = 2048, 3 * 2048
	s, svc, addr := startServer(t, func(s *Server) { s.DoneTimeout = time.Minute; s.MaxPendingBytes = limit })
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	first := rawHeld(t, a, 1, size)
	rawHeld(t, b, 2, size)
	rawHeld(t, a, 3, size)
	if st := s.Stats(); st.PendingBytes != limit || st.DoneTimeouts != 0 {
		t.Fatalf("stats %+v: want %d bytes pending, none released", st, limit)
	}
	rawHeld(t, b, 4, size) // over: the oldest (on a) goes
	waitHeld(t, svc, 5*time.Second)
	if st := s.Stats(); st.PendingBytes != limit || st.DoneTimeouts != 1 {
		t.Fatalf("stats %+v: want %d bytes pending, one released early", st, limit)
	}
	var ae *fabric.AccessError
	if err := a.conn.Read(testCtx(t), first.key, 0, make([]byte, size)); !errors.As(err, &ae) {
		t.Fatalf("pull of the reply released early: %v, want an access error", err)
	}
	// The access error ended a's connection, releasing its other reply;
	// DONE and b's close release the rest, and the count follows.
	if !waitFor(5*time.Second, func() bool { return s.Stats().PendingBytes == 2*size }) {
		t.Fatalf("pending bytes %d after a's connection ended, want %d", s.Stats().PendingBytes, 2*size)
	}
	if err := b.send(doneMsg(2)); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return s.Stats().PendingBytes == size }) {
		t.Fatalf("pending bytes %d after a DONE, want %d", s.Stats().PendingBytes, size)
	}
	b.conn.Close()
	if !waitFor(5*time.Second, func() bool { return s.Stats().PendingBytes == 0 }) {
		t.Fatalf("pending bytes %d after both closed, want 0", s.Stats().PendingBytes)
	}
}

// TestReplyRegionsPerConnection: a reply's regions answer only the
// connection the reply went to; another client holding the key is
// refused (and loses its connection, as for any access error).
func TestReplyRegionsPerConnection(t *testing.T) {
	_, svc, addr := startServer(t, func(s *Server) { s.DoneTimeout = time.Minute })
	a, b := dialRaw(t, addr), dialRaw(t, addr)
	ref := rawHeld(t, a, 1, 2048)
	var ae *fabric.AccessError
	if err := b.conn.Read(testCtx(t), ref.key, 0, make([]byte, 2048)); !errors.As(err, &ae) {
		t.Fatalf("another connection pulled a reply's chunk with its key: %v", err)
	}
	buf := make([]byte, 2048)
	if err := a.conn.Read(testCtx(t), ref.key, 0, buf); err != nil || !bytes.Equal(buf, svc.static[:2048]) {
		t.Fatalf("the reply's own connection: %v", err)
	}
}

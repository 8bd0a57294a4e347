package fabricrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// The test RPC program.
const (
	testProg = 0x20000101
	testVers = 1
)

const (
	procNull   = 0
	procEcho   = 1 // opaque<2 MiB> back, the reply's data aliasing the call's
	procMix    = 2 // items<> (summed), uint32 m, opaque data → count, sum, m items, data
	procCount  = 3 // non-idempotent: counts its runs, returns the count
	procBlock  = 4 // opaque data → data, after the gate opens; tracks concurrency
	procHeld   = 5 // uint32 n → n bytes of static memory, held until the transport releases it
	procChunks = 6 // uint32 k → k opaques of 1 KiB (chunks)
)

const maxEcho = 2 << 20

// service implements the test program.
type service struct {
	count      atomic.Uint32
	running    atomic.Int32
	maxRunning atomic.Int32
	started    chan struct{} // one per procBlock start
	gate       chan struct{} // closed to let procBlock calls return
	gateOnce   sync.Once
	held       chan time.Time // when a procHeld reply's hold was released
	heldLive   atomic.Int32   // procHeld replies not yet released
	static     []byte
}

func newService() *service {
	s := &service{started: make(chan struct{}, 1000), gate: make(chan struct{}), held: make(chan time.Time, 100),
		static: make([]byte, 1<<20)}
	for i := range s.static {
		s.static[i] = byte(i*7 + i>>8)
	}
	return s
}

func (s *service) openGate() { s.gateOnce.Do(func() { close(s.gate) }) }

func (s *service) handle(ctx context.Context, c *oncrpc.Call, args *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
	switch c.Proc {
	case procNull:
	case procEcho:
		p := args.Opaque(maxEcho)
		if args.Err() != nil || args.Len() != 0 {
			return oncrpc.GarbageArgs
		}
		res.Opaque(p) // aliases the call: the transport must keep it valid
	case procMix:
		n := args.Count(1<<20, 4)
		var sum uint32
		for range n {
			sum += args.Uint32()
		}
		m := args.Uint32()
		p := args.Opaque(maxEcho)
		if args.Err() != nil || args.Len() != 0 || m > 1<<20 {
			return oncrpc.GarbageArgs
		}
		res.Uint32(uint32(n))
		res.Uint32(sum)
		res.Uint32(m)
		for i := range m {
			res.Uint32(i*3 + 1)
		}
		res.Opaque(p)
	case procCount:
		res.Uint32(s.count.Add(1))
	case procBlock:
		p := args.Opaque(maxEcho)
		if args.Err() != nil {
			return oncrpc.GarbageArgs
		}
		n := s.running.Add(1)
		for m := s.maxRunning.Load(); n > m && !s.maxRunning.CompareAndSwap(m, n); m = s.maxRunning.Load() {
		}
		s.started <- struct{}{}
		select {
		case <-s.gate:
		case <-time.After(20 * time.Second):
			s.running.Add(-1)
			return oncrpc.SystemErr
		}
		s.running.Add(-1)
		res.Opaque(p)
	case procHeld:
		n := args.Uint32()
		if args.Err() != nil || n > uint32(len(s.static)) {
			return oncrpc.GarbageArgs
		}
		res.Opaque(s.static[:n])
		s.heldLive.Add(1)
		res.Hold(func() {
			s.heldLive.Add(-1)
			select {
			case s.held <- time.Now():
			default: // a benchmark's
			}
		})
	case procChunks:
		k := args.Uint32()
		if args.Err() != nil || k > 64 {
			return oncrpc.GarbageArgs
		}
		for i := range k {
			res.Opaque(s.static[i : i+1024])
		}
	default:
		return oncrpc.ProcUnavail
	}
	return oncrpc.Success
}

func newRPC(svc *service) *oncrpc.Server {
	return &oncrpc.Server{Programs: []oncrpc.Program{{Prog: testProg, Low: testVers, High: testVers, Handle: svc.handle,
		Idempotent: func(vers, proc uint32) bool { return proc != procCount }}}}
}

// startServer serves a new service over the fabric until the test ends.
func startServer(t testing.TB, tune func(*Server)) (*Server, *service, string) {
	t.Helper()
	svc := newService()
	rpc := newRPC(svc)
	s := &Server{RPC: rpc}
	if tune != nil {
		tune(s)
	}
	a, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.openGate()
		s.Close()
		rpc.Close()
	})
	return s, svc, a.String()
}

func dialClient(t testing.TB, addr string, o ClientOptions) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pattern is n bytes derived from seed.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// echo calls procEcho with data and returns the data of its reply.
func echo(ctx context.Context, c *Client, data, dst []byte) ([]byte, error) {
	w := &xdr.Writer{ChunkMin: c.ChunkMin()}
	w.Opaque(data)
	r, err := c.Call(ctx, testProg, testVers, procEcho, nil, w, dst)
	if err != nil {
		return nil, err
	}
	got := r.Opaque(maxEcho)
	if err := r.Err(); err != nil {
		return nil, err
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%d bytes after the results", r.Len())
	}
	return got, nil
}

// background runs a well-behaved client's echo calls against addr until
// the returned stop is called, which reports any failure.
func background(t *testing.T, addr string) (stop func()) {
	t.Helper()
	c := dialClient(t, addr, ClientOptions{})
	quit := make(chan struct{})
	var wg sync.WaitGroup
	var calls atomic.Int64
	errs := make(chan error, 4)
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sizes := []int{0, 100, 2000, 70000}
			dst := make([]byte, 1<<17)
			for i := g; ; i++ {
				select {
				case <-quit:
					return
				default:
				}
				data := pattern(i, sizes[i%len(sizes)])
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				got, err := echo(ctx, c, data, dst)
				cancel()
				if err == nil && !bytes.Equal(got, data) {
					err = fmt.Errorf("echo of %d bytes came back different", len(data))
				}
				if err != nil {
					errs <- err
					return
				}
				calls.Add(1)
			}
		}()
	}
	return func() {
		t.Helper()
		close(quit)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("well-behaved client: %v", err)
		}
		if calls.Load() == 0 {
			t.Errorf("well-behaved client made no calls")
		}
	}
}

// rawClient speaks the transport by hand over a fabric connection.
type rawClient struct {
	ep   *fabric.Endpoint
	conn *fabric.Conn
	msgs chan []byte // copies of the messages received

	mu        sync.Mutex
	closedErr error
	badPacket bool // a multi-packet message arrived
}

func (r *rawClient) HandlePacket(p *fabric.Packet) {
	if !p.First() || !p.Last() {
		r.mu.Lock()
		r.badPacket = true
		r.mu.Unlock()
	}
	m := append([]byte(nil), p.Data...)
	p.Release()
	select {
	case r.msgs <- m:
	default:
		r.mu.Lock()
		r.badPacket = true // more than the test expects
		r.mu.Unlock()
	}
}

func (r *rawClient) Closed(c *fabric.Conn, err error) {
	r.mu.Lock()
	r.closedErr = err
	r.mu.Unlock()
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	ep, err := fabric.NewEndpoint(fabric.Options{MTU: DefaultBufSize, Quota: DefaultBufCount})
	if err != nil {
		t.Fatal(err)
	}
	r := &rawClient{ep: ep, msgs: make(chan []byte, 256)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r.conn, err = ep.Dial(ctx, addr, r); err != nil {
		ep.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return r
}

func (r *rawClient) send(msg []byte) error { return r.conn.SendPacket(r.conn.NewID(), msg, nil) }

// next waits for the next message; nil if none comes in d or the
// connection ends without one.
func (r *rawClient) next(d time.Duration) []byte {
	select {
	case m := <-r.msgs:
		return m
	case <-time.After(d):
		return nil
	case <-r.conn.Done():
		select {
		case m := <-r.msgs:
			return m
		case <-time.After(100 * time.Millisecond):
			return nil
		}
	}
}

// closedWithin reports whether the connection ends within d.
func (r *rawClient) closedWithin(d time.Duration) bool {
	select {
	case <-r.conn.Done():
		return true
	case <-time.After(d):
		return false
	}
}

// reply is a decoded reply message.
type reply struct {
	h    header
	body []byte
	err  error // oncrpc.ReadReply's
	rd   *xdr.Reader
}

func decodeReply(t testing.TB, m []byte) reply {
	t.Helper()
	var rep reply
	if err := parseHeader(m, &rep.h, MaxChunk, 2*MaxChunk); err != nil || rep.h.proc != procMsg {
		t.Fatalf("bad message from the server: %v (proc %d)", err, rep.h.proc)
	}
	rep.body = rep.h.body
	if len(rep.body) >= 4 && binary.BigEndian.Uint32(rep.body) != rep.h.xid {
		t.Fatalf("transport xid %#x, RPC xid %#x", rep.h.xid, binary.BigEndian.Uint32(rep.body))
	}
	rep.rd = xdr.NewReader(rep.body)
	rep.err = oncrpc.ReadReply(rep.rd)
	return rep
}

// callMsg is a MSG carrying an RPC call of the test program.
func callMsg(xid, proc uint32, refs []chunkRef, args []byte) []byte {
	b := appendHeader(nil, xid, refs)
	w := xdr.Writer{B: b}
	oncrpc.AppendCall(&w, xid, testProg, testVers, proc, nil)
	return append(w.B, args...)
}

// callHeaderLen is the size of an AUTH_NONE call header.
const callHeaderLen = 40

// replyHeaderLen is the size of an accepted reply header.
const replyHeaderLen = 24

func words(v ...uint32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.BigEndian.AppendUint32(b, x)
	}
	return b
}

func isGarbage(err error) bool {
	var ae *oncrpc.AcceptError
	return errors.As(err, &ae) && ae.Stat == oncrpc.GarbageArgs
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

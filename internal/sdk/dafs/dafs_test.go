package dafs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/sdk/dafs"
)

const testChunk = 1 << 20 // small chunks: reads cross chunk boundaries and spread over nodes

func tmpDir(tb testing.TB) string {
	tb.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "sluice-dafs-")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return tb.TempDir()
}

// fixture is a real in-process cluster (meta and three nodes on
// loopback), a client, and a file of random bytes written through it.
type fixture struct {
	c    *cluster.Cluster
	cl   *sdk.Client
	f    *sdk.File
	data []byte
}

func newFixture(tb testing.TB, size int) *fixture {
	tb.Helper()
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(tb), Nodes: 3, MetaListen: "127.0.0.1:0", ChunkSize: testChunk})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	conf, err := c.Conf()
	if err != nil {
		tb.Fatal(err)
	}
	cl, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cl.Close() })
	ctx := context.Background()
	f, err := cl.Create(ctx, "/data", 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if _, err := f.WriteAtContext(ctx, data, 0); err != nil {
		tb.Fatal(err)
	}
	return &fixture{c: c, cl: cl, f: f, data: data}
}

func waitAll(t *testing.T, s *dafs.Session, n int) []dafs.Completion {
	t.Helper()
	var out []dafs.Completion
	for len(out) < n {
		cs, err := s.Wait(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, cs...)
	}
	return out
}

// TestBatchedRandomReads: 64 random 4 KiB reads (some block-aligned, some
// not, some across a chunk boundary) submitted at once come back with the
// bytes written, in far fewer requests than reads (one per node a Submit
// touches).
func TestBatchedRandomReads(t *testing.T) {
	fx := newFixture(t, 4*testChunk)
	s := dafs.New(fx.cl, dafs.Options{})
	defer s.Close()
	const n, size = 64, 4 << 10
	buf, err := s.Register(make([]byte, n*size))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 3 {
		ops := make([]*dafs.Op, n)
		for i := range ops {
			off := rng.Int64N(int64(len(fx.data) - size))
			switch i % 3 {
			case 0:
				off = off / 16384 * 16384 // aligned to the nodes' default block
			case 1:
				off = testChunk*(1+int64(i)%3) - 100 // across a chunk boundary
			}
			ops[i] = dafs.ReadAsync(fx.f, off, buf, i*size, size)
		}
		if err := s.Submit(context.Background(), ops...); err != nil {
			t.Fatal(err)
		}
		cs := waitAll(t, s, n)
		seen := map[*dafs.Op]bool{}
		for i, c := range cs {
			if seen[c.Op] {
				t.Fatalf("round %d: op completed twice", round)
			}
			seen[c.Op] = true
			if c.Err != nil || c.N != size {
				t.Fatalf("round %d op %d: %d bytes, %v", round, i, c.N, c.Err)
			}
			op := c.Op
			if got := buf.Bytes()[op.BufOff : op.BufOff+op.Len]; !bytes.Equal(got, fx.data[op.Off:op.Off+int64(op.Len)]) {
				t.Fatalf("round %d op %d at %d: wrong bytes", round, i, op.Off)
			}
		}
	}
	st := s.Stats()
	if st.Singles != 0 || st.Reads < 3*n || st.Requests > 3*6 {
		t.Fatalf("batching: %+v", st)
	}
	t.Logf("%+v", st)
}

// TestOrderWithinARequest: reads that one node serves in one request
// complete together, in the order they were submitted (here the file is
// one chunk, so every read goes to one node in one request).
func TestOrderWithinARequest(t *testing.T) {
	fx := newFixture(t, 512<<10)
	s := dafs.New(fx.cl, dafs.Options{})
	defer s.Close()
	buf, err := s.Register(make([]byte, 32*4096))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var ops []*dafs.Op
	for i := range 32 {
		ops = append(ops, dafs.ReadAsync(fx.f, rng.Int64N(int64(len(fx.data)-4096)), buf, i*4096, 4096))
	}
	if err := s.Submit(context.Background(), ops...); err != nil {
		t.Fatal(err)
	}
	cs, err := s.Wait(context.Background(), len(ops))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		if c.Op != ops[i] || c.Err != nil {
			t.Fatalf("completion %d is op %v (%v), want op %d", i, c.Op.Tag, c.Err, i)
		}
	}
	if st := s.Stats(); st.Requests != 1 {
		t.Fatalf("32 reads of one chunk took %d requests", st.Requests)
	}
}

// TestDirectPlacement: reads aligned to the nodes' blocks land in the
// registered buffer itself (no staging copy) once the block size is
// known, and still carry the written bytes.
func TestDirectPlacement(t *testing.T) {
	fx := newFixture(t, 2*testChunk)
	s := dafs.New(fx.cl, dafs.Options{})
	defer s.Close()
	const bs = 16 << 10 // the store's default block
	buf, err := s.Register(make([]byte, 8*bs))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var ops []*dafs.Op
		for i := range 8 {
			ops = append(ops, dafs.ReadAsync(fx.f, int64(i*5+1)*bs, buf, i*bs, bs))
		}
		if err := s.Submit(context.Background(), ops...); err != nil {
			t.Fatal(err)
		}
		for _, c := range waitAll(t, s, len(ops)) {
			if c.Err != nil || !bytes.Equal(buf.Bytes()[c.Op.BufOff:c.Op.BufOff+bs], fx.data[c.Op.Off:c.Op.Off+bs]) {
				t.Fatalf("op at %d: %v or wrong bytes", c.Op.Off, c.Err)
			}
		}
	}
	if st := s.Stats(); st.Direct == 0 {
		t.Fatalf("no read was placed directly: %+v", st)
	}
}

// TestPerOpErrorsAndEOF: a read past the end of the file completes with
// io.EOF (and a read straddling it short, with io.EOF) while the others
// in the same Submit succeed; writes go through and read back.
func TestPerOpErrorsAndEOF(t *testing.T) {
	fx := newFixture(t, testChunk+5000)
	s := dafs.New(fx.cl, dafs.Options{})
	defer s.Close()
	buf, err := s.Register(make([]byte, 4*4096))
	if err != nil {
		t.Fatal(err)
	}
	size := int64(len(fx.data))
	ops := []*dafs.Op{
		dafs.ReadAsync(fx.f, 0, buf, 0, 4096),
		dafs.ReadAsync(fx.f, size+10, buf, 4096, 4096),
		dafs.ReadAsync(fx.f, size-1000, buf, 8192, 4096),
	}
	if err := s.Submit(context.Background(), ops...); err != nil {
		t.Fatal(err)
	}
	byOp := map[*dafs.Op]dafs.Completion{}
	for _, c := range waitAll(t, s, 3) {
		byOp[c.Op] = c
	}
	cs := []dafs.Completion{byOp[ops[0]], byOp[ops[1]], byOp[ops[2]]}
	if cs[0].Err != nil || !bytes.Equal(buf.Bytes()[:4096], fx.data[:4096]) {
		t.Fatalf("op 0: %v", cs[0].Err)
	}
	if cs[1].N != 0 || !errors.Is(cs[1].Err, io.EOF) {
		t.Fatalf("read past EOF: %d, %v", cs[1].N, cs[1].Err)
	}
	if cs[2].N != 1000 || !errors.Is(cs[2].Err, io.EOF) || !bytes.Equal(buf.Bytes()[8192:9192], fx.data[size-1000:]) {
		t.Fatalf("read across EOF: %d, %v", cs[2].N, cs[2].Err)
	}

	// Writes, then reads of what they wrote.
	copy(buf.Bytes()[12288:], bytes.Repeat([]byte("w"), 4096))
	if err := s.Submit(context.Background(), dafs.WriteAsync(fx.f, 100, buf, 12288, 4096)); err != nil {
		t.Fatal(err)
	}
	if c := waitAll(t, s, 1)[0]; c.Err != nil || c.N != 4096 {
		t.Fatalf("write: %d, %v", c.N, c.Err)
	}
	if err := s.Submit(context.Background(), dafs.ReadAsync(fx.f, 100, buf, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if c := waitAll(t, s, 1)[0]; c.Err != nil || !bytes.Equal(buf.Bytes()[:4096], bytes.Repeat([]byte("w"), 4096)) {
		t.Fatalf("read after write: %v", c.Err)
	}
}

// TestQueueSemantics: Poll never blocks, Wait for more than is
// outstanding fails at once, a Submit with one bad op starts none, the
// queue depth bounds what is outstanding, and a cancelled context
// completes the ops with its error.
func TestQueueSemantics(t *testing.T) {
	fx := newFixture(t, 64<<10)
	s := dafs.New(fx.cl, dafs.Options{Depth: 4})
	defer s.Close()
	buf, err := s.Register(make([]byte, 16<<10))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if n := s.Poll(make([]dafs.Completion, 4)); n != 0 {
		t.Fatalf("Poll on an empty queue: %d", n)
	}
	if _, err := s.Wait(ctx, 1); err == nil {
		t.Fatal("Wait with nothing outstanding returned")
	}
	good := dafs.ReadAsync(fx.f, 0, buf, 0, 4096)
	bad := dafs.ReadAsync(fx.f, 0, buf, 14<<10, 4096) // past the buffer's end
	if err := s.Submit(ctx, good, bad); err == nil {
		t.Fatal("an op past its buffer was accepted")
	}
	if err := s.Submit(ctx, make([]*dafs.Op, 0)...); err != nil {
		t.Fatal(err)
	}
	var five []*dafs.Op
	for i := range 5 {
		five = append(five, dafs.ReadAsync(fx.f, int64(i)*4096, buf, 0, 4096))
	}
	if err := s.Submit(ctx, five...); !errors.Is(err, dafs.ErrQueueFull) {
		t.Fatalf("5 ops on a queue of 4: %v", err)
	}
	if err := s.Submit(ctx, five[:4]...); err != nil {
		t.Fatal(err)
	}
	if err := s.Submit(ctx, five[4]); !errors.Is(err, dafs.ErrQueueFull) {
		t.Fatalf("a fifth op while 4 are outstanding: %v", err)
	}
	// Poll until all four are reaped (each Poll returns at once).
	got := 0
	for got < 4 {
		cs, err := s.Wait(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		got += len(cs)
		got += s.Poll(make([]dafs.Completion, 4))
	}
	if n := s.Poll(make([]dafs.Completion, 4)); n != 0 {
		t.Fatalf("%d completions after all were reaped", n)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Submit(cancelled, dafs.ReadAsync(fx.f, 0, buf, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if c := waitAll(t, s, 1)[0]; !errors.Is(c.Err, context.Canceled) {
		t.Fatalf("op under a cancelled context: %v", c.Err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	wcancel()
	if err := s.Submit(ctx, dafs.ReadAsync(fx.f, 0, buf, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(wctx, 1); !errors.Is(err, context.Canceled) {
		// The op may have completed already; then Wait returned it.
		if err != nil {
			t.Fatalf("Wait under a cancelled context: %v", err)
		}
	} else {
		waitAll(t, s, 1)
	}
}

// TestDeregisterWaitsForOpsInFlight: Deregister refuses new ops on the
// buffer at once and returns only when no op in flight uses it, so every
// op submitted before has completed by then; afterwards the buffer is
// refused.
func TestDeregisterWaitsForOpsInFlight(t *testing.T) {
	fx := newFixture(t, 4*testChunk)
	s := dafs.New(fx.cl, dafs.Options{})
	defer s.Close()
	const n = 128
	buf, err := s.Register(make([]byte, n*4096))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for round := range 4 {
		for i := range n {
			if err := s.Submit(ctx, dafs.ReadAsync(fx.f, int64(i)*8192, buf, i*4096, 4096)); err != nil {
				t.Fatal(err)
			}
		}
		if round < 3 {
			waitAll(t, s, n)
			continue
		}
		if err := s.Deregister(ctx, buf); err != nil {
			t.Fatal(err)
		}
		if got := s.Poll(make([]dafs.Completion, n)); got != n {
			t.Fatalf("Deregister returned with %d of %d ops completed", got, n)
		}
	}
	if err := s.Submit(ctx, dafs.ReadAsync(fx.f, 0, buf, 0, 4096)); !errors.Is(err, dafs.ErrDeregistered) {
		t.Fatalf("op on a deregistered buffer: %v", err)
	}
	if err := s.Deregister(ctx, buf); !errors.Is(err, dafs.ErrDeregistered) {
		t.Fatalf("second Deregister: %v", err)
	}
}

// TestNodeDownBatchesFallBack: with a node down, the pieces batched to
// it fail as a whole and are read again one by one from the other
// replicas: every read still completes with the bytes written.
func TestNodeDownBatchesFallBack(t *testing.T) {
	fx := newFixture(t, 4*testChunk) // replicas 3: every node holds every chunk
	fx.c.Nodes[0].Close()
	s := dafs.New(fx.cl, dafs.Options{})
	defer s.Close()
	const n = 64
	buf, err := s.Register(make([]byte, n*4096))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 9))
	var ops []*dafs.Op
	for i := range n {
		ops = append(ops, dafs.ReadAsync(fx.f, rng.Int64N(int64(len(fx.data)-4096)), buf, i*4096, 4096))
	}
	if err := s.Submit(context.Background(), ops...); err != nil {
		t.Fatal(err)
	}
	for _, c := range waitAll(t, s, n) {
		op := c.Op
		if c.Err != nil || !bytes.Equal(buf.Bytes()[op.BufOff:op.BufOff+4096], fx.data[op.Off:op.Off+4096]) {
			t.Fatalf("read at %d with a node down: %v", op.Off, c.Err)
		}
	}
	if st := s.Stats(); st.Singles == 0 {
		t.Logf("no piece was bound for the stopped node: %+v", st)
	}
}

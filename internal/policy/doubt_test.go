package policy_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/policy"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// doubtNode is one storage node's data path with configurable Deps.
type doubtNode struct {
	pol   *policy.Policies
	st    *store.Store
	dir   string
	addr  string
	close func() // shuts the node down in a node's order (idempotent)
}

func startDoubtNode(t *testing.T, id ids.NodeID, key capability.Key, tweak func(*policy.Deps)) *doubtNode {
	return startDoubtNodeWith(t, id, key, tweak, engine.Options{})
}

func startDoubtNodeWith(t *testing.T, id ids.NodeID, key capability.Key, tweak func(*policy.Deps), eopts engine.Options) *doubtNode {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(store.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := fabric.NewEndpoint(fabric.Options{})
	fwd, _ := fabric.NewEndpoint(fabric.Options{})
	pool := fabric.NewPool(fwd, 4)
	d := policy.Deps{
		Self: func() ids.NodeID { return id }, Keys: capability.NewKeyring(key), Store: st,
		Forward: pool, ForwardQuota: ep.Options().Quota, ReplyTimeout: 5 * time.Second,
	}
	if tweak != nil {
		tweak(&d)
	}
	pol := policy.New(d)
	eng, err := engine.New(eopts, pol.Contexts()...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ep.Listen("127.0.0.1:0", eng)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	n := &doubtNode{pol: pol, st: st, dir: dir, addr: a.String(), close: func() {
		once.Do(func() {
			ep.Close()
			pool.Close()
			fwd.Close()
			eng.Close()
			if err := pol.Close(10 * time.Second); err != nil {
				t.Error(err)
			}
			st.Close()
		})
	}}
	t.Cleanup(n.close)
	return n
}

type doubtEnv struct {
	lastVersion uint64
	nodes       []*doubtNode
	keys        *capability.Keyring
	pool        *fabric.Pool
}

func newDoubtEnv(t *testing.T, n int, tweak func(*policy.Deps)) *doubtEnv {
	return newDoubtEnvWith(t, n, tweak, engine.Options{})
}

func newDoubtEnvWith(t *testing.T, n int, tweak func(*policy.Deps), eopts engine.Options) *doubtEnv {
	key, _ := capability.GenerateKey(1)
	e := &doubtEnv{keys: capability.NewKeyring(key)}
	for i := 0; i < n; i++ {
		e.nodes = append(e.nodes, startDoubtNodeWith(t, ids.NodeID(i+1), key, tweak, eopts))
	}
	ep, _ := fabric.NewEndpoint(fabric.Options{})
	t.Cleanup(func() { ep.Close() })
	e.pool = fabric.NewPool(ep, 8)
	return e
}

func (e *doubtEnv) capFor(chunk ids.ChunkID) []byte {
	return e.capFanout(chunk, plan.FanoutNodes)
}

// flatCap is a capability for a client-replicated (flat) file.
func (e *doubtEnv) flatCap(chunk ids.ChunkID) []byte {
	return e.capFanout(chunk, plan.FanoutClient)
}

func (e *doubtEnv) capFanout(chunk ids.ChunkID, f plan.Fanout) []byte {
	return e.capFor3(chunk, f, 1)
}

func (e *doubtEnv) capFor3(chunk ids.ChunkID, f plan.Fanout, client ids.ClientID) []byte {
	c := capability.Capability{Rights: capability.Write | capability.Read, Fanout: f, Client: client, Ino: 1, Chunk: chunk, Len: 64 << 20,
		Expiry: time.Now().Add(time.Minute).UnixNano()}
	var list []ids.NodeID
	for i := range e.nodes {
		list = append(list, ids.NodeID(i+1))
	}
	c.SetReplicas(list)
	return e.keys.Mint(&c)
}

func (e *doubtEnv) addrs() []string {
	var out []string
	for _, n := range e.nodes {
		out = append(out, n.addr)
	}
	return out
}

// send sends a whole write to node `to` and returns its reply.
func (e *doubtEnv) send(t *testing.T, to int, h wire.WriteHeader, data []byte) (wire.Status, string, uint64) {
	t.Helper()
	hdr, err := wire.AppendWrite(nil, &h, e.addrs())
	if err != nil {
		t.Fatal(err)
	}
	s, msg := e.sendRaw(t, to, hdr, data)
	return s, msg, e.lastVersion
}

// sendRaw sends an encoded header and data to node `to` and returns its
// reply's status and text (and records its version in lastVersion).
func (e *doubtEnv) sendRaw(t *testing.T, to int, hdr, data []byte) (wire.Status, string) {
	t.Helper()
	r := wait(t, e.sendAsync(t, to, hdr, data))
	e.lastVersion = r.version
	return r.status, r.msg
}

type asyncReply struct {
	status  wire.Status
	msg     string
	version uint64
}

// sendAsync sends a message to node `to` and delivers its reply later
// (status 255: connection closed, 254: unparsable, 253: no reply).
func (e *doubtEnv) sendAsync(t *testing.T, to int, hdr, data []byte) <-chan asyncReply {
	t.Helper()
	pc, err := e.pool.Get(context.Background(), e.nodes[to].addr)
	if err != nil {
		t.Fatal(err)
	}
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	var parts [][]byte
	if len(data) > 0 {
		parts = [][]byte{data}
	}
	if err := pc.Send(id, hdr, parts...); err != nil {
		t.Fatal(err)
	}
	out := make(chan asyncReply, 1)
	go func() {
		select {
		case p, ok := <-ch:
			if !ok {
				pc.Close()
				out <- asyncReply{status: 255, msg: "connection closed"}
				return
			}
			var r wire.Reply
			if err := wire.ParseReply(p.Data, &r); err != nil {
				p.Release()
				pc.Close()
				out <- asyncReply{status: 254, msg: err.Error()}
				return
			}
			rep := asyncReply{status: r.Status, msg: string(r.Msg), version: r.Version}
			p.Release()
			e.pool.Put(pc)
			out <- rep
		case <-time.After(20 * time.Second):
			pc.Close()
			out <- asyncReply{status: 253, msg: "no reply"}
		}
	}()
	return out
}

func wait(t *testing.T, ch <-chan asyncReply) asyncReply {
	t.Helper()
	return <-ch
}

func readChunk(t *testing.T, st *store.Store, id ids.ChunkID) (store.Info, []byte) {
	t.Helper()
	rd, err := st.OpenRead(id)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	info := rd.Info()
	data := make([]byte, info.Length)
	rd.ReadAt(data, 0)
	return info, data
}

// assertNoSameVersionDivergence fails if two replicas report the same
// committed version of chunk but hold different bytes: the version check
// ("stale") cannot see that, and reads return different data depending
// on the replica they reach.
func assertNoSameVersionDivergence(t *testing.T, e *doubtEnv, chunk ids.ChunkID) {
	t.Helper()
	type cp struct {
		info store.Info
		data []byte
	}
	var cps []cp
	for _, n := range e.nodes {
		info, data := readChunk(t, n.st, chunk)
		cps = append(cps, cp{info, data})
	}
	for i := range cps {
		for j := i + 1; j < len(cps); j++ {
			if cps[i].info.Version == cps[j].info.Version && cps[i].info.Version != 0 && !bytes.Equal(cps[i].data, cps[j].data) {
				t.Fatalf("replicas rank %d and rank %d are both at version %d of chunk %v with different bytes (%q vs %q, tags %x vs %x)",
					i, j, cps[i].info.Version, chunk, cps[i].data[:min(8, len(cps[i].data))], cps[j].data[:min(8, len(cps[j].data))],
					cps[i].info.Tag, cps[j].info.Tag)
			}
		}
	}
}

// TestTreeBusySiblingLeavesDoubt: a tree write whose rank 1 is busy while
// rank 2 commits leaves rank 2 one version ahead, so rank 0 holds the
// write in doubt. Another writer's write that does not cover it is
// refused busy (giving it the same version would leave rank 1 and rank 2
// at one version with different bytes); one that covers it skips the
// doubtful version and every replica ends identical.
func TestTreeBusySiblingLeavesDoubt(t *testing.T) {
	e := newDoubtEnv(t, 3, nil)
	var chunk ids.ChunkID
	var cp []byte
	// Rank 1 is busy with the chunk (e.g. still aborting a previous write).
	// Usually rank 2 gets all of A before rank 1's refusal reaches rank 0,
	// and commits it; on a loaded machine the refusal can come first and
	// nothing is committed (no doubt). Try until the first case happens.
	for try := 0; ; try++ {
		chunk = ids.ChunkID(70 + 1000*try)
		cp = e.capFor(chunk)
		held, err := e.nodes[1].st.BeginWrite(chunk, 0, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		a := bytes.Repeat([]byte("A"), 4000)
		s, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: uint64(len(a)), Cap: cp, WriteID: 0xA}, a)
		if s != wire.StatusBusy {
			t.Fatalf("write A through a busy rank 1: %v %s", s, msg)
		}
		held.Abort()
		if d, ok := e.nodes[0].st.Doubt(chunk); ok {
			if d.Version != 1 || d.Tag != 0xA {
				t.Fatalf("rank 0's doubt for A: %+v", d)
			}
			waitFor(t, func() bool { info, _ := e.nodes[2].st.Stat(chunk); return info.Version == 1 })
			break
		}
		if try == 10 {
			t.Fatal("rank 1's refusal always came before the last packet")
		}
	}
	// Another writer, inside A's range.
	b := bytes.Repeat([]byte("B"), 1000)
	s, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Off: 1000, Len: uint64(len(b)), Cap: cp, WriteID: 0xB}, b)
	if s != wire.StatusBusy || !strings.Contains(msg, "unresolved write") {
		t.Fatalf("write inside an unresolved one: %v %s", s, msg)
	}
	assertNoSameVersionDivergence(t, e, chunk)
	// A write covering A: version 2 everywhere, whatever each replica had.
	c := bytes.Repeat([]byte("C"), 5000)
	s, msg, v := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: uint64(len(c)), Cap: cp, WriteID: 0xC}, c)
	if s != wire.StatusOK || v != 2 {
		t.Fatalf("covering write: %v %s v%d", s, msg, v)
	}
	assertIdentical(t, e, chunk, 2, c)
	if _, ok := e.nodes[0].st.Doubt(chunk); ok {
		t.Fatal("doubt left after a covering write")
	}
}

// TestTreeRetryResolvesDoubt: the same write retried gets the doubtful
// version back: rank 2, which has it, answers "already applied"; rank 1
// applies it.
func TestTreeRetryResolvesDoubt(t *testing.T) {
	e := newDoubtEnv(t, 3, nil)
	const chunk = 74
	cp := e.capFor(chunk)
	held, err := e.nodes[1].st.BeginWrite(chunk, 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	a := bytes.Repeat([]byte("A"), 4000)
	h := wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Off: 100, Len: uint64(len(a)), Cap: cp, WriteID: 0xA}
	if s, msg, _ := e.send(t, 0, h, a); s != wire.StatusBusy {
		t.Fatalf("write A through a busy rank 1: %v %s", s, msg)
	}
	held.Abort()
	// Whether rank 2 got the whole write depends on when rank 1's refusal
	// reached rank 0: if it did (the usual case), rank 0 records a doubt;
	// if the refusal came first, rank 0 stopped before the last packet
	// and nothing was committed anywhere. The retry resolves either.
	if _, ok := e.nodes[0].st.Doubt(chunk); !ok {
		t.Log("rank 1's refusal came before the last packet: no doubt to resolve")
	}
	for try := 0; ; try++ {
		s, msg, v := e.send(t, 0, h, a)
		if s == wire.StatusOK && v == 1 {
			break
		}
		if s != wire.StatusBusy || try == 50 { // busy: the failed write still settling
			t.Fatalf("retry: %v %s v%d", s, msg, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
	assertIdentical(t, e, chunk, 1, append(make([]byte, 100), a...))
	if _, ok := e.nodes[0].st.Doubt(chunk); ok {
		t.Fatal("doubt left after the retry")
	}
}

// TestTreeRetryWithEarlyAlreadyApplied: rank 2 already has the write (it
// committed while its sibling was busy). The retry of a multi-packet
// write reaches rank 2, which answers "already applied" from its header
// handler, before rank 0 has forwarded the data: rank 0 takes that early
// OK as success, not as a refusal.
func TestTreeRetryWithEarlyAlreadyApplied(t *testing.T) {
	e := newDoubtEnv(t, 3, nil)
	const chunk = 71
	cp := e.capFor(chunk)
	data := bytes.Repeat([]byte("retry me"), 1<<20) // 8 MiB: 128 packets
	w, err := e.nodes[2].st.BeginWrite(chunk, 0, int64(len(data)), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Place(0, data); err != nil {
		t.Fatal(err)
	}
	w.SetTag(0xC)
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	s, msg, v := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: uint64(len(data)), Cap: cp, WriteID: 0xC}, data)
	if s != wire.StatusOK {
		t.Fatalf("retry of a write rank 2 already applied: %v %s", s, msg)
	}
	if v != 1 {
		t.Fatalf("retry committed as v%d", v)
	}
	assertIdentical(t, e, chunk, 1, data)
}

// TestFlatExpiredReservationLeavesDoubt: a flat writer reserves version 1
// at rank 0 and writes rank 1, but its data for rank 0 arrives after the
// reservation expired. Rank 0 must not hand version 1 to the next writer
// (rank 1 would refuse it stale while rank 0 accepts it): the next
// reservation skips it, and the replicas end identical.
func TestFlatExpiredReservationLeavesDoubt(t *testing.T) {
	e := newDoubtEnv(t, 2, func(d *policy.Deps) { d.ReserveTimeout = 200 * time.Millisecond })
	const chunk = 72
	cp := e.flatCap(chunk)
	a := bytes.Repeat([]byte("A"), 1000)
	b := bytes.Repeat([]byte("B"), 1000)
	res := wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: chunk, Len: 1000, Cap: cp, WriteID: 0xA}
	s, msg, v := e.send(t, 0, res, nil)
	if s != wire.StatusOK || v != 1 {
		t.Fatalf("reserve A: %v %s v%d", s, msg, v)
	}
	if s, msg, _ := e.send(t, 1, wire.WriteHeader{Strategy: plan.Flat, Rank: 1, Chunk: chunk, Len: 1000, Version: 1, Cap: cp, WriteID: 0xA}, a); s != wire.StatusOK {
		t.Fatalf("A at rank 1: %v %s", s, msg)
	}
	time.Sleep(500 * time.Millisecond) // A's data for rank 0 is late
	if s, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Flat, Chunk: chunk, Len: 1000, Version: 1, Cap: cp, WriteID: 0xA}, a); s == wire.StatusOK {
		t.Fatalf("A at rank 0 after expiry succeeded: %s", msg)
	}
	// Writer B covers A: it is given version 2, skipping 1.
	res.WriteID = 0xB
	s, msg, v = e.send(t, 0, res, nil)
	if s != wire.StatusOK || v != 2 {
		t.Fatalf("reserve B: %v %s v%d", s, msg, v)
	}
	for rank := range 2 {
		h := wire.WriteHeader{Strategy: plan.Flat, Rank: uint8(rank), Chunk: chunk, Len: 1000, Version: 2, Flags: wire.FlagBase, Base: 0, Cap: cp, WriteID: 0xB}
		if s, msg, _ := e.send(t, rank, h, b); s != wire.StatusOK {
			t.Fatalf("B at rank %d: %v %s", rank, s, msg)
		}
	}
	assertIdentical(t, e, chunk, 2, b)
}

// TestHostBudgetNeedsCapability: host mode charges its buffer to the
// node-wide budget only for a request with a valid capability, so a peer
// without one cannot pin the budget and starve authenticated writes.
func TestHostBudgetNeedsCapability(t *testing.T) {
	e := newDoubtEnv(t, 1, func(d *policy.Deps) { d.HostBuffer = 1 << 20 })
	const chunk = 73
	forged := e.capFor(chunk)
	forged[len(forged)-1] ^= 1
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Mode: plan.Host, Chunk: chunk, Len: 1 << 20, Cap: forged}, e.addrs())
	pc, err := e.pool.Get(context.Background(), e.nodes[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pc.Begin(pc.NewID(), hdr, false)
	if err != nil {
		t.Fatal(err)
	}
	mw.Write(make([]byte, 1000), false)
	mw.Flush()
	time.Sleep(100 * time.Millisecond)
	data := bytes.Repeat([]byte("L"), 4096)
	s, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Ring, Mode: plan.Host, Chunk: chunk + 1, Len: uint64(len(data)), Cap: e.capFor(chunk + 1)}, data)
	mw.Abort(nil)
	if s != wire.StatusOK {
		t.Fatalf("authenticated host write while an unauthenticated peer holds a request open: %v %s", s, msg)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// assertIdentical fails unless every replica holds chunk at version with
// exactly want.
func assertIdentical(t *testing.T, e *doubtEnv, chunk ids.ChunkID, version uint64, want []byte) {
	t.Helper()
	for i, n := range e.nodes {
		info, data := readChunk(t, n.st, chunk)
		if info.Version != version || !bytes.Equal(data, want) {
			t.Fatalf("rank %d: version %d, %d bytes (%q...), want version %d, %d bytes", i, info.Version, len(data), data[:min(8, len(data))], version, len(want))
		}
	}
}

// TestReservationWithData: a version reservation carrying data packets is
// refused, and neither holds the chunk nor leaves a doubt: the next
// reservation gets the same version.
func TestReservationWithData(t *testing.T) {
	e := newDoubtEnv(t, 2, nil)
	const chunk = 75
	cp := e.flatCap(chunk)
	res := wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: chunk, Len: 1000, Cap: cp, WriteID: 0xA}
	if s, msg, _ := e.send(t, 0, res, make([]byte, 1000)); s != wire.StatusBadRequest {
		t.Fatalf("reservation with data: %v %s", s, msg)
	}
	res.WriteID = 0xB
	for try := 0; ; try++ {
		// Busy while the refused request's cleanup still holds the chunk.
		s, msg, v := e.send(t, 0, res, nil)
		if s == wire.StatusOK && v == 1 {
			break
		}
		if s != wire.StatusBusy || try == 50 {
			t.Fatalf("next reservation: %v %s v%d", s, msg, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, ok := e.nodes[0].st.Doubt(chunk); ok {
		t.Fatal("a refused reservation left a doubt")
	}
}

// TestShutdownRecordsReservations: a node shut down while a flat
// reservation is outstanding records it as a doubt before its store
// closes, so after a restart the reserved version is not handed to
// another writer (the reserving client may have written the other
// replicas with it).
func TestShutdownRecordsReservations(t *testing.T) {
	e := newDoubtEnv(t, 2, nil)
	const chunk = 76
	res := wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: chunk, Off: 10, Len: 1000, Cap: e.flatCap(chunk), WriteID: 0xA}
	if s, msg, v := e.send(t, 0, res, nil); s != wire.StatusOK || v != 1 {
		t.Fatalf("reserve: %v %s v%d", s, msg, v)
	}
	e.nodes[0].close()
	st, err := store.Open(store.Options{Dir: e.nodes[0].dir})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if d, ok := st.Doubt(chunk); !ok || d.Version != 1 || d.Tag != 0xA || d.Off != 10 || d.End != 1010 {
		t.Fatalf("doubt after restart: %+v %v", d, ok)
	}
}

// TestAbortInDoubtAfterStoreClose: a doubt that comes too late for a
// closed store is an error, not a crash.
func TestAbortInDoubtAfterStoreClose(t *testing.T) {
	st, err := store.Open(store.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.BeginHead(7, 0, 100, 0xA)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := w.AbortInDoubt(); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("AbortInDoubt after Close: %v", err)
	}
}

// TestReservationsPerClient: one client cannot hold every reservation a
// node has: past its share it is refused busy while others still reserve.
func TestReservationsPerClient(t *testing.T) {
	e := newDoubtEnv(t, 1, nil)
	reserve := func(chunk ids.ChunkID, client ids.ClientID) (wire.Status, string) {
		s, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: chunk, Len: 10,
			Cap: e.capFor3(chunk, plan.FanoutClient, client), WriteID: uint64(chunk)}, nil)
		return s, msg
	}
	var chunk ids.ChunkID = 1000
	for ; ; chunk++ {
		s, msg := reserve(chunk, 1)
		if s == wire.StatusBusy {
			if chunk-1000 < 8 || !strings.Contains(msg, "reservations") {
				t.Fatalf("refused after %d reservations: %s", chunk-1000, msg)
			}
			t.Logf("client 1 refused after %d reservations: %s", chunk-1000, msg)
			break
		}
		if s != wire.StatusOK || chunk-1000 > 2000 {
			t.Fatalf("reservation %d: %v %s", chunk-1000, s, msg)
		}
	}
	if s, msg := reserve(chunk+1, 2); s != wire.StatusOK {
		t.Fatalf("another client: %v %s", s, msg)
	}
}

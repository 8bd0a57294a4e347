package policy_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/policy"
	"github.com/sluicefs/sluice/internal/wire"
)

// ecCap is a capability for an erasure-coded group: the env's nodes, the
// first k of them data units.
func (e *doubtEnv) ecCap(chunk ids.ChunkID, k int) []byte {
	c := capability.Capability{Rights: capability.Write | capability.Read, Fanout: plan.FanoutEC, Data: uint8(k), Client: 1, Ino: 1,
		Chunk: chunk, Len: 64 << 20, Expiry: time.Now().Add(time.Minute).UnixNano()}
	var list []ids.NodeID
	for i := range e.nodes {
		list = append(list, ids.NodeID(i+1))
	}
	c.SetReplicas(list)
	return e.keys.Mint(&c)
}

// partialHdr is data unit src's partial-parity header for parity unit
// rank, sealed as that unit's node would (seal: false leaves it unsealed).
func (e *doubtEnv) partialHdr(t *testing.T, chunk ids.ChunkID, cp []byte, rank, src uint8, version, n uint64, seal bool) []byte {
	t.Helper()
	h := wire.WriteHeader{Strategy: plan.EC, Rank: src, Chunk: chunk, Len: n, Version: version, WriteID: 77, Cap: cp}
	hdr, err := wire.AppendWrite(nil, &h, e.addrs())
	if err != nil {
		t.Fatal(err)
	}
	var p wire.WriteHeader
	if err := wire.ParseWrite(hdr, &p); err != nil {
		t.Fatal(err)
	}
	out := wire.AppendPartial(nil, &p, rank, src, version, version-1)
	if seal {
		out = wire.SealForward(out, e.keys.Seal)
	}
	return out
}

// TestECBadInput: the node refuses what an erasure-coded write must not
// do, with a clear error and nothing committed.
func TestECBadInput(t *testing.T) {
	e := newDoubtEnv(t, 3, func(d *policy.Deps) { d.ReserveTimeout, d.JoinTimeout = 500*time.Millisecond, 500*time.Millisecond })
	const chunk ids.ChunkID = 300
	cp := e.ecCap(chunk, 2) // RS(2,1): units 0, 1 data, 2 parity
	data := bytes.Repeat([]byte{7}, 5000)
	cases := []struct {
		name string
		to   int
		hdr  []byte
		want wire.Status
		text string
	}{
		{"partial parity from a client (unsealed)", 2, e.partialHdr(t, chunk, cp, 2, 0, 1, 5000, false), wire.StatusAuth, "only from a data unit's node"},
		{"partial parity sent to a data unit", 1, e.partialHdr(t, chunk, cp, 1, 0, 1, 5000, true), wire.StatusBadRequest, "is a data unit"},
		{"partial parity from a parity unit", 2, e.partialHdr(t, chunk, cp, 2, 2, 1, 5000, true), wire.StatusBadRequest, "not a data unit"},
		{"partial parity for a stripe version the unit has not reached", 2, e.partialHdr(t, chunk, cp, 2, 0, 5, 5000, true), wire.StatusBusy, "must wait for 4"},
	}
	enc := wire.WriteHeader{Strategy: plan.EC, Flags: wire.FlagEncode, Rank: 2, Chunk: chunk, Len: 5000, Version: 1, WriteID: 9, Cap: cp}
	encHdr, _ := wire.AppendWrite(nil, &enc, e.addrs())
	cases = append(cases, struct {
		name string
		to   int
		hdr  []byte
		want wire.Status
		text string
	}{"a parity unit asked to encode", 2, encHdr, wire.StatusBadRequest, "not a data unit"})
	ring := wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Len: 5000, WriteID: 9, Cap: cp}
	ringHdr, _ := wire.AppendWrite(nil, &ring, e.addrs())
	cases = append(cases, struct {
		name string
		to   int
		hdr  []byte
		want wire.Status
		text string
	}{"a ring write to an erasure-coded group", 0, ringHdr, wire.StatusAuth, "erasure-coded"})
	for _, c := range cases {
		st, msg := e.sendRaw(t, c.to, c.hdr, data)
		if st != c.want || !strings.Contains(msg, c.text) {
			t.Errorf("%s: %v %q, want %v %q", c.name, st, msg, c.want, c.text)
		}
	}
	// A partial parity arriving twice is refused and counted once: the
	// parity is p0 ^ p1, not p0 ^ p0 ^ p1.
	p0, p1 := bytes.Repeat([]byte{0x0f}, 5000), bytes.Repeat([]byte{0x33}, 5000)
	first := e.sendAsync(t, 2, e.partialHdr(t, chunk, cp, 2, 0, 1, 5000, true), p0)
	time.Sleep(50 * time.Millisecond) // the first one joins before the second
	if r := wait(t, e.sendAsync(t, 2, e.partialHdr(t, chunk, cp, 2, 0, 1, 5000, true), p0)); r.status != wire.StatusBadRequest || !strings.Contains(r.msg, "arrived twice") {
		t.Fatalf("duplicate partial parity: %v %q", r.status, r.msg)
	}
	second := e.sendAsync(t, 2, e.partialHdr(t, chunk, cp, 2, 1, 1, 5000, true), p1)
	for _, ch := range []<-chan asyncReply{first, second} {
		if r := wait(t, ch); r.status != wire.StatusOK {
			t.Fatalf("aggregation: %v %q", r.status, r.msg)
		}
	}
	info, got := readChunk(t, e.nodes[2].st, chunk)
	want := bytes.Repeat([]byte{0x0f ^ 0x33}, 5000)
	if info.Version != 1 || !bytes.Equal(got, want) {
		t.Fatalf("aggregated parity: version %d, equal %v", info.Version, bytes.Equal(got, want))
	}
	// Only one data unit's partial ever comes: the aggregation gives up
	// after the reservation timeout and commits nothing.
	lone := wait(t, e.sendAsync(t, 2, e.partialHdr(t, chunk, cp, 2, 0, 2, 5000, true), p0))
	if lone.status == wire.StatusOK || !strings.Contains(lone.msg, "arrived within") {
		t.Fatalf("lone partial parity: %v %q", lone.status, lone.msg)
	}
	if info, _ := readChunk(t, e.nodes[2].st, chunk); info.Version != 1 {
		t.Fatalf("a failed aggregation committed: %+v", info)
	}
}

// TestECAccumulatorFallback: with a one-slot accumulator pool, parity
// aggregation falls back to host memory instead of failing, and the
// stored parity is still the XOR of every data unit's partial.
func TestECAccumulatorFallback(t *testing.T) {
	e := newDoubtEnv(t, 4, func(d *policy.Deps) { d.Accumulators = 1 })
	const chunk ids.ChunkID = 301
	cp := e.ecCap(chunk, 3)
	const n = 1 << 20
	rng := rand.New(rand.NewPCG(1, 1))
	parts := make([][]byte, 3)
	want := make([]byte, n)
	for i := range parts {
		parts[i] = make([]byte, n)
		for j := range parts[i] {
			parts[i][j] = byte(rng.Uint32())
		}
		erasure.XOR(want, parts[i])
	}
	var chs []<-chan asyncReply
	for i := range parts {
		chs = append(chs, e.sendAsync(t, 3, e.partialHdr(t, chunk, cp, 3, uint8(i), 1, n, true), parts[i]))
	}
	for _, ch := range chs {
		if r := wait(t, ch); r.status != wire.StatusOK {
			t.Fatalf("aggregation: %v %q", r.status, r.msg)
		}
	}
	if _, got := readChunk(t, e.nodes[3].st, chunk); !bytes.Equal(got, want) {
		t.Fatal("parity differs from the XOR of the partials")
	}
	st := e.nodes[3].pol.Stats()
	if st.ParityFallbacks == 0 || st.ParityBytes != 3*n {
		t.Fatalf("stats %+v: want fallbacks and %d bytes", st, 3*n)
	}
	t.Logf("%+v", st)
}

// TestECShortPartialFreesSlots: a partial parity shorter than its header
// (sent straight to the parity unit, or made so by a client sending a
// data unit too few bytes) fails the aggregation and gives its
// accumulator slots back: the next aggregation needs no fallback.
func TestECShortPartialFreesSlots(t *testing.T) {
	// A data unit that fails before its partial reaches the parity unit
	// leaves the aggregation waiting for it until the join timeout.
	e := newDoubtEnv(t, 3, func(d *policy.Deps) {
		d.Accumulators, d.ReserveTimeout, d.JoinTimeout = 1, 500*time.Millisecond, 500*time.Millisecond
	})
	const chunk ids.ChunkID = 900
	cp := e.ecCap(chunk, 2)
	p0, p1 := bytes.Repeat([]byte{1}, 5000), bytes.Repeat([]byte{2}, 5000)
	a := e.sendAsync(t, 2, e.partialHdr(t, chunk, cp, 2, 0, 1, 5000, true), p0)
	b := e.sendAsync(t, 2, e.partialHdr(t, chunk, cp, 2, 1, 1, 5000, true), p1[:4000])
	if ra, rb := wait(t, a), wait(t, b); ra.status == wire.StatusOK || rb.status == wire.StatusOK {
		t.Fatalf("short partial parity accepted: %v %q / %v %q", ra.status, ra.msg, rb.status, rb.msg)
	}
	// Through the data units: unit 1 gets fewer bytes than declared.
	const chunk2 ids.ChunkID = 901
	cp2 := e.ecCap(chunk2, 2)
	write := func(short bool, id uint64) []asyncReply {
		res := wire.WriteHeader{Strategy: plan.EC, Flags: wire.FlagReserve, Chunk: chunk2, Len: 5000, WriteID: id, Cap: cp2}
		st, msg, ver := e.send(t, 0, res, nil)
		if st != wire.StatusOK {
			t.Fatalf("reserve: %v %q", st, msg)
		}
		var chs []<-chan asyncReply
		for r := 0; r < 2; r++ {
			h := wire.WriteHeader{Strategy: plan.EC, Flags: wire.FlagEncode, Rank: uint8(r), Chunk: chunk2, Len: 5000, Version: ver, WriteID: id, Cap: cp2}
			if ver > 1 {
				h.Flags |= wire.FlagBase
				h.Base = 0
			}
			hdr, _ := wire.AppendWrite(nil, &h, e.addrs())
			data := bytes.Repeat([]byte{byte(r + 1)}, 5000)
			if short && r == 1 {
				data = data[:4000]
			}
			chs = append(chs, e.sendAsync(t, r, hdr, data))
		}
		return []asyncReply{wait(t, chs[0]), wait(t, chs[1])}
	}
	if rs := write(true, 5); rs[0].status == wire.StatusOK || rs[1].status == wire.StatusOK {
		t.Fatalf("short data unit write accepted: %+v", rs)
	}
	before := e.nodes[2].pol.Stats().ParityFallbacks
	for try := 0; ; try++ { // the failed write's abort may still be settling: busy
		rs := write(false, 6)
		if rs[0].status == wire.StatusOK && rs[1].status == wire.StatusOK {
			break
		}
		if try == 40 || rs[0].status != wire.StatusBusy && rs[1].status != wire.StatusBusy {
			t.Fatalf("good write after a short one: %+v", rs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if after := e.nodes[2].pol.Stats().ParityFallbacks; after != before {
		t.Fatalf("a failed aggregation kept its slot: %d fallbacks after, %d before", after, before)
	}
}

// TestHeaderOnlyWriteFails: a write whose header declares data but whose
// message ends with the header is refused promptly, for an EC data unit
// and for a ring head, and leaves the chunk writable.
func TestHeaderOnlyWriteFails(t *testing.T) {
	e := newDoubtEnv(t, 3, func(d *policy.Deps) { d.ReplyTimeout = 3 * time.Second })
	const ecChunk, ringChunk ids.ChunkID = 920, 921
	cases := []struct {
		to int
		h  wire.WriteHeader
	}{
		{1, wire.WriteHeader{Strategy: plan.EC, Flags: wire.FlagEncode, Rank: 1, Chunk: ecChunk, Len: 5000, Version: 1, WriteID: 5, Cap: e.ecCap(ecChunk, 2)}},
		{0, wire.WriteHeader{Strategy: plan.Ring, Chunk: ringChunk, Len: 5000, WriteID: 5, Cap: e.capFor(ringChunk)}},
	}
	for _, c := range cases {
		hdr, _ := wire.AppendWrite(nil, &c.h, e.addrs())
		start := time.Now()
		r := wait(t, e.sendAsync(t, c.to, hdr, nil))
		if r.status == wire.StatusOK || time.Since(start) > 10*time.Second {
			t.Fatalf("%v header-only write with Len 5000: %v %q after %s", c.h.Strategy, r.status, r.msg, time.Since(start))
		}
		h := c.h
		h.Flags, h.WriteID = 0, 6
		hdr, _ = wire.AppendWrite(nil, &h, e.addrs())
		if c.h.Strategy == plan.EC {
			continue // its parity aggregation is gone; the unit itself is free (checked below)
		}
		if r := wait(t, e.sendAsync(t, c.to, hdr, make([]byte, 5000))); r.status != wire.StatusOK {
			t.Fatalf("%v write after a header-only one: %v %q", c.h.Strategy, r.status, r.msg)
		}
	}
	if err := e.nodes[1].st.Delete(ecChunk); err != nil {
		t.Fatalf("EC data unit still locked by the header-only write: %v", err)
	}
}

// stuckHandler never releases a packet: its connection's quota runs out
// and the sender is back-pressured, as by a slow replica.
type stuckHandler struct{}

func (stuckHandler) HandlePacket(p *fabric.Packet)    {}
func (stuckHandler) Closed(c *fabric.Conn, err error) {}

// TestEncodeDoesNotBlockWorker: a data unit whose parity unit stops
// reading does not block its node's (only) handler worker: other requests
// are still served at once.
func TestEncodeDoesNotBlockWorker(t *testing.T) {
	e := newDoubtEnvWith(t, 3, nil, engine.Options{Workers: 1})
	slow, _ := fabric.NewEndpoint(fabric.Options{})
	t.Cleanup(func() { slow.Close() })
	sa, err := slow.Listen("127.0.0.1:0", stuckHandler{})
	if err != nil {
		t.Fatal(err)
	}
	const chunk ids.ChunkID = 910
	addrs := e.addrs()
	addrs[2] = sa.String() // the parity unit: stuck
	h := wire.WriteHeader{Strategy: plan.EC, Flags: wire.FlagEncode, Rank: 1, Chunk: chunk, Len: 32 << 20, Version: 1, WriteID: 5, Cap: e.ecCap(chunk, 2)}
	hdr, _ := wire.AppendWrite(nil, &h, addrs)
	go func() {
		pc, err := e.pool.Get(context.Background(), e.nodes[1].addr)
		if err != nil {
			return
		}
		id := pc.NewID()
		pc.Replies.Expect(id)
		pc.Send(id, hdr, bytes.Repeat([]byte{3}, 32<<20))
	}()
	time.Sleep(time.Second)
	start := time.Now()
	other := wire.WriteHeader{Strategy: plan.Ring, Chunk: 911, Len: 10, WriteID: 6, Cap: e.capFor(911)}
	ohdr, _ := wire.AppendWrite(nil, &other, e.addrs())
	r := wait(t, e.sendAsync(t, 1, ohdr, []byte("0123456789")))
	if time.Since(start) > 2*time.Second {
		t.Fatalf("an unrelated request waited %s (%v %q): the worker was blocked", time.Since(start), r.status, r.msg)
	}
}

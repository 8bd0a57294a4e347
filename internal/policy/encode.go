package policy

import (
	"sync"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// encodeWrites is the context of an erasure-coded data unit that encodes
// as the data streams in (FlagEncode, stream mode; see ec.go): a streamed
// write with no children whose every packet, once placed, is multiplied
// into one partial parity per parity unit and sent to it at once.
type encodeWrites struct{ *writer }

func (x encodeWrites) header(r *engine.Request, hdr []byte) error {
	h, c, kids, err := x.admitStream(hdr)
	if err != nil {
		return err
	}
	code, units, err := x.encodeTargets(&h, &c)
	if err != nil {
		return err
	}
	st := &encodeState{streamState: streamState{stored: storedOf(&h)}}
	if err := x.openStream(&st.streamState, &h, &c, kids); err != nil {
		return err
	}
	x.startEncode(st, &h, code, units)
	r.State = st
	return nil
}

func (encodeWrites) direct(state any, off int64, n int) []byte {
	return state.(*encodeState).direct(off, n)
}

func (encodeWrites) directDone(state any) { state.(*encodeState).w.DirectEnd() }

func (x encodeWrites) payload(r *engine.Request, p *fabric.Packet) error {
	st := r.State.(*encodeState)
	if err := x.place(&st.streamState, p); err != nil {
		return err
	}
	return x.encodePacket(st, p)
}

func (x encodeWrites) completion(r *engine.Request) {
	st := r.State.(*encodeState)
	x.background(func() { x.finish(r, &st.streamState) })
}

func (x encodeWrites) cleanup(r *engine.Request, reason error) {
	x.cleanupStream(&r.State.(*encodeState).streamState, reason)
}

// encodeTargets resolves what a data unit needs to send partial
// parities — the code and the parity units' addresses — before it takes
// its reservation or opens its write, so a retryable refusal here (a
// parity unit not yet in the cluster map) leaves both for the retry.
func (x *writer) encodeTargets(h *wire.WriteHeader, c *capability.Capability) (*erasure.Code, []child, error) {
	k := int(c.Data)
	code, err := x.ecCode(k, int(c.NReplicas))
	if err != nil {
		return nil, nil, err
	}
	parity := make([]int, 0, code.M)
	for rank := k; rank < int(c.NReplicas); rank++ {
		parity = append(parity, rank)
	}
	units, err := x.resolve(h, c, parity, "parity unit")
	if err != nil {
		return nil, nil, err
	}
	return code, units, nil
}

// startEncode makes a data unit's write send its partial parities: a
// forward to each parity unit, fed per packet by the payload handler.
func (x *writer) startEncode(st *encodeState, h *wire.WriteHeader, code *erasure.Code, units []child) {
	st.code, st.src, st.shards = code, int(h.Rank), make([][]byte, 1+code.M)
	for _, u := range units {
		st.fwds = append(st.fwds, startForward(x.d, u.node, u.addr, u.rank, x.partialHeader(h, u, st.w), h.Len == 0))
	}
}

// outBuf is a computed buffer a forward sends (a partial parity packet).
// It holds a reference to the packet it was computed from, so the inbound
// connection's quota still bounds what the forwards hold, and a forward's
// queue (sized to that quota) never fills: the worker never blocks.
type outBuf struct {
	data []byte
	last bool
	src  *fabric.Packet
	pool *outBufs
}

func (b *outBuf) release() {
	b.pool.bufs.put(b.data)
	b.data = nil
	if b.src != nil {
		b.src.Release()
		b.src = nil
	}
	b.pool.structs.Put(b)
}

// outBufs pools partial-parity buffers, so the per-packet path does not
// allocate.
type outBufs struct {
	structs sync.Pool
	bufs    bufPools
}

func (o *outBufs) get(n int, last bool) *outBuf {
	b, _ := o.structs.Get().(*outBuf)
	if b == nil {
		b = &outBuf{pool: o}
	}
	b.data, b.last = o.bufs.get(n), last
	return b
}

// encodeState is a data unit's streamed write and its encoder.
type encodeState struct {
	streamState
	code   *erasure.Code
	src    int
	shards [][]byte // scratch: the packet, then one output per parity unit
}

// ecCode returns RS(k, n-k), the code of an erasure-coded write's capability.
func (x *writer) ecCode(k, n int) (*erasure.Code, error) {
	code, err := x.codes.Get(k, n-k)
	if err != nil {
		return nil, wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	return code, nil
}

// partialHeader is the sealed header of this data unit's partial parity
// for parity unit k.
func (x *writer) partialHeader(h *wire.WriteHeader, k child, w *store.Write) []byte {
	return wire.SealForward(wire.AppendPartial(nil, h, uint8(k.rank), h.Rank, w.Version(), w.Base()), x.d.Keys.Seal)
}

// encodePacket computes a data packet's partial parities and hands one to
// each parity unit's forward.
func (x *writer) encodePacket(e *encodeState, p *fabric.Packet) error {
	e.shards[0] = p.Data
	bufs := [erasure.MaxUnits]*outBuf{}
	for i := range e.fwds {
		bufs[i] = x.outBufs.get(len(p.Data), p.Last())
		p.Retain()
		bufs[i].src = p
		e.shards[1+i] = bufs[i].data
	}
	err := e.code.Partial(e.src, e.shards)
	for i, f := range e.fwds {
		if err != nil {
			bufs[i].release()
			continue
		}
		f.pushBuf(bufs[i])
	}
	clear(e.shards)
	if err != nil {
		return wire.Errorf(wire.StatusIO, "computing partial parity: %v", err)
	}
	return nil
}

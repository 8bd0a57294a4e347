package policy

import (
	"errors"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/wire"
)

// A batched read (wire.ParseBatch; seed 004's DAFS batch I/O) is N reads
// in one request, each placed with one-sided WRITEs into its window of
// the requester's registered memory, answered by one reply with N
// statuses. Each read is authorised exactly as a single read is, on its
// own: a descriptor its capability does not cover (or whose capability
// does not open) is refused with StatusAuth in its slot while the others
// are served, since none of them lends the refused one anything. A header
// that does not parse, or a batch over the node's bounds, is refused
// whole. The reads are served one after another in one read slot with
// one buffer, by the single read's code (openSpan, place).
type batchState struct {
	descs []wire.BatchRead
	// refused[i] is why descriptor i is not served (nil: it is).
	refused []error
}

// batchContext is the batched read execution context, matched on the
// read header's kind byte.
func (x *reader) batchContext() *engine.Context {
	return &engine.Context{Name: "read-batch", Class: wire.OpRead,
		Match:    []engine.Field{{At: readScaledAt, Mask: 0xff, Value: wire.ReadKindBatch}},
		Handlers: engine.Handlers{Header: x.batchHeader, Completion: x.batchCompletion}}
}

func (x *reader) batchHeader(r *engine.Request, hdr []byte) error {
	var h wire.BatchHeader
	if err := wire.ParseBatch(hdr, &h); err != nil {
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	st := &batchState{descs: make([]wire.BatchRead, h.Len()), refused: make([]error, h.Len())}
	caps := make([]capability.Capability, h.Caps())
	capErr := make([]error, h.Caps())
	now := x.d.Now()
	h.EachCap(func(j int, b []byte) {
		if _, err := x.d.Keys.Open(b, now, &caps[j]); err != nil {
			capErr[j] = err
		}
	})
	bs := uint64(x.d.Store.BlockSize())
	blocks := make([]int, h.Len())
	var total uint64
	self := x.d.Self()
	for i := range st.descs {
		d := h.At(i)
		st.descs[i] = d
		total += uint64(d.Len)
		// Len > 0 and Off+Len does not overflow (ParseBatch), so nor does
		// this.
		nb := (d.Off+uint64(d.Len)-1)/bs - d.Off/bs + 1
		blocks[i] = int(nb)
		c := &caps[d.Cap]
		switch {
		case capErr[d.Cap] != nil:
			st.refused[i] = wire.Errorf(wire.StatusAuth, "%v", capErr[d.Cap])
		case c.Allows(capability.Read, d.Chunk, d.Off, uint64(d.Len)) != nil:
			st.refused[i] = wire.Errorf(wire.StatusAuth, "%v", c.Allows(capability.Read, d.Chunk, d.Off, uint64(d.Len)))
		case c.RankOf(self) < 0:
			st.refused[i] = wire.Errorf(wire.StatusAuth, "node %v holds no replica of chunk %v", self, d.Chunk)
		case nb*bs > uint64(d.Window):
			// The client learns the block size from the reply and asks
			// again with a window that holds whole blocks.
			st.refused[i] = wire.Errorf(wire.StatusBadRequest, "read needs a window of %d bytes (blocks of %d), has %d", nb*bs, bs, d.Window)
		}
	}
	if total > uint64(x.d.MaxReadLen) {
		return wire.Errorf(wire.StatusBadRequest, "batch of %d bytes, at most %d", total, x.d.MaxReadLen)
	}
	if size := wire.BatchReplySize(blocks); size > r.Conn.MTU() {
		return wire.Errorf(wire.StatusBadRequest, "the answer to this batch (%d bytes) would not fit a packet at MTU %d", size, r.Conn.MTU())
	}
	r.State = st
	return nil
}

func (x *reader) batchCompletion(r *engine.Request) { go x.serveBatch(r) }

// serveBatch serves every admitted read of a batch in turn and answers
// with each one's outcome.
func (x *reader) serveBatch(r *engine.Request) {
	x.slots <- struct{}{}
	defer func() { <-x.slots }()
	st := r.State.(*batchState)
	bp := x.bufs.Get().(*[]byte)
	defer x.bufs.Put(bp)
	bs := x.d.Store.BlockSize()
	reply := wire.AppendBatchReply(nil, len(st.descs))
	var crcs []uint32
	for i, d := range st.descs {
		err := st.refused[i]
		if err == nil {
			var sp span
			if sp, err = x.openSpan(d.Chunk, d.Off, uint64(d.Len), crcs[:0], *bp); err == nil {
				crcs = sp.crcs
				if err = x.place(r, &sp, d.RegionKey, d.RegionOff, *bp); err == nil {
					rep := sp.reply(bs)
					reply = wire.AppendBatchEntry(reply, &rep, sp.crcs, "")
					continue
				}
			}
		}
		rep := wire.Reply{Status: wire.StatusOf(err), BlockSize: uint32(bs)}
		msg := err.Error()
		var we *wire.Error
		if errors.As(err, &we) {
			msg = we.Msg
		}
		reply = wire.AppendBatchEntry(reply, &rep, nil, msg)
	}
	r.Finish(reply)
}

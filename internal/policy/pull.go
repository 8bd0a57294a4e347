package policy

import (
	"context"

	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/wire"
)

// Pull mode is seed 000's "RPC+RDMA" protocol (and NFS over RDMA's WRITE):
// the client sends only the request, naming a region of its memory that
// holds the data; the node validates it (header handler), then pulls the
// data with one-sided READs — straight into the chunk file's mapped pages
// where it can — and acknowledges. One more round trip than streaming,
// no copy through the message stream.

// pullWrites is the pulled write context (ModePull).
type pullWrites struct{ *writer }

// pullState is a pulled write: its store write and the client's region.
type pullState struct {
	stored
	key, off uint64
}

func (x pullWrites) header(r *engine.Request, hdr []byte) error {
	h, c, err := x.admitWrite(hdr)
	if err != nil {
		return err
	}
	if reply, ok := x.alreadyApplied(&h); ok {
		return &engine.Answered{Reply: reply}
	}
	w, err := x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID)
	if err != nil {
		return storeError(err)
	}
	if err := planned(w, c.Epoch); err != nil {
		return err
	}
	st := &pullState{stored: storedOf(&h), key: h.RegionKey, off: h.RegionOff}
	st.w, st.head = w, true
	r.State = st
	return nil
}

func (pullWrites) payload(r *engine.Request, p *fabric.Packet) error {
	if err := inBounds(p, r.State.(*pullState).length); err != nil {
		return err
	}
	return wire.Errorf(wire.StatusBadRequest, "a pulled write carries no data packets")
}

func (x pullWrites) completion(r *engine.Request) {
	st := r.State.(*pullState)
	x.background(func() { x.pullFinish(r, st) })
}

// cleanup: a single replica, so nothing can have committed elsewhere.
func (pullWrites) cleanup(r *engine.Request, reason error) { r.State.(*pullState).w.Abort() }

// pullPiece is the most one READ asks for.
const pullPiece = 1 << 20

func (x pullWrites) pullFinish(r *engine.Request, st *pullState) {
	// A single replica: nothing can have committed elsewhere.
	r.Finish(x.publish(&st.stored, x.pullData(r, st), false))
}

func (x pullWrites) pullData(r *engine.Request, st *pullState) error {
	ctx, cancel := context.WithTimeout(context.Background(), x.d.ReplyTimeout)
	defer cancel()
	var buf []byte
	for pos := int64(0); pos < st.length; {
		n := min(pullPiece, st.length-pos)
		at := st.chunkOff + pos
		dst := st.w.DirectBegin(at, int(n))
		direct := dst != nil
		if !direct {
			if buf == nil {
				buf = make([]byte, min(pullPiece, st.length))
			}
			dst = buf[:n]
		}
		err := r.Conn.Read(ctx, st.key, st.off+uint64(pos), dst)
		if direct {
			st.w.DirectEnd()
		}
		if err != nil {
			return wire.Errorf(wire.StatusBadRequest, "pulling the data from the client: %v", err)
		}
		if err := st.w.Place(at, dst); err != nil {
			return storeError(err)
		}
		pos += n
	}
	if err := st.w.Sync(); err != nil {
		return storeError(err)
	}
	return nil
}

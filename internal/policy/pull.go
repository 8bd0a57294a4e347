package policy

import (
	"context"

	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/wire"
)

// Pull mode is seed 000's "RPC+RDMA" protocol (and NFS over RDMA's WRITE):
// the client sends only the request, naming a region of its memory that
// holds the data; the node validates it (header handler), then pulls the
// data with one-sided READs — straight into the chunk file's mapped pages
// where it can — and acknowledges. One more round trip than streaming,
// no copy through the message stream.

type pullState struct {
	key, off uint64
}

func (x *writer) pullHeader(st *writeState, h *wire.WriteHeader, epoch uint64) error {
	if reply, ok := x.alreadyApplied(h); ok {
		return &engine.Answered{Reply: reply}
	}
	w, err := x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID)
	if err != nil {
		return storeError(err)
	}
	if err := planned(w, epoch); err != nil {
		return err
	}
	st.w, st.head = w, true
	st.pull = &pullState{key: h.RegionKey, off: h.RegionOff}
	return nil
}

// pullPiece is the most one READ asks for.
const pullPiece = 1 << 20

func (x *writer) pullFinish(r *engine.Request, st *writeState) {
	// A single replica: nothing can have committed elsewhere.
	r.Finish(x.publish(st, x.pullData(r, st), false))
}

func (x *writer) pullData(r *engine.Request, st *writeState) error {
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
		err := r.Conn.Read(ctx, st.pull.key, st.pull.off+uint64(pos), dst)
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

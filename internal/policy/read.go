package policy

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// readPiece is how much of a read is staged in memory at once.
const readPiece = 1 << 20

// reader is the read execution context. The header handler authenticates;
// the data is served from the host side (it needs the disk and may block
// on a slow client): block-aligned, with the stored checksum of every
// block in the reply so the client verifies what it got — the node never
// vouches for bytes it did not check end to end.
type reader struct {
	d     *Deps
	slots chan struct{}
	bufs  sync.Pool // of *[]byte, readPiece bytes
	codes *erasure.Codes
}

type readState struct {
	h   wire.ReadHeader // Cap cleared after the header handler
	cap capability.Capability
}

func newReader(d *Deps) *reader {
	return &reader{d: d, slots: make(chan struct{}, d.ReadSlots),
		bufs: sync.Pool{New: func() any { b := make([]byte, readPiece); return &b }}}
}

// readScaledAt is where a read header says it is scaled
// (wire.AppendRead's layout): the byte the read contexts match on.
const readScaledAt = 1

// contexts are the read execution contexts: a survivor's partial decoding
// for a rebuild (a scaled read), a batch of reads (read_batch.go) and,
// taking the rest, a plain read. All authenticate alike; they differ in
// how they serve.
func (x *reader) contexts() []*engine.Context {
	return []*engine.Context{
		{Name: "read-scaled", Class: wire.OpRead, Match: []engine.Field{{At: readScaledAt, Mask: 0xff, Value: 1}},
			Handlers: engine.Handlers{Header: x.header, Completion: x.scaledCompletion}},
		x.batchContext(),
		{Name: "read", Class: wire.OpRead, Handlers: engine.Handlers{Header: x.header, Completion: x.completion}},
	}
}

func (x *reader) header(r *engine.Request, hdr []byte) error {
	st := &readState{}
	h := &st.h
	if err := wire.ParseRead(hdr, h); err != nil {
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	if _, err := x.d.Keys.Open(h.Cap, x.d.Now(), &st.cap); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	if err := st.cap.Allows(capability.Read, h.Chunk, h.Off, h.Len); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	if st.cap.RankOf(x.d.Self()) < 0 {
		return wire.Errorf(wire.StatusAuth, "node %v holds no replica of chunk %v", x.d.Self(), h.Chunk)
	}
	if h.Len > uint64(x.d.MaxReadLen) {
		return wire.Errorf(wire.StatusBadRequest, "read of %d bytes, at most %d", h.Len, x.d.MaxReadLen)
	}
	bs := uint64(x.d.Store.BlockSize())
	if blocks := (h.Off+h.Len+bs-1)/bs - h.Off/bs; blocks > uint64(wire.MaxReadBlocks(r.Conn.MTU())) {
		return wire.Errorf(wire.StatusBadRequest, "read spans %d blocks, at most %d fit a reply at MTU %d", blocks, wire.MaxReadBlocks(r.Conn.MTU()), r.Conn.MTU())
	}
	h.Cap = nil
	r.State = st
	return nil
}

func (x *reader) completion(r *engine.Request) {
	go x.serve(r, false)
}

func (x *reader) scaledCompletion(r *engine.Request) {
	go x.serve(r, true)
}

// serve serves a read (scaled or not) in a read slot and replies.
func (x *reader) serve(r *engine.Request, scaled bool) {
	x.slots <- struct{}{}
	defer func() { <-x.slots }()
	h := &r.State.(*readState).h
	var reply []byte
	var err error
	if scaled {
		reply, err = x.readScaled(r, h)
	} else {
		reply, err = x.read(r, h)
	}
	if err != nil {
		reply = wire.AppendError(nil, err)
	}
	r.Finish(reply)
}

// span is what a read of a chunk range serves: the whole blocks
// [start, end) holding it at one version (info), with their checksums.
type span struct {
	chunk      ids.ChunkID
	info       store.Info
	start, end int64
	crcs       []uint32
	first      []byte // the data from start, read by openSpan
}

// openSpan takes the view of [off, off+n) of chunk a read serves: the
// blocks, cut at the chunk's end, and their stored checksums (appended to
// crcs). A read past the chunk's end gets no data. The first piece of the
// data (as much as fits buf) is read under the same view, saving a small
// read its second look at the chunk; place and piece take it from there.
func (x *reader) openSpan(chunk ids.ChunkID, off, n uint64, crcs []uint32, buf []byte) (span, error) {
	rd, err := x.d.Store.OpenRead(chunk)
	if err != nil {
		return span{}, storeError(err)
	}
	defer rd.Close()
	sp := span{chunk: chunk, info: rd.Info()}
	bs := int64(x.d.Store.BlockSize())
	sp.start = int64(off) / bs * bs
	sp.end = max(min((int64(off+n)+bs-1)/bs*bs, sp.info.Length), sp.start)
	if nb := int((sp.end - sp.start + bs - 1) / bs); nb > 0 {
		if crcs, err = rd.Checksums(int(sp.start/bs), nb, crcs); err != nil {
			return span{}, storeError(err)
		}
		first := buf[:min(int64(len(buf)), sp.end-sp.start)]
		if _, err := rd.ReadAt(first, sp.start); err != nil && !errors.Is(err, io.EOF) {
			return span{}, wire.Errorf(wire.StatusIO, "reading chunk %v at %d: %v", chunk, sp.start, err)
		}
		sp.first = first
	}
	sp.crcs = crcs
	return sp, nil
}

// reply is the answer describing sp's data.
func (sp *span) reply(bs int) wire.Reply {
	return wire.Reply{Status: wire.StatusOK, Version: sp.info.Version, ChunkLen: uint64(sp.info.Length),
		DataOff: uint64(sp.start), DataLen: uint64(sp.end - sp.start), BlockSize: uint32(bs)}
}

// piece reads sp's bytes from pos, as many as fit buf, under a fresh view
// of the chunk that must still be at sp's version: a write committing
// mid-read ends the read with a retryable busy answer rather than mixing
// versions.
func (x *reader) piece(sp *span, buf []byte, pos int64) ([]byte, error) {
	if pos == sp.start && sp.first != nil {
		return sp.first, nil
	}
	n := min(int64(len(buf)), sp.end-pos)
	rd, err := x.d.Store.OpenRead(sp.chunk)
	if err != nil {
		return nil, storeError(err)
	}
	defer rd.Close()
	if rd.Info() != sp.info {
		return nil, wire.Errorf(wire.StatusBusy, "chunk %v changed during the read (version %d, now %d)", sp.chunk, sp.info.Version, rd.Info().Version)
	}
	if _, err := rd.ReadAt(buf[:n], pos); err != nil && !errors.Is(err, io.EOF) {
		return nil, wire.Errorf(wire.StatusIO, "reading chunk %v at %d: %v", sp.chunk, pos, err)
	}
	return buf[:n], nil
}

// place puts sp's data into the requester's region key from regionOff
// with one-sided WRITEs (direct placement, no copy through the message
// stream), piece by piece through buf. A reply sent afterwards on the
// same connection arrives after them.
func (x *reader) place(r *engine.Request, sp *span, key, regionOff uint64, buf []byte) error {
	for pos := sp.start; pos < sp.end; {
		b, err := x.piece(sp, buf, pos)
		if err != nil {
			return err
		}
		if err := r.Conn.Write(context.Background(), key, regionOff+uint64(pos-sp.start), b, false); err != nil {
			return wire.Errorf(wire.StatusIO, "placing data in the client's region: %v", err)
		}
		pos += int64(len(b))
	}
	return nil
}

// read places the data and returns the reply (nil if the reply was sent
// inline with the data). The chunk's read view (a shared lock that
// commits wait for) is never held while sending: each piece is read under
// a view of its own (see piece). A client that stops reading therefore
// delays nobody but itself.
func (x *reader) read(r *engine.Request, h *wire.ReadHeader) ([]byte, error) {
	bp := x.bufs.Get().(*[]byte)
	defer x.bufs.Put(bp)
	buf := *bp
	sp, err := x.openSpan(h.Chunk, h.Off, h.Len, nil, buf)
	if err != nil {
		return nil, err
	}
	rep := sp.reply(x.d.Store.BlockSize())
	rep.Export = x.exportRefs(&sp, r.Conn, &r.State.(*readState).cap)
	reply := wire.AppendReply(nil, &rep, sp.crcs, "")
	if h.RegionKey != 0 {
		if err := x.place(r, &sp, h.RegionKey, h.RegionOff, buf); err != nil {
			return nil, err
		}
		return reply, nil
	}
	// Inline: the data follows the reply in the same message.
	mw, err := r.Conn.Begin(r.ID, reply, sp.end == sp.start)
	if err != nil {
		return nil, err
	}
	for pos := sp.start; pos < sp.end; {
		b, err := x.piece(&sp, buf, pos)
		if err != nil {
			mw.Abort(err) // the reply is already out: only closing can say so
			return nil, err
		}
		pos += int64(len(b))
		if err := mw.Write(b, pos == sp.end); err != nil {
			mw.Abort(err)
			return nil, err
		}
		if err := mw.Flush(); err != nil { // buf is reused for the next piece
			mw.Abort(err)
			return nil, err
		}
	}
	return nil, mw.Close()
}

// readScaled serves a survivor's partial decoding: the data, checked
// against the stored checksums here (a corrupt unit must not poison a
// rebuild), times the coefficient, with the product's own checksums so
// the rebuilder checks what arrived.
func (x *reader) readScaled(r *engine.Request, h *wire.ReadHeader) ([]byte, error) {
	bs := int64(x.d.Store.BlockSize())
	// The reply covers whole blocks: the span, not just Len, must fit the
	// buffers.
	if span := (int64(h.Off+h.Len)+bs-1)/bs*bs - int64(h.Off)/bs*bs; h.Len > readPiece || span > readPiece || h.RegionKey == 0 {
		return nil, wire.Errorf(wire.StatusBadRequest, "scaled reads place at most %d bytes (whole blocks) in a region, not [%d, +%d)", readPiece, h.Off, h.Len)
	}
	rd, err := x.d.Store.OpenRead(h.Chunk)
	if err != nil {
		return nil, storeError(err)
	}
	defer rd.Close()
	info := rd.Info()
	start := int64(h.Off) / bs * bs
	end := max(min((int64(h.Off+h.Len)+bs-1)/bs*bs, info.Length), start)
	nb := int((end - start + bs - 1) / bs)
	in, out := x.bufs.Get().(*[]byte), x.bufs.Get().(*[]byte)
	defer x.bufs.Put(in)
	defer x.bufs.Put(out)
	data, prod := (*in)[:end-start], (*out)[:end-start]
	crcs := make([]uint32, 0, nb)
	if nb > 0 {
		if crcs, err = rd.Checksums(int(start/bs), nb, crcs); err != nil {
			return nil, storeError(err)
		}
		if _, err := rd.ReadAt(data, start); err != nil && !errors.Is(err, io.EOF) {
			return nil, wire.Errorf(wire.StatusIO, "reading chunk %v at %d: %v", h.Chunk, start, err)
		}
	}
	var bad extent.List
	for i := range nb {
		b := data[int64(i)*bs : min(int64(i+1)*bs, end-start)]
		if crc32c.Checksum(b) != crcs[i] {
			bad = bad.Add(start+int64(i)*bs, int64(len(b)))
		}
	}
	if len(bad) > 0 {
		// The rebuilder takes these blocks from other units; meta has
		// this copy healed.
		x.d.Store.NoteCorrupt(h.Chunk, info.Version, bad)
		return nil, wire.Errorf(wire.StatusIO, "chunk %v fails its checksum in %v", h.Chunk, bad)
	}
	if err := x.codes.Multiply(h.Coef, data, prod); err != nil {
		return nil, wire.Errorf(wire.StatusIO, "%v", err)
	}
	for i := range nb {
		crcs[i] = crc32c.Checksum(prod[int64(i)*bs : min(int64(i+1)*bs, end-start)])
	}
	if len(prod) > 0 {
		if err := r.Conn.Write(context.Background(), h.RegionKey, h.RegionOff, prod, false); err != nil {
			return nil, wire.Errorf(wire.StatusIO, "placing data in the requester's region: %v", err)
		}
	}
	return wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length),
		DataOff: uint64(start), DataLen: uint64(end - start), BlockSize: uint32(bs)}, crcs, ""), nil
}

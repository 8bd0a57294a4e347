package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
)

// A batched read (seed 004's DAFS batch I/O: one RPC asks for N
// server-issued RDMAs) is a read request of kind ReadKindBatch: N
// descriptors, each a read of one chunk range placed by one-sided WRITEs
// into a window of the requester's registered memory, and a table of the
// capabilities they name (descriptors of one chunk share one). The node
// answers with one OpBatchReply carrying a reply per descriptor in order.
//
// Layout: op, kind, two zero bytes, n (u16), k (u16); n descriptors of
// batchDesc bytes; k capabilities, each a u16 length and its bytes. Every
// capability is named by some descriptor, so an encoding is canonical.

// ReadKindBatch is byte 1 of a batched read header (0 is a plain read,
// 1 a scaled one): the byte the node's batch context matches on.
const ReadKindBatch = 2

// OpBatchReply is the op of a batched read's answer (a whole batch
// refused comes back as a plain OpReply instead).
const OpBatchReply Op = 4

// Bounds of a batch: a node never parses or serves more.
const (
	MaxBatch      = 256
	MaxBatchBytes = 16 << 20 // sum of the descriptors' lengths
	// MaxBatchMsg bounds each reply's error text in a batch answer, so the
	// answer's size is known from the descriptors (BatchReplySize).
	MaxBatchMsg = 96
)

const (
	batchFixed = 8
	batchDesc  = 48
)

// BatchRead is one descriptor of a batched read: Len bytes at Off of
// Chunk, under capability Cap (an index into the header's table), placed
// from RegionOff of the region RegionKey. The node places whole blocks
// starting at the block holding Off and refuses the descriptor if they
// need more than Window bytes: the window bounds what it may write there.
type BatchRead struct {
	Chunk     ids.ChunkID
	Off       uint64
	Len       uint32
	Window    uint32
	RegionKey uint64
	RegionOff uint64
	Cap       uint16
}

// BatchHeader is a decoded batched read header; it aliases the packet.
type BatchHeader struct {
	descs []byte
	caps  []byte
	n, k  int
}

// Len is the number of descriptors.
func (h *BatchHeader) Len() int { return h.n }

// Caps is the number of capabilities.
func (h *BatchHeader) Caps() int { return h.k }

// At decodes descriptor i.
func (h *BatchHeader) At(i int) BatchRead {
	d := h.descs[i*batchDesc:]
	return BatchRead{
		Chunk:     ids.ChunkID(binary.LittleEndian.Uint64(d)),
		Off:       binary.LittleEndian.Uint64(d[8:]),
		Len:       binary.LittleEndian.Uint32(d[16:]),
		Window:    binary.LittleEndian.Uint32(d[20:]),
		RegionKey: binary.LittleEndian.Uint64(d[24:]),
		RegionOff: binary.LittleEndian.Uint64(d[32:]),
		Cap:       binary.LittleEndian.Uint16(d[40:]),
	}
}

// EachCap calls f with every capability in table order (aliasing the
// packet).
func (h *BatchHeader) EachCap(f func(j int, cap []byte)) {
	b := h.caps
	for j := 0; j < h.k; j++ {
		l := int(binary.LittleEndian.Uint16(b))
		f(j, b[2:2+l])
		b = b[2+l:]
	}
}

// AppendBatch encodes a batched read of descs under caps.
func AppendBatch(b []byte, descs []BatchRead, caps [][]byte) ([]byte, error) {
	if len(descs) == 0 || len(descs) > MaxBatch || len(caps) == 0 || len(caps) > len(descs) {
		return b, fmt.Errorf("wire: batch of %d reads under %d capabilities", len(descs), len(caps))
	}
	b = append(b, byte(OpRead), ReadKindBatch, 0, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(descs)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(caps)))
	for _, d := range descs {
		b = binary.LittleEndian.AppendUint64(b, uint64(d.Chunk))
		b = binary.LittleEndian.AppendUint64(b, d.Off)
		b = binary.LittleEndian.AppendUint32(b, d.Len)
		b = binary.LittleEndian.AppendUint32(b, d.Window)
		b = binary.LittleEndian.AppendUint64(b, d.RegionKey)
		b = binary.LittleEndian.AppendUint64(b, d.RegionOff)
		b = binary.LittleEndian.AppendUint16(b, d.Cap)
		b = append(b, 0, 0, 0, 0, 0, 0)
	}
	for _, c := range caps {
		if len(c) == 0 || len(c) > 0xffff {
			return b, fmt.Errorf("wire: capability of %d bytes", len(c))
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(c)))
		b = append(b, c...)
	}
	return b, nil
}

// ParseBatch decodes a batched read header; the whole packet must be the
// header. Every descriptor is checked on its own (a range, a window that
// holds it, a region, a capability that exists) and all together (count,
// total length, every capability named), so a handler may trust the
// shape of what it gets — but not the capabilities, which it opens.
func ParseBatch(b []byte, h *BatchHeader) error {
	if len(b) < batchFixed {
		return malformed("batch header of %d bytes, need %d", len(b), batchFixed)
	}
	if Op(b[0]) != OpRead || b[1] != ReadKindBatch {
		return malformed("op %d kind %d is not a batched read", b[0], b[1])
	}
	if b[2] != 0 || b[3] != 0 {
		return malformed("reserved bytes set")
	}
	n := int(binary.LittleEndian.Uint16(b[4:]))
	k := int(binary.LittleEndian.Uint16(b[6:]))
	if n == 0 || n > MaxBatch || k == 0 || k > n {
		return malformed("batch of %d reads under %d capabilities (at most %d reads)", n, k, MaxBatch)
	}
	if len(b)-batchFixed < n*batchDesc {
		return malformed("batch of %d reads truncated", n)
	}
	h.n, h.k = n, k
	h.descs = b[batchFixed : batchFixed+n*batchDesc]
	h.caps = b[batchFixed+n*batchDesc:]
	var total uint64
	var named [MaxBatch]bool
	for i := range n {
		d := h.At(i)
		raw := h.descs[i*batchDesc:]
		for _, z := range raw[42:batchDesc] {
			if z != 0 {
				return malformed("read %d: reserved bytes set", i)
			}
		}
		switch {
		case d.Len == 0:
			return malformed("read %d is empty", i)
		case d.Off+uint64(d.Len) < d.Off:
			return malformed("read %d: range overflows", i)
		case d.Window < d.Len:
			return malformed("read %d: window of %d bytes for %d", i, d.Window, d.Len)
		case d.RegionKey == 0:
			return malformed("read %d names no region", i)
		case d.RegionOff+uint64(d.Window) < d.RegionOff:
			return malformed("read %d: region window overflows", i)
		case int(d.Cap) >= k:
			return malformed("read %d names capability %d of %d", i, d.Cap, k)
		}
		named[d.Cap] = true
		total += uint64(d.Len)
	}
	if total > MaxBatchBytes {
		return malformed("batch of %d bytes, at most %d", total, MaxBatchBytes)
	}
	rest := h.caps
	for j := range k {
		if len(rest) < 2 {
			return malformed("capability %d missing", j)
		}
		l := int(binary.LittleEndian.Uint16(rest))
		if l == 0 || len(rest)-2 < l {
			return malformed("capability %d has bad length %d", j, l)
		}
		if !named[j] {
			return malformed("capability %d is named by no read", j)
		}
		rest = rest[2+l:]
	}
	if len(rest) != 0 {
		return malformed("%d trailing bytes", len(rest))
	}
	return nil
}

// BatchReplySize is the largest answer to a batch whose reads span
// blocks[i] checksum blocks each: what must fit one packet.
func BatchReplySize(blocks []int) int {
	n := 4
	for _, nb := range blocks {
		n += 4 + ReplySize(nb, MaxBatchMsg)
	}
	return n
}

// AppendBatchReply starts a batch answer of n replies; append each with
// AppendBatchEntry, in descriptor order.
func AppendBatchReply(b []byte, n int) []byte {
	b = append(b, byte(OpBatchReply), 0)
	return binary.LittleEndian.AppendUint16(b, uint16(n))
}

// AppendBatchEntry appends one descriptor's reply (as AppendReply; the
// text is cut to MaxBatchMsg).
func AppendBatchEntry(b []byte, r *Reply, crcs []uint32, msg string) []byte {
	if len(msg) > MaxBatchMsg {
		msg = msg[:MaxBatchMsg]
	}
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	b = AppendReply(b, r, crcs, msg)
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

// ParseBatchReply decodes a batch answer that must hold exactly n
// replies, calling f with each in order (its CRCs and Msg alias b). An
// error from f stops the parse and is returned.
func ParseBatchReply(b []byte, n int, f func(i int, r *Reply) error) error {
	if len(b) < 4 {
		return malformed("batch reply of %d bytes", len(b))
	}
	if Op(b[0]) != OpBatchReply || b[1] != 0 {
		return malformed("op %d is not a batch reply", b[0])
	}
	if got := int(binary.LittleEndian.Uint16(b[2:])); got != n {
		return malformed("batch reply has %d replies for %d reads", got, n)
	}
	rest := b[4:]
	var r Reply
	for i := range n {
		if len(rest) < 4 {
			return malformed("batch reply %d missing", i)
		}
		l := binary.LittleEndian.Uint32(rest)
		if uint64(l) > uint64(len(rest)-4) {
			return malformed("batch reply %d of %d bytes truncated", i, l)
		}
		if err := ParseReply(rest[4:4+l], &r); err != nil {
			return fmt.Errorf("batch reply %d: %w", i, err)
		}
		if len(r.Msg) > MaxBatchMsg {
			return malformed("batch reply %d has %d bytes of text", i, len(r.Msg))
		}
		if err := f(i, &r); err != nil {
			return err
		}
		rest = rest[4+l:]
	}
	if len(rest) != 0 {
		return malformed("%d trailing bytes", len(rest))
	}
	return nil
}

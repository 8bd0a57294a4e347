package wire

import (
	"encoding/binary"
	"math/bits"
)

// Export is what a read reply says of the node's exported cache (issue
// 19, seed 004's ODAFS): references to the blocks of the read it holds,
// which a client may later read with one-sided operations and no RPC.
// Block 0 means none. The references are to consecutive export blocks
// of the chunk from First, at the reply's version; each names a slot of
// the cache's region and the generation it was filled under.
type Export struct {
	Epoch  uint64 // the node's run: a restarted node's references all fail
	Region uint64 // the exported cache's region key
	Block  uint32 // the export block size
	First  uint64 // the export block index of the first reference
	// List holds the references to encode (AppendReply); refs those
	// decoded (ParseReply), 28 bytes each, aliasing the packet.
	List []ExportRef
	refs []byte
}

// ExportRef is one block's reference: its slot and generation, and the
// key of that fill (regionmac.RefKey: the node derives it again to check
// a read; the client holds it like a capability).
type ExportRef struct {
	Slot uint32
	Gen  uint64
	Key  [16]byte
}

// MaxExportRefs bounds the references a reply carries.
const MaxExportRefs = 32

const (
	exportFixed = 8 + 8 + 4 + 2 + 2 + 8
	exportRef   = 4 + 8 + 16
)

// MinExportBlock and MaxExportBlock bound an export block's size.
const (
	MinExportBlock = 512
	MaxExportBlock = 1 << 20
)

// N is the number of references decoded.
func (e *Export) N() int { return len(e.refs) / exportRef }

// Ref returns decoded reference i.
func (e *Export) Ref(i int) ExportRef {
	b := e.refs[exportRef*i:]
	r := ExportRef{Slot: binary.LittleEndian.Uint32(b), Gen: binary.LittleEndian.Uint64(b[4:])}
	copy(r.Key[:], b[12:28])
	return r
}

func exportSize(e *Export) int {
	if e.Block == 0 {
		return 0
	}
	return exportFixed + exportRef*min(len(e.List), MaxExportRefs)
}

func appendExport(b []byte, e *Export) []byte {
	list := e.List[:min(len(e.List), MaxExportRefs)]
	b = binary.LittleEndian.AppendUint64(b, e.Epoch)
	b = binary.LittleEndian.AppendUint64(b, e.Region)
	b = binary.LittleEndian.AppendUint32(b, e.Block)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(list)))
	b = append(b, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, e.First)
	for _, r := range list {
		b = binary.LittleEndian.AppendUint32(b, r.Slot)
		b = binary.LittleEndian.AppendUint64(b, r.Gen)
		b = append(b, r.Key[:]...)
	}
	return b
}

// parseExport decodes an export trailer from the start of b and returns
// what follows it.
func parseExport(b []byte, e *Export) ([]byte, error) {
	if len(b) < exportFixed {
		return nil, malformed("export references of %d bytes, need %d", len(b), exportFixed)
	}
	e.Epoch = binary.LittleEndian.Uint64(b)
	e.Region = binary.LittleEndian.Uint64(b[8:])
	e.Block = binary.LittleEndian.Uint32(b[16:])
	n := int(binary.LittleEndian.Uint16(b[20:]))
	if b[22] != 0 || b[23] != 0 {
		return nil, malformed("export references' reserved bytes set")
	}
	e.First = binary.LittleEndian.Uint64(b[24:])
	e.List = nil
	switch {
	case e.Block < MinExportBlock || e.Block > MaxExportBlock || bits.OnesCount32(e.Block) != 1:
		return nil, malformed("export block size %d", e.Block)
	case n == 0 || n > MaxExportRefs:
		return nil, malformed("%d export references", n)
	case len(b)-exportFixed < exportRef*n:
		return nil, malformed("%d export references in %d bytes", n, len(b)-exportFixed)
	case e.First > (1<<63)/uint64(e.Block):
		return nil, malformed("export block %d out of range", e.First)
	}
	e.refs = b[exportFixed : exportFixed+exportRef*n]
	return b[exportFixed+exportRef*n:], nil
}

// Detach copies decoded references into List, so that e outlives the
// packet it was decoded from.
func (e *Export) Detach() {
	if e.refs == nil {
		return
	}
	e.List = make([]ExportRef, e.N())
	for i := range e.List {
		e.List[i] = e.Ref(i)
	}
	e.refs = nil
}

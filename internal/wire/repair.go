package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
)

// OpRepair asks the node holding (or about to hold) one unit of an
// erasure-coded stripe group to rebuild it from survivors, one replica
// of a chunk to copy it from another, or any member to fence itself (see
// docs/failures.md).
const OpRepair Op = 4

// RepairMode is how a node rebuilds a unit (seed 003 §IV).
type RepairMode uint8

const (
	// RepairDistributed: each survivor multiplies its unit by its decoding
	// coefficient and sends the product; the rebuilder XORs them.
	RepairDistributed RepairMode = 0
	// RepairGather: survivors send their units as they are and the
	// rebuilder decodes (the gather-at-one-node baseline).
	RepairGather RepairMode = 1
	// RepairFence: raise the member's fence to the capability's epoch and
	// report its committed state: Reply.Version and ChunkLen, Partial if
	// it holds an unresolved write. No survivors.
	// A non-zero Version also clears an unresolved write if the member
	// is at that version (every member is: the reconciliation is over).
	RepairFence RepairMode = 2
	// RepairCopy: copy a replicated chunk whole at Version from the
	// survivors listed, in order: each block from the first whose copy of
	// it passes its checksum. Len is the chunk's length.
	RepairCopy RepairMode = 3
	// RepairDrop: discard the member's copy — its data and any
	// unresolved write — keeping its fence, if the member is still at
	// Version (the one fencing found). The reconciliation found that no
	// write to the chunk completed and that this member holds an
	// incomplete one, or its doubt. No survivors.
	RepairDrop RepairMode = 4
)

// RepairHeal (a flag, with RepairCopy, RepairDistributed or RepairGather):
// the member already holds Version at Len; only its blocks that fail their
// checksums are replaced, in place, from the survivors. Blocks are judged
// one by one, so copies that each have other bad blocks heal each other.
const RepairHeal uint8 = 1 << 0

func (m RepairMode) String() string {
	switch m {
	case RepairDistributed:
		return "distributed"
	case RepairGather:
		return "gather"
	case RepairFence:
		return "fence"
	case RepairCopy:
		return "copy"
	case RepairDrop:
		return "drop"
	}
	return fmt.Sprintf("repair-mode(%d)", uint8(m))
}

// Survivorless reports whether the mode acts on the member alone (fence,
// drop): such a request lists no survivors, and the others at least one.
func (m RepairMode) Survivorless() bool { return m == RepairFence || m == RepairDrop }

const repairFixed = 32

// RepairHeader: rebuild bytes [0, Len) of unit Unit of chunk Chunk at
// Version, from the units Survivors (for a stripe group at least as many
// as the code's data units: the first ones are used, the others stand in
// for blocks that fail their checksums; for a copy, at least one). Addrs are the group's unit addresses; Cap is a capability with
// write rights for the group.
type RepairHeader struct {
	Mode      RepairMode
	Flags     uint8 // RepairHeal
	Unit      uint8
	Chunk     ids.ChunkID
	Version   uint64
	Len       uint64
	Survivors []byte // unit indices, aliasing the packet
	Cap       []byte
	Addrs     Addrs
}

// AppendRepair encodes h.
func AppendRepair(b []byte, h *RepairHeader, addrs []string) ([]byte, error) {
	if len(h.Cap) > 0xffff || len(h.Survivors) > MaxAddrs {
		return b, fmt.Errorf("wire: repair with a %d-byte capability and %d survivors", len(h.Cap), len(h.Survivors))
	}
	b = append(b, byte(OpRepair), byte(h.Mode), h.Unit, byte(len(addrs)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Cap)))
	b = append(b, byte(len(h.Survivors)), h.Flags)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Chunk))
	b = binary.LittleEndian.AppendUint64(b, h.Version)
	b = binary.LittleEndian.AppendUint64(b, h.Len)
	b = append(b, h.Cap...)
	b = append(b, h.Survivors...)
	return AppendAddrs(b, addrs)
}

// ParseRepair decodes a repair header; the whole packet must be it.
func ParseRepair(b []byte, h *RepairHeader) error {
	if len(b) < repairFixed {
		return malformed("repair header of %d bytes, need %d", len(b), repairFixed)
	}
	if Op(b[0]) != OpRepair {
		return malformed("op %d is not repair", b[0])
	}
	h.Mode, h.Unit = RepairMode(b[1]), b[2]
	n, capLen, ns := int(b[3]), int(binary.LittleEndian.Uint16(b[4:])), int(b[6])
	h.Flags = b[7]
	if h.Mode > RepairDrop || h.Flags&^RepairHeal != 0 || (h.Mode.Survivorless() && h.Flags != 0) {
		return malformed("repair mode %d, flags %#x", b[1], b[7])
	}
	if n == 0 || n > MaxAddrs || int(h.Unit) >= n || ns >= n || h.Mode.Survivorless() != (ns == 0) {
		return malformed("%s of unit %d of %d with %d survivors", h.Mode, h.Unit, n, ns)
	}
	h.Chunk = ids.ChunkID(binary.LittleEndian.Uint64(b[8:]))
	h.Version = binary.LittleEndian.Uint64(b[16:])
	h.Len = binary.LittleEndian.Uint64(b[24:])
	rest := b[repairFixed:]
	if len(rest) < capLen+ns {
		return malformed("capability and survivors truncated")
	}
	h.Cap, h.Survivors = rest[:capLen], rest[capLen:capLen+ns]
	for i, s := range h.Survivors {
		if int(s) >= n || s == h.Unit {
			return malformed("survivor %d is unit %d", i, s)
		}
		for _, t := range h.Survivors[:i] {
			if t == s {
				return malformed("survivor unit %d listed twice", s)
			}
		}
	}
	var used int
	var err error
	if h.Addrs, used, err = parseAddrs(rest[capLen+ns:], n); err != nil {
		return err
	}
	if capLen+ns+used != len(rest) {
		return malformed("%d trailing bytes", len(rest)-capLen-ns-used)
	}
	return nil
}

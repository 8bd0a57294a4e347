// Package wire defines the DFS headers carried in the first packet of a
// fabric message (seed 000 §III: DFS header + write or read request
// header): the write request header (WRH) with its capability, strategy,
// rank and replica coordinates; the read request header (RRH); and the
// reply every request gets. Decoders check every length against the
// packet and never allocate: variable parts alias the packet's bytes.
//
// All integers are little endian. Every header starts with the op byte,
// which is also the engine's message class.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
)

// Op is the first byte of every header: the message class.
type Op uint8

const (
	OpWrite Op = 1
	OpRead  Op = 2
	OpReply Op = 3
)

func (o Op) String() string {
	switch o {
	case OpWrite:
		return "write"
	case OpRead:
		return "read"
	case OpReply:
		return "reply"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Write header flags.
const (
	// FlagRaw: no capability check at all — the speed-of-light reference
	// for benchmarks. Nodes refuse it unless started to allow it.
	FlagRaw uint8 = 1 << 0
	// FlagReserve (flat writes): reserve the chunk's next version at rank
	// 0 without data; the reply carries the version.
	FlagReserve uint8 = 1 << 1
	// FlagBase: the header carries Base (after the addresses), because
	// the write skips the versions of an unresolved one it covers.
	FlagBase uint8 = 1 << 2
	// FlagSealed: a node forwarded the header and sealed it: the last
	// SealSize bytes are a MAC over everything before them under a key
	// only nodes hold (see SealForward).
	FlagSealed uint8 = 1 << 3
	// FlagEncode (erasure-coded data units): compute the partial parity
	// of the data for every parity unit and send it there — per packet in
	// stream mode, once the whole unit is in in host mode (per-chunk).
	FlagEncode uint8 = 1 << 4
	// FlagPartial (erasure-coded parity units): the data is data unit
	// Src's partial parity, forwarded and sealed by that unit's node; the
	// parity unit stores the XOR of all data units' partials.
	FlagPartial uint8 = 1 << 5
	flagsAll          = FlagRaw | FlagReserve | FlagBase | FlagSealed | FlagEncode | FlagPartial
)

// SealSize is the length of a forwarded header's seal.
const SealSize = 16

// MaxAddrs bounds the replica coordinates a header carries.
const MaxAddrs = 32

// MaxAddrLen bounds one address (host:port).
const MaxAddrLen = 255

// ErrMalformed marks a header that does not parse.
var ErrMalformed = errors.New("wire: malformed header")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Addrs is a list of replica addresses aliasing a packet: each entry is a
// length byte and the address bytes.
type Addrs struct {
	raw []byte
	n   int
}

// Len is the number of addresses.
func (a Addrs) Len() int { return a.n }

// At returns address i as bytes aliasing the packet (no allocation).
func (a Addrs) At(i int) []byte {
	b := a.raw
	for ; i > 0; i-- {
		b = b[1+int(b[0]):]
	}
	return b[1 : 1+int(b[0])]
}

// Raw is the encoded list (to forward it unchanged).
func (a Addrs) Raw() []byte { return a.raw }

func parseAddrs(b []byte, n int) (Addrs, int, error) {
	off := 0
	for i := 0; i < n; i++ {
		if off >= len(b) {
			return Addrs{}, 0, malformed("replica address %d missing", i)
		}
		l := int(b[off])
		if l == 0 || off+1+l > len(b) {
			return Addrs{}, 0, malformed("replica address %d has bad length %d", i, l)
		}
		off += 1 + l
	}
	return Addrs{raw: b[:off], n: n}, off, nil
}

// AppendAddrs encodes addresses.
func AppendAddrs(b []byte, addrs []string) ([]byte, error) {
	if len(addrs) > MaxAddrs {
		return b, fmt.Errorf("wire: %d replica addresses, at most %d", len(addrs), MaxAddrs)
	}
	for _, a := range addrs {
		if len(a) == 0 || len(a) > MaxAddrLen {
			return b, fmt.Errorf("wire: replica address %q has bad length", a)
		}
		b = append(b, byte(len(a)))
		b = append(b, a...)
	}
	return b, nil
}

// ---- write request header ----

const writeFixed = 48

// WriteHeader is the WRH: write Len bytes at Off of Chunk. The data
// follows in the message's data packets.
type WriteHeader struct {
	// Strategy and Mode are the write's plan (plan.Plan; see Plan).
	Strategy plan.Strategy
	Mode     plan.Mode
	Flags    uint8
	Rank     uint8 // this node's position in the replica chain
	Chunk    ids.ChunkID
	Off      uint64
	Len      uint64
	// Version is the version this write commits as. Clients send 0; the
	// rank-0 replica assigns the chunk's next version and forwards it, so
	// every replica applies writes in the same order (see policy).
	Version uint64
	// WriteID identifies the logical write across the client's retries: a
	// replica that already committed this version with this id answers
	// "already applied" instead of "stale" (0: no id).
	WriteID uint64
	// Base is the oldest version a replica may hold and still apply the
	// write: Version-1, unless the write covers an unresolved one whose
	// versions it skips (store.Doubt). Sent only with FlagBase; ParseWrite
	// fills in Version-1 otherwise.
	Base uint64
	// Src (FlagPartial only) is the data unit whose partial parity this is.
	Src   uint8
	Cap   []byte // encoded capability
	Addrs Addrs  // replica coordinates in chain order, one per replica
	// RegionKey and RegionOff (plan.Pull only) name the client's registered
	// buffer holding the data.
	RegionKey uint64
	RegionOff uint64
	// Seal and Sealed (FlagSealed only): the seal, and the bytes it
	// covers. Both alias the parsed packet.
	Seal   []byte
	Sealed []byte
}

// SealForward seals a header built by AppendForward: it sets FlagSealed
// and appends seal(header). seal is the forwarding node's keyed MAC.
func SealForward(hdr []byte, seal func(body []byte) [SealSize]byte) []byte {
	hdr[7] |= FlagSealed
	mac := seal(hdr)
	return append(hdr, mac[:]...)
}

// AppendWrite encodes h; addrs are the replica coordinates.
func AppendWrite(b []byte, h *WriteHeader, addrs []string) ([]byte, error) {
	if len(h.Cap) > 0xffff {
		return b, fmt.Errorf("wire: capability of %d bytes", len(h.Cap))
	}
	b = append(b, byte(OpWrite), byte(h.Strategy), h.Rank, byte(len(addrs)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Cap)))
	b = append(b, byte(h.Mode), h.Flags)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Chunk))
	b = binary.LittleEndian.AppendUint64(b, h.Off)
	b = binary.LittleEndian.AppendUint64(b, h.Len)
	b = binary.LittleEndian.AppendUint64(b, h.Version)
	b = binary.LittleEndian.AppendUint64(b, h.WriteID)
	b = append(b, h.Cap...)
	b, err := AppendAddrs(b, addrs)
	if err != nil {
		return b, err
	}
	return appendTail(b, h, h.Mode, h.Flags, h.Base, h.Src), nil
}

// appendTail appends the optional fields that follow the addresses.
func appendTail(b []byte, h *WriteHeader, mode plan.Mode, flags uint8, base uint64, src uint8) []byte {
	if flags&FlagBase != 0 {
		b = binary.LittleEndian.AppendUint64(b, base)
	}
	if flags&FlagPartial != 0 {
		b = append(b, src)
	}
	if mode != plan.Pull {
		return b
	}
	b = binary.LittleEndian.AppendUint64(b, h.RegionKey)
	return binary.LittleEndian.AppendUint64(b, h.RegionOff)
}

// AppendForward encodes h for the next hop: same fields, the given rank,
// version and base (FlagBase set only if base is not version-1), and the
// same raw address list.
func AppendForward(b []byte, h *WriteHeader, rank uint8, version, base uint64) []byte {
	return appendHop(b, h, h.Mode, h.Flags&^(FlagBase|FlagSealed), rank, version, base, h.Src)
}

// AppendPartial encodes, from data unit src's header h, the header of its
// partial parity for parity unit rank: a streamed FlagPartial write of the
// same range and version.
func AppendPartial(b []byte, h *WriteHeader, rank, src uint8, version, base uint64) []byte {
	flags := h.Flags&^(FlagBase|FlagSealed|FlagEncode|FlagReserve) | FlagPartial
	return appendHop(b, h, plan.Stream, flags, rank, version, base, src)
}

func appendHop(b []byte, h *WriteHeader, mode plan.Mode, flags, rank uint8, version, base uint64, src uint8) []byte {
	if version > 0 && base+1 != version {
		flags |= FlagBase
	}
	b = append(b, byte(OpWrite), byte(h.Strategy), rank, byte(h.Addrs.n))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Cap)))
	b = append(b, byte(mode), flags)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Chunk))
	b = binary.LittleEndian.AppendUint64(b, h.Off)
	b = binary.LittleEndian.AppendUint64(b, h.Len)
	b = binary.LittleEndian.AppendUint64(b, version)
	b = binary.LittleEndian.AppendUint64(b, h.WriteID)
	b = append(b, h.Cap...)
	b = append(b, h.Addrs.raw...)
	return appendTail(b, h, mode, flags, base, src)
}

// ParseWrite decodes a WRH; the whole packet must be the header.
func ParseWrite(b []byte, h *WriteHeader) error {
	if len(b) < writeFixed {
		return malformed("write header of %d bytes, need %d", len(b), writeFixed)
	}
	if Op(b[0]) != OpWrite {
		return malformed("op %d is not write", b[0])
	}
	h.Mode, h.Flags = plan.Mode(b[6]), b[7]
	if h.Mode > plan.Pull || h.Flags&^flagsAll != 0 {
		return malformed("mode %d, flags %#x", b[6], b[7])
	}
	h.Strategy = plan.Strategy(b[1])
	h.Rank = b[2]
	n := int(b[3])
	capLen := int(binary.LittleEndian.Uint16(b[4:]))
	h.Chunk = ids.ChunkID(binary.LittleEndian.Uint64(b[8:]))
	h.Off = binary.LittleEndian.Uint64(b[16:])
	h.Len = binary.LittleEndian.Uint64(b[24:])
	h.Version = binary.LittleEndian.Uint64(b[32:])
	h.WriteID = binary.LittleEndian.Uint64(b[40:])
	if n == 0 || n > MaxAddrs {
		return malformed("%d replica addresses", n)
	}
	if int(h.Rank) >= n {
		return malformed("rank %d with %d replicas", h.Rank, n)
	}
	if h.Off+h.Len < h.Off {
		return malformed("range overflows")
	}
	rest := b[writeFixed:]
	if len(rest) < capLen {
		return malformed("capability of %d bytes truncated", capLen)
	}
	h.Cap = rest[:capLen]
	var used int
	var err error
	if h.Addrs, used, err = parseAddrs(rest[capLen:], n); err != nil {
		return err
	}
	tail := rest[capLen+used:]
	h.Base = 0
	switch {
	case h.Flags&FlagBase != 0:
		if len(tail) < 8 {
			return malformed("header flagged with a base version lacks it")
		}
		h.Base = binary.LittleEndian.Uint64(tail)
		tail = tail[8:]
		if h.Version < 2 || h.Base >= h.Version-1 { // only a skip is sent
			return malformed("base version %d for version %d", h.Base, h.Version)
		}
	case h.Version > 0:
		h.Base = h.Version - 1
	}
	h.Src = 0
	if h.Flags&FlagPartial != 0 {
		if len(tail) < 1 {
			return malformed("partial parity header without its source unit")
		}
		h.Src, tail = tail[0], tail[1:]
	}
	h.Seal, h.Sealed = nil, nil
	if h.Flags&FlagSealed != 0 {
		if len(tail) < SealSize {
			return malformed("sealed header without its seal")
		}
		h.Seal = tail[len(tail)-SealSize:]
		h.Sealed = b[:len(b)-SealSize]
		tail = tail[:len(tail)-SealSize]
	}
	h.RegionKey, h.RegionOff = 0, 0
	if h.Mode == plan.Pull {
		if len(tail) < 16 {
			return malformed("pull header without its region")
		}
		h.RegionKey = binary.LittleEndian.Uint64(tail)
		h.RegionOff = binary.LittleEndian.Uint64(tail[8:])
		tail = tail[16:]
	}
	if len(tail) != 0 {
		return malformed("%d trailing bytes", len(tail))
	}
	return nil
}

// ---- read request header ----

const readFixed = 48

// ReadHeader is the RRH: read Len bytes at Off of Chunk. If RegionKey is
// non-zero the node places the data with one-sided WRITEs into the
// requester's region at RegionOff (direct placement, no copy through the
// message stream) before replying; otherwise the data follows the reply.
type ReadHeader struct {
	// Scaled: the node verifies the data against its stored checksums,
	// multiplies it by Coef in GF(2^8) and sends the product, with the
	// product's checksums (a survivor's partial decoding for distributed
	// repair, seed 003).
	Scaled    bool
	Coef      byte
	Chunk     ids.ChunkID
	Off       uint64
	Len       uint64
	RegionKey uint64
	RegionOff uint64
	Cap       []byte
}

// AppendRead encodes h.
func AppendRead(b []byte, h *ReadHeader) ([]byte, error) {
	if len(h.Cap) > 0xffff {
		return b, fmt.Errorf("wire: capability of %d bytes", len(h.Cap))
	}
	var scaled byte
	if h.Scaled {
		scaled = 1
	}
	b = append(b, byte(OpRead), scaled, h.Coef, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Cap)))
	b = append(b, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Chunk))
	b = binary.LittleEndian.AppendUint64(b, h.Off)
	b = binary.LittleEndian.AppendUint64(b, h.Len)
	b = binary.LittleEndian.AppendUint64(b, h.RegionKey)
	b = binary.LittleEndian.AppendUint64(b, h.RegionOff)
	return append(b, h.Cap...), nil
}

// ParseRead decodes an RRH.
func ParseRead(b []byte, h *ReadHeader) error {
	if len(b) < readFixed {
		return malformed("read header of %d bytes, need %d", len(b), readFixed)
	}
	if Op(b[0]) != OpRead {
		return malformed("op %d is not read", b[0])
	}
	if b[1] > 1 || b[1] == 0 && b[2] != 0 || b[3] != 0 || b[6] != 0 || b[7] != 0 {
		return malformed("reserved bytes set")
	}
	h.Scaled, h.Coef = b[1] == 1, b[2]
	capLen := int(binary.LittleEndian.Uint16(b[4:]))
	h.Chunk = ids.ChunkID(binary.LittleEndian.Uint64(b[8:]))
	h.Off = binary.LittleEndian.Uint64(b[16:])
	h.Len = binary.LittleEndian.Uint64(b[24:])
	h.RegionKey = binary.LittleEndian.Uint64(b[32:])
	h.RegionOff = binary.LittleEndian.Uint64(b[40:])
	if h.Off+h.Len < h.Off {
		return malformed("range overflows")
	}
	if len(b)-readFixed != capLen {
		return malformed("capability length %d, %d bytes left", capLen, len(b)-readFixed)
	}
	h.Cap = b[readFixed:]
	return nil
}

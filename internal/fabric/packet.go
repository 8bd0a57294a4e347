// Package fabric is Sluice's transport with RDMA semantics: endpoints,
// connections (queue pairs), two-sided messages made of packets no larger
// than an MTU, and one-sided READ and WRITE into memory regions the target
// registered under a key, bounds- and key-checked by the target's fabric
// layer without involving its host code — the way an RDMA NIC would.
//
// The bytes move through a transport backend (transport.go; TCP, with
// optional TLS, is the one in production), and every backend carries the
// same packets, framed with a 16-byte header. As on an RDMA
// reliable connection, the packets of one message are contiguous on a
// connection (messages do not interleave), so a receiver needs one
// "current message" per connection, not a table. A message is one header
// packet (flag First, at most one MTU: the DFS headers) followed by zero
// or more data packets; the final packet carries flag Last. Receive
// buffers come from a fixed per-connection quota, so a connection's memory
// is bounded and a slow consumer back-pressures only its own sender.
//
// Wire format, little endian:
//
//	0  kind   u8   Send, Write, ReadReq, ReadResp, Ack, AccessErr
//	1  flags  u8   First, Last, Signal
//	2  rsvd   u16  zero
//	4  length u32  payload bytes following the header, <= receiver's MTU
//	8  id     u64  message id (Send) or operation id (one-sided ops)
//
// A connection opens with a 16-byte hello from each side: "SLF", version,
// then the sender's receive MTU and receive quota.
package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
)

// HeaderSize is the size of a packet header on the wire.
const HeaderSize = 16

// Kind is the packet type.
type Kind uint8

const (
	KindSend      Kind = 1 // part of a two-sided message
	KindWrite     Kind = 2 // one-sided WRITE: payload = key u64, offset u64, data
	KindReadReq   Kind = 3 // one-sided READ request: payload = key u64, offset u64, length u64
	KindReadResp  Kind = 4 // data answering a READ, in order; Last on the final packet
	KindAck       Kind = 5 // completion of a signaled WRITE
	KindAccessErr Kind = 6 // a one-sided operation was refused: payload = reason text
	// KindOReadReq: an optimistic READ (Conn.ReadOptimistic): payload =
	// key u64, offset u64, length u64, word offset u64; answered by the
	// data, then the 8-byte word at the word offset read after the data
	// was sent (ReadResp packets, Last on the word's), or by SoftErr.
	KindOReadReq Kind = 7
	// KindSoftErr: an optimistic operation was refused: payload = reason
	// text. Unlike AccessErr the connection stays up.
	KindSoftErr Kind = 8
	kindMax          = KindSoftErr
)

func (k Kind) String() string {
	switch k {
	case KindSend:
		return "send"
	case KindWrite:
		return "write"
	case KindReadReq:
		return "read-req"
	case KindReadResp:
		return "read-resp"
	case KindAck:
		return "ack"
	case KindAccessErr:
		return "access-err"
	case KindOReadReq:
		return "oread-req"
	case KindSoftErr:
		return "soft-err"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Flags of a packet.
const (
	FlagFirst  = 1 << 0 // first packet of a message (its header packet)
	FlagLast   = 1 << 1 // last packet of a message or READ response
	FlagSignal = 1 << 2 // WRITE: the initiator wants an Ack once the data is placed
	flagsAll   = FlagFirst | FlagLast | FlagSignal
)

// oneSidedPrefix is the key+offset prefix of WRITE and READ request payloads.
const oneSidedPrefix = 16

// readRespPacket is the largest READ response packet. Responses go
// straight into the initiator's destination buffer, so they are cut
// coarser than the MTU: fewer headers, and reads large enough to bypass
// the receiver's buffered reader (a copy) — the emulation's stand-in for
// a NIC placing the data.
const readRespPacket = 256 << 10

// Limits on the MTU a connection may announce or use.
const (
	MinMTU     = 512
	MaxMTU     = 1 << 20
	DefaultMTU = 64 << 10
)

// header is a decoded packet header.
type header struct {
	kind   Kind
	flags  uint8
	length uint32
	id     uint64
}

func putHeader(b []byte, h header) {
	b[0] = byte(h.kind)
	b[1] = h.flags
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], h.length)
	binary.LittleEndian.PutUint64(b[8:], h.id)
}

// ErrProtocol marks a framing violation by the peer; the connection is
// closed when one is seen.
var ErrProtocol = errors.New("fabric: protocol violation")

// parseHeader decodes and checks a header against the receive MTU.
func parseHeader(b []byte, mtu int) (header, error) {
	h := header{kind: Kind(b[0]), flags: b[1], length: binary.LittleEndian.Uint32(b[4:]), id: binary.LittleEndian.Uint64(b[8:])}
	if h.kind == 0 || h.kind > kindMax {
		return h, fmt.Errorf("%w: unknown packet kind %d", ErrProtocol, b[0])
	}
	if h.flags&^flagsAll != 0 || b[2] != 0 || b[3] != 0 {
		return h, fmt.Errorf("%w: reserved bits set in %s header", ErrProtocol, h.kind)
	}
	max := uint32(mtu)
	switch h.kind {
	case KindWrite, KindReadReq, KindOReadReq:
		max += oneSidedPrefix
	case KindReadResp:
		// Placed in the initiator's destination (bounds-checked against
		// it), not a receive buffer: the MTU does not bound it.
		max = readRespPacket
	}
	if h.length > max {
		return h, fmt.Errorf("%w: %s packet of %d bytes exceeds MTU %d", ErrProtocol, h.kind, h.length, mtu)
	}
	return h, nil
}

// Packet is one received packet of a two-sided message, handed to a
// Handler. Data aliases a buffer from the connection's receive quota: the
// handler must call Release exactly once per reference when done (Retain
// adds references, e.g. to forward a packet while also storing it).
type Packet struct {
	ID    uint64 // message id
	Flags uint8
	// Off is the byte offset of Data within the message's data (the bytes
	// after the header packet). It is 0 for the header packet.
	Off  int64
	Data []byte
	Conn *Conn

	buf  []byte
	refs atomic.Int32
}

// First reports whether p is the message's header packet.
func (p *Packet) First() bool { return p.Flags&FlagFirst != 0 }

// Last reports whether p is the message's final packet.
func (p *Packet) Last() bool { return p.Flags&FlagLast != 0 }

// Retain adds a reference; each reference needs its own Release.
func (p *Packet) Retain() { p.refs.Add(1) }

// Release drops a reference; the last one returns the buffer to its
// connection's quota.
func (p *Packet) Release() {
	switch n := p.refs.Add(-1); {
	case n == 0:
		p.Data = nil
		p.Conn.quota.put(p)
	case n < 0:
		panic("fabric: packet released twice")
	}
}

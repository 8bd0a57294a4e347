// Package fabricrpc carries ONC RPC over the fabric, as seed 001 ("NFS
// over RDMA") carries it over RDMA: the RPC programs (NFS, MOUNT) are
// unchanged, only the transport differs.
//
//   - A message travels as one fabric packet (an RDMA SEND) into one of
//     the receive buffers the peer posted; their count and size are the
//     fabric connection's receive quota and MTU, announced by each side
//     when the connection opens. A client keeps its calls outstanding
//     within the server's buffers (credits), so no SEND ever finds none.
//   - Any variable-length opaque datum of at least ChunkMin bytes (1 KiB
//     by default) is left out of the message and listed in its chunk
//     list, by its offset in the XDR stream, length, and the key and
//     address of the registered memory that holds it. The receiver pulls
//     it with a one-sided READ straight into its destination buffer: the
//     server pulls WRITE data, the client pulls READ data into the
//     caller's buffer.
//   - After pulling a reply's chunks the client sends DONE, and the server
//     revokes the regions and frees what they held; it does so anyway
//     after DoneTimeout.
//   - A message larger than the peer's receive buffer is registered whole
//     and sent as a chunk at offset 0 with an empty body (a long message).
//
// Header (XDR, after seed 001 §4.4, with 64-bit region keys):
//
//	xid u32, vers u32 (1), proc u32 (MSG 0, DONE 1)
//	MSG: chunk list as XDR optional data: { 1, xdroff u32, len u32,
//	     key u64, addr u64 }* 0, then the de-chunked RPC message
//	DONE: nothing more
package fabricrpc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the transport header version.
const Version = 1

const (
	procMsg  = 0
	procDone = 1

	fixedHeader = 12
	entrySize   = 4 + 4 + 4 + 8 + 8 // marker, xdroff, len, key, addr
	// maxChunks bounds a message's chunk list: a long message and a few
	// data items (NFS has one per call or reply).
	maxChunks = 8
)

// DefaultChunkMin is the smallest opaque datum sent as a chunk (seed
// 001's minimum chunk size).
const DefaultChunkMin = 1024

// ErrProtocol is a transport header the receiver cannot accept.
var ErrProtocol = errors.New("fabricrpc: protocol error")

// chunkRef is one chunk list entry.
type chunkRef struct {
	pos, len  uint32
	key, addr uint64
}

// header is a decoded transport header.
type header struct {
	xid, proc uint32
	refs      []chunkRef
	body      []byte // the inline RPC message (aliases the packet)
	long      bool   // refs[0] is the whole message
}

func headerSize(nrefs int) int { return fixedHeader + nrefs*entrySize + 4 }

// appendHeader appends a MSG header with its chunk list.
func appendHeader(b []byte, xid uint32, refs []chunkRef) []byte {
	b = binary.BigEndian.AppendUint32(b, xid)
	b = binary.BigEndian.AppendUint32(b, Version)
	b = binary.BigEndian.AppendUint32(b, procMsg)
	for _, r := range refs {
		b = binary.BigEndian.AppendUint32(b, 1)
		b = binary.BigEndian.AppendUint32(b, r.pos)
		b = binary.BigEndian.AppendUint32(b, r.len)
		b = binary.BigEndian.AppendUint64(b, r.key)
		b = binary.BigEndian.AppendUint64(b, r.addr)
	}
	return binary.BigEndian.AppendUint32(b, 0)
}

// doneMsg is a DONE for xid.
func doneMsg(xid uint32) []byte {
	b := make([]byte, 0, fixedHeader)
	b = binary.BigEndian.AppendUint32(b, xid)
	b = binary.BigEndian.AppendUint32(b, Version)
	return binary.BigEndian.AppendUint32(b, procDone)
}

// parseHeader decodes a transport message into h (reusing h.refs). The
// chunk list must ascend by offset, each chunk at most maxChunk bytes and
// all of them at most maxTotal; a chunk at offset 0 first is a long
// message, whose inline body must be empty. It returns the xid whenever
// the message is long enough to hold one, so a caller can answer it.
func parseHeader(b []byte, h *header, maxChunk, maxTotal int) error {
	h.refs, h.body, h.long, h.xid, h.proc = h.refs[:0], nil, false, 0, 0
	if len(b) >= 4 {
		h.xid = binary.BigEndian.Uint32(b)
	}
	if len(b) < fixedHeader {
		return fmt.Errorf("%w: message of %d bytes", ErrProtocol, len(b))
	}
	if v := binary.BigEndian.Uint32(b[4:]); v != Version {
		return fmt.Errorf("%w: version %d", ErrProtocol, v)
	}
	h.proc = binary.BigEndian.Uint32(b[8:])
	b = b[fixedHeader:]
	switch h.proc {
	case procDone:
		if len(b) != 0 {
			return fmt.Errorf("%w: DONE with %d bytes more", ErrProtocol, len(b))
		}
		return nil
	case procMsg:
	default:
		return fmt.Errorf("%w: procedure %d", ErrProtocol, h.proc)
	}
	total := 0
	for {
		if len(b) < 4 {
			return fmt.Errorf("%w: chunk list cut short", ErrProtocol)
		}
		more := binary.BigEndian.Uint32(b)
		b = b[4:]
		if more == 0 {
			break
		}
		if more != 1 {
			return fmt.Errorf("%w: chunk list marker %d", ErrProtocol, more)
		}
		if len(h.refs) == maxChunks {
			return fmt.Errorf("%w: more than %d chunks", ErrProtocol, maxChunks)
		}
		if len(b) < entrySize-4 {
			return fmt.Errorf("%w: chunk list cut short", ErrProtocol)
		}
		r := chunkRef{
			pos:  binary.BigEndian.Uint32(b),
			len:  binary.BigEndian.Uint32(b[4:]),
			key:  binary.BigEndian.Uint64(b[8:]),
			addr: binary.BigEndian.Uint64(b[16:]),
		}
		b = b[entrySize-4:]
		switch n := len(h.refs); {
		case r.len == 0 || int64(r.len) > int64(maxChunk):
			return fmt.Errorf("%w: chunk of %d bytes (1 to %d)", ErrProtocol, r.len, maxChunk)
		case r.pos%4 != 0:
			return fmt.Errorf("%w: chunk at unaligned offset %d", ErrProtocol, r.pos)
		case n == 0 && r.pos == 0:
			h.long = true
		case n > 0 && !(h.long && n == 1) && r.pos <= h.refs[n-1].pos:
			return fmt.Errorf("%w: chunk offsets out of order (%d after %d)", ErrProtocol, r.pos, h.refs[n-1].pos)
		case r.pos == 0:
			return fmt.Errorf("%w: a data chunk at offset 0", ErrProtocol)
		}
		total += int(r.len)
		if total > maxTotal {
			return fmt.Errorf("%w: chunks of more than %d bytes", ErrProtocol, maxTotal)
		}
		h.refs = append(h.refs, r)
	}
	h.body = b
	if h.long && len(b) != 0 {
		return fmt.Errorf("%w: a long message with %d inline bytes", ErrProtocol, len(b))
	}
	// Data chunks of an inline message must fall inside it; a long
	// message's are checked once it is pulled.
	if !h.long {
		if n := len(h.refs); n > 0 && int(h.refs[n-1].pos) > len(b) {
			return fmt.Errorf("%w: chunk at offset %d past the %d-byte message", ErrProtocol, h.refs[n-1].pos, len(b))
		}
	}
	return nil
}

package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/extent"
)

// Status is the outcome a reply reports.
type Status uint8

const (
	StatusOK Status = iota
	// StatusBusy: the request table is full or the chunk has a write in
	// progress. Retryable after a backoff.
	StatusBusy
	// StatusAuth: the capability is forged, expired, for another key, or
	// does not cover the request.
	StatusAuth
	// StatusBadRequest: the header does not parse or is inconsistent.
	StatusBadRequest
	// StatusUnknownOp: no execution context handles this message class.
	StatusUnknownOp
	// StatusStale: the replica's version does not follow the write's
	// (it missed a write, or the write was planned on an old layout).
	StatusStale
	// StatusIO: the node's storage failed.
	StatusIO
	// StatusReplica: a downstream replica failed or did not answer.
	StatusReplica
	// StatusAborted: the request was abandoned mid-message (idle client,
	// closed connection, failed handler).
	StatusAborted
	// StatusFenced: the chunk's replica set changed after the write was
	// planned (its capability's epoch is below the chunk's fence): fetch
	// a new layout and write there.
	StatusFenced
	// StatusGone: the chunk was deleted (its file removed or truncated
	// below it) and the node keeps a tombstone: no write may re-create
	// it. The writer's layout is stale; a fresh one says what became of
	// the file.
	StatusGone
	statusMax = StatusGone
)

var statusNames = [...]string{"ok", "busy", "auth", "bad-request", "unknown-op", "stale", "io", "replica", "aborted", "fenced", "gone"}

func (s Status) String() string {
	if s <= statusMax {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Retryable reports whether the same request may succeed later unchanged.
func (s Status) Retryable() bool { return s == StatusBusy }

// Error is a non-OK reply as a Go error.
type Error struct {
	Status Status
	Msg    string
}

// PartialError is a write failure below which some replica may have
// committed (Reply.Partial).
type PartialError struct{ Err error }

func (e *PartialError) Error() string {
	return e.Err.Error() + " (replicas below may have committed it)"
}
func (e *PartialError) Unwrap() error { return e.Err }

// IsPartial reports whether err says replicas may have committed.
func IsPartial(err error) bool {
	var pe *PartialError
	return errors.As(err, &pe)
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return "node: " + e.Status.String()
	}
	return "node: " + e.Status.String() + ": " + e.Msg
}

// Errorf builds a *Error.
func Errorf(s Status, format string, args ...any) *Error {
	return &Error{Status: s, Msg: fmt.Sprintf(format, args...)}
}

// Reply flags.
const (
	replyPartial = 1 << 0
	replySkipped = 1 << 1 // Skipped follows the fixed part
	replyCorrupt = 1 << 2
	replyExport  = 1 << 3 // an Export trailer follows Skipped
	replyFlags   = replyPartial | replySkipped | replyCorrupt | replyExport
)

// MaxMsg bounds a reply's error text.
const MaxMsg = 512

const replyFixed = 48

// Reply answers a request. For writes it carries the committed version
// and chunk length; for reads it also describes the data: DataLen bytes
// starting at chunk offset DataOff, which is aligned to BlockSize, and the
// CRC32C of each block they cover so the client can verify them.
type Reply struct {
	Status Status
	// Partial (on a failed write): replicas below the one replying may
	// have committed the write, so its version must not be reused.
	Partial bool
	// Corrupt (a fence's answer): the member knows blocks of its copy
	// fail their checksums, so it needs healing.
	Corrupt bool
	Version uint64
	// Skipped (a flat write's reservation): how many versions below
	// Version the reserved write skips because it covers an unresolved
	// write (see WriteHeader.Base, which is Version-1-Skipped).
	Skipped   uint64
	ChunkLen  uint64
	DataOff   uint64
	DataLen   uint64
	BlockSize uint32
	CRCs      []byte // 4 bytes per block, little endian; aliases the packet
	Msg       []byte // error text; aliases the packet
	// Export: references to the read's blocks in the node's exported
	// cache (Block 0: none).
	Export Export
}

// CRC returns block i's checksum.
func (r *Reply) CRC(i int) uint32 { return binary.LittleEndian.Uint32(r.CRCs[4*i:]) }

// NCRC is the number of checksums carried.
func (r *Reply) NCRC() int { return len(r.CRCs) / 4 }

// BadBlocks adds to bad the blocks of data, the reply's DataLen bytes from
// DataOff, that fail the checksums it carries, as chunk offsets. The
// caller has checked that the checksums cover data (NCRC blocks of
// BlockSize, the last possibly short).
func (r *Reply) BadBlocks(data []byte, bad extent.List) extent.List {
	bs := int(r.BlockSize)
	for i := range r.NCRC() {
		b := data[i*bs : min((i+1)*bs, len(data))]
		if crc32c.Checksum(b) != r.CRC(i) {
			bad = bad.Add(int64(r.DataOff)+int64(i*bs), int64(len(b)))
		}
	}
	return bad
}

// MinBlockSize and MaxBlockSize bound the checksum block size a node may
// use (and a read reply may claim).
const (
	MinBlockSize = 4 << 10
	MaxBlockSize = 1 << 20
)

// ReadData checks the shape of a reply to a read of [off, off+n) and
// every block against its checksum, and returns the requested bytes,
// zero-filled past the chunk's end, with the bytes among them that
// failed. buf holds the reply's data from its DataOff at offset 0.
func (rep *Reply) ReadData(buf []byte, off, n int64) ([]byte, extent.List, error) {
	bs := int64(rep.BlockSize)
	dOff, dLen := int64(rep.DataOff), int64(rep.DataLen)
	switch {
	case bs < MinBlockSize || bs > MaxBlockSize || bs&(bs-1) != 0:
		return nil, nil, fmt.Errorf("reply has block size %d", bs)
	case dOff%bs != 0 || dOff > off || off-dOff >= bs:
		return nil, nil, fmt.Errorf("reply data starts at %d for a read at %d", dOff, off)
	case dLen > int64(len(buf)) || dLen > off+n-dOff+bs:
		return nil, nil, fmt.Errorf("reply carries %d bytes for a read of %d", dLen, n)
	case int64(rep.NCRC()) != (dLen+bs-1)/bs:
		return nil, nil, fmt.Errorf("reply has %d checksums for %d bytes", rep.NCRC(), dLen)
	case dLen < n+off-dOff && dOff+dLen < int64(rep.ChunkLen):
		return nil, nil, fmt.Errorf("short reply (%d bytes) although the chunk has %d", dLen, rep.ChunkLen)
	case off-dOff+n > int64(len(buf)):
		return nil, nil, fmt.Errorf("read of %d bytes does not fit the %d-byte buffer", n, len(buf))
	}
	bad := rep.BadBlocks(buf[:dLen], nil).Clip(off, n)
	start := off - dOff
	data := buf[start : start+n]
	if have := dLen - start; have < n {
		clear(data[max(have, 0):])
	}
	return data, bad, nil
}

// Err returns nil for OK, else an *Error, wrapped in a *PartialError if
// the reply says so (allocates).
func (r *Reply) Err() error {
	if r.Status == StatusOK {
		return nil
	}
	var err error = &Error{Status: r.Status, Msg: string(r.Msg)}
	if r.Partial {
		err = &PartialError{Err: err}
	}
	return err
}

// ReplySize is the encoded size of a reply with n checksums and msg.
func ReplySize(n, msg int) int { return replyFixed + 4*n + min(msg, MaxMsg) }

// ExportSize is what an Export trailer of n references adds to a reply.
func ExportSize(n int) int { return exportFixed + exportRef*min(n, MaxExportRefs) }

// MaxReadBlocks is how many block checksums fit in a reply on a
// connection with the given MTU; a read may span at most that many
// blocks. It lives here, beside the reply layout it derives from, so the
// client can size its reads without linking the node's policy package.
func MaxReadBlocks(mtu int) int { return (mtu - ReplySize(0, MaxMsg)) / 4 }

// AppendReply encodes r with crcs as its checksums and msg as its text
// (r.CRCs and r.Msg are ignored; they are for decoding).
func AppendReply(b []byte, r *Reply, crcs []uint32, msg string) []byte {
	if len(msg) > MaxMsg {
		msg = msg[:MaxMsg]
	}
	b = append(b, byte(OpReply), byte(r.Status))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(crcs)))
	b = binary.LittleEndian.AppendUint64(b, r.Version)
	b = binary.LittleEndian.AppendUint64(b, r.ChunkLen)
	b = binary.LittleEndian.AppendUint64(b, r.DataOff)
	b = binary.LittleEndian.AppendUint64(b, r.DataLen)
	b = binary.LittleEndian.AppendUint32(b, r.BlockSize)
	var flags byte
	if r.Partial {
		flags |= replyPartial
	}
	if r.Skipped > 0 {
		flags |= replySkipped
	}
	if r.Corrupt {
		flags |= replyCorrupt
	}
	if r.Export.Block != 0 && len(r.Export.List) > 0 {
		flags |= replyExport
	}
	b = append(b, flags, 0, 0, 0)
	if r.Skipped > 0 {
		b = binary.LittleEndian.AppendUint64(b, r.Skipped)
	}
	if flags&replyExport != 0 {
		b = appendExport(b, &r.Export)
	}
	for _, c := range crcs {
		b = binary.LittleEndian.AppendUint32(b, c)
	}
	return append(b, msg...)
}

// AppendStatus encodes a reply that carries only a status and text.
func AppendStatus(b []byte, s Status, msg string) []byte {
	return AppendReply(b, &Reply{Status: s}, nil, msg)
}

// AppendError encodes a reply for err: its status, its text without the
// "node: status:" prefix a *Error adds (the receiver adds it back), and
// whether it is partial.
func AppendError(b []byte, err error) []byte {
	r := Reply{Status: StatusIO, Partial: IsPartial(err)}
	msg := err.Error()
	var we *Error
	if errors.As(err, &we) {
		r.Status, msg = we.Status, we.Msg
	}
	return AppendReply(b, &r, nil, msg)
}

// StatusOf maps an error to the status a reply should carry.
func StatusOf(err error) Status {
	var we *Error
	if errors.As(err, &we) {
		return we.Status
	}
	return StatusIO
}

// ParseReply decodes a reply.
func ParseReply(b []byte, r *Reply) error {
	if len(b) < replyFixed {
		return malformed("reply of %d bytes, need %d", len(b), replyFixed)
	}
	if Op(b[0]) != OpReply {
		return malformed("op %d is not reply", b[0])
	}
	r.Status = Status(b[1])
	if r.Status > statusMax {
		return malformed("unknown status %d", b[1])
	}
	msgLen := int(binary.LittleEndian.Uint16(b[2:]))
	n := int(binary.LittleEndian.Uint32(b[4:]))
	r.Version = binary.LittleEndian.Uint64(b[8:])
	r.ChunkLen = binary.LittleEndian.Uint64(b[16:])
	r.DataOff = binary.LittleEndian.Uint64(b[24:])
	r.DataLen = binary.LittleEndian.Uint64(b[32:])
	r.BlockSize = binary.LittleEndian.Uint32(b[40:])
	if msgLen > MaxMsg {
		return malformed("reply text of %d bytes", msgLen)
	}
	if b[44]&^replyFlags != 0 || b[45] != 0 || b[46] != 0 || b[47] != 0 {
		return malformed("reserved bytes set")
	}
	r.Partial = b[44]&replyPartial != 0
	r.Corrupt = b[44]&replyCorrupt != 0
	rest := b[replyFixed:]
	r.Skipped = 0
	if b[44]&replySkipped != 0 {
		if len(rest) < 8 {
			return malformed("reply flagged with skipped versions lacks their count")
		}
		r.Skipped = binary.LittleEndian.Uint64(rest)
		rest = rest[8:]
		if r.Skipped == 0 || r.Skipped >= r.Version {
			return malformed("%d versions skipped below version %d", r.Skipped, r.Version)
		}
	}
	r.Export = Export{}
	if b[44]&replyExport != 0 {
		var err error
		if rest, err = parseExport(rest, &r.Export); err != nil {
			return err
		}
	}
	if n > len(rest)/4 || 4*n+msgLen != len(rest) {
		return malformed("reply with %d checksums and %d text bytes in %d bytes", n, msgLen, len(rest))
	}
	r.CRCs = rest[:4*n]
	r.Msg = rest[4*n:]
	if r.DataOff+r.DataLen < r.DataOff {
		return malformed("data range overflows")
	}
	return nil
}

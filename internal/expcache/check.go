package expcache

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/crc32c"
)

// ErrStale says an optimistic read did not get the block its reference
// names: the slot was refilled, invalidated or changing during the copy,
// or the bytes do not match their checksum. It is not a failure of the
// node or the data: the reader falls back to an RPC, which returns a
// fresh reference.
var ErrStale = errors.New("expcache: stale reference")

// Check is the reader's side of an optimistic read of r: slot is the
// copy of the whole slot (header and block) the first one-sided read
// made, gen the generation word a second one-sided read, issued after
// the first completed, found. It returns the block's valid bytes (within
// slot) if they are the fill r names, else an error wrapping ErrStale.
//
// Why two reads suffice: the node makes a slot's generation odd before
// it changes a byte and gives it a value never used before when done,
// so it never returns to r.Gen once it has left it. If gen (read after
// every byte of the copy) is still r.Gen, no change had begun when any
// byte was copied. This needs the copy's loads to complete before the
// second read's, which holds for two operations on one fabric connection
// (served in order) and for a copy then a load on x86's ordered loads;
// the CRC over the bytes is a second, independent line.
func Check(r Ref, slot []byte, gen uint64, blockSize int) ([]byte, error) {
	if len(slot) != HeaderSize+blockSize {
		return nil, fmt.Errorf("%w: copied %d bytes of a %d-byte slot", ErrStale, len(slot), HeaderSize+blockSize)
	}
	h := slot[:HeaderSize]
	switch {
	case r.Gen == 0 || r.Gen&1 != 0:
		return nil, fmt.Errorf("%w: reference generation %d is not one a fill gives", ErrStale, r.Gen)
	case gen != r.Gen:
		return nil, fmt.Errorf("%w: slot %d's generation is %d, the reference's %d", ErrStale, r.Slot, gen, r.Gen)
	case binary.LittleEndian.Uint64(h[offGen:]) != r.Gen:
		return nil, fmt.Errorf("%w: the copied header is of generation %d, the reference's %d", ErrStale, binary.LittleEndian.Uint64(h[offGen:]), r.Gen)
	}
	n := binary.LittleEndian.Uint32(h[offLen:])
	switch {
	case binary.LittleEndian.Uint64(h[offChunk:]) != uint64(r.Chunk),
		binary.LittleEndian.Uint64(h[offBlock:]) != r.Block,
		binary.LittleEndian.Uint64(h[offVersion:]) != r.Version,
		n != r.Len:
		return nil, fmt.Errorf("%w: slot %d holds another block than the reference names", ErrStale, r.Slot)
	case int(n) > blockSize:
		return nil, fmt.Errorf("%w: slot %d claims %d bytes of a %d-byte block", ErrStale, r.Slot, n, blockSize)
	}
	data := slot[HeaderSize : HeaderSize+int(n)]
	if crc32c.Checksum(data) != binary.LittleEndian.Uint32(h[offCRC:]) {
		return nil, fmt.Errorf("%w: slot %d's bytes do not match their checksum", ErrStale, r.Slot)
	}
	return data, nil
}

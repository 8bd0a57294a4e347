package oncrpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/sluicefs/sluice/internal/xdr"
)

// Record marking (RFC 5531 §11): a record is a sequence of fragments, each
// behind a four-byte header whose high bit marks the last fragment and
// whose other 31 bits are the fragment's length.
const (
	lastFragment uint32 = 1 << 31
	maxFragment         = 1<<31 - 1

	// maxFragments bounds the fragments of one record: empty fragments
	// add nothing to its length, so the byte limit alone would let a
	// sender keep a reader looping forever on one record.
	maxFragments = 1024

	// growStep is the most a record buffer grows ahead of the bytes that
	// arrived (beyond doubling what it holds): a header's claimed length
	// is not trusted with memory.
	growStep = 64 << 10
)

// ErrRecordTooLarge is a record longer than the reader's limit, or with
// more fragments than a record may have. The stream cannot be
// resynchronised after it.
var ErrRecordTooLarge = errors.New("oncrpc: record too large")

// ReadRecord reads one record (all its fragments) from r into buf[:0] and
// returns it. A record longer than max bytes, or of more than 1024
// fragments, is ErrRecordTooLarge. The buffer grows only as data arrives,
// to at most twice what has arrived plus 64 KiB, and never past max: a
// header claiming 2 GiB allocates nothing until the bytes come. io.EOF is
// a stream that ends cleanly between records, io.ErrUnexpectedEOF one that
// ends inside a record. On an error the result is empty but keeps buf's
// (possibly grown) memory for reuse.
func ReadRecord(r io.Reader, buf []byte, max int) ([]byte, error) {
	buf = buf[:0]
	for frags := 0; ; frags++ {
		if frags == maxFragments {
			return buf[:0], fmt.Errorf("%w: over %d fragments", ErrRecordTooLarge, maxFragments)
		}
		// Read the header into spare room when there is some, sparing an
		// allocation per fragment; the data overwrites it.
		var hdr []byte
		if cap(buf)-len(buf) >= 4 {
			hdr = buf[len(buf) : len(buf)+4]
		} else {
			hdr = make([]byte, 4)
		}
		if _, err := io.ReadFull(r, hdr); err != nil {
			if frags > 0 && err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf[:0], err
		}
		h := binary.BigEndian.Uint32(hdr)
		n, last := int(h&^lastFragment), h&lastFragment != 0
		if n > max-len(buf) {
			return buf[:0], fmt.Errorf("%w: over %d bytes", ErrRecordTooLarge, max)
		}
		var err error
		if buf, err = readFragment(r, buf, n, last, max); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return buf[:0], err
		}
		if last {
			return buf, nil
		}
	}
}

// readFragment appends n bytes from r to buf, growing it only as they
// arrive; len(buf)+n <= limit.
func readFragment(r io.Reader, buf []byte, n int, last bool, limit int) ([]byte, error) {
	for n > 0 {
		if len(buf) == cap(buf) {
			// Double what is held (amortised copying over many
			// fragments), but ahead of the arrived bytes by at most
			// growStep; the last fragment needs no room after it.
			c := max(2*cap(buf), len(buf)+min(n, growStep))
			if last {
				c = min(c, len(buf)+n)
			}
			nb := make([]byte, len(buf), min(c, limit))
			copy(nb, buf)
			buf = nb
		}
		k, err := io.ReadFull(r, buf[len(buf):len(buf)+min(n, cap(buf)-len(buf))])
		buf = buf[:len(buf)+k]
		n -= k
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// WriteRecord writes rec as one last fragment, with one vectored write on
// a TCP connection (rec is not copied).
func WriteRecord(w io.Writer, rec []byte) error {
	if len(rec) > maxFragment {
		return fmt.Errorf("%w: %d bytes", ErrRecordTooLarge, len(rec))
	}
	hdr := binary.BigEndian.AppendUint32(make([]byte, 0, 4), lastFragment|uint32(len(rec)))
	bufs := net.Buffers{hdr}
	if len(rec) > 0 { // some conns (net.Pipe) block on an empty write
		bufs = append(bufs, rec)
	}
	_, err := bufs.WriteTo(w)
	return err
}

// writeChunked writes rec as one last fragment with each chunk's data
// (and padding) spliced in at its position, in one vectored write: the
// data is not copied. It returns the record's length.
func writeChunked(w io.Writer, rec []byte, chunks []xdr.Chunk) (int, error) {
	if len(chunks) == 0 {
		return len(rec), WriteRecord(w, rec)
	}
	n := len(rec)
	for _, c := range chunks {
		n += len(c.Data) + xdr.Pad(len(c.Data))
	}
	if n > maxFragment {
		return n, fmt.Errorf("%w: %d bytes", ErrRecordTooLarge, n)
	}
	var pad [4]byte
	bufs := make(net.Buffers, 0, 2+3*len(chunks))
	bufs = append(bufs, binary.BigEndian.AppendUint32(make([]byte, 0, 4), lastFragment|uint32(n)))
	at := 0
	for _, c := range chunks {
		if c.Pos < at || c.Pos > len(rec) {
			return n, fmt.Errorf("%w at %d", xdr.ErrChunk, c.Pos)
		}
		if c.Pos > at {
			bufs = append(bufs, rec[at:c.Pos])
		}
		bufs = append(bufs, c.Data)
		if p := xdr.Pad(len(c.Data)); p > 0 {
			bufs = append(bufs, pad[:p])
		}
		at = c.Pos
	}
	if at < len(rec) {
		bufs = append(bufs, rec[at:])
	}
	_, err := bufs.WriteTo(w)
	return n, err
}

package store

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// Commit-time checksum maintenance.
//
// Invariant, per chunk: block i has a stored CRC, or it is all zeros (it
// never held data). Page values are dense up to their last stored entry.
// A write changes the CRCs of:
//   - the blocks it covers: Place accumulated the covered part of each; the
//     first and last block may also hold bytes the write did not cover,
//     whose CRC is read from the chunk file (those bytes are committed data
//     or a hole, untouched by this write) and combined;
//   - the old last block, if the chunk grows and the write does not cover
//     it: it grows by zeros, so its CRC is extended arithmetically.
// Blocks in the hole between the old end and the write need nothing.

// stageChecksums completes the write's block CRCs and adds the changed
// checksum pages to b. buf is scratch for reading edge bytes.
func (w *Write) stageChecksums(b *pebble.Batch, buf []byte) error {
	s := w.s
	if w.end > w.off {
		lb := w.fb + int64(len(w.crcs)) - 1
		if err := w.finishEdge(w.fb, buf); err != nil {
			return err
		}
		if lb != w.fb {
			if err := w.finishEdge(lb, buf); err != nil {
				return err
			}
		}
	}

	// The old last block grows with zeros if the chunk grows past it and
	// the write does not cover it (it then lies before the write's blocks).
	bsize := int64(s.blockSize)
	grow := int64(-1)
	if L0 := w.old.Length; w.newLen > L0 && L0%bsize != 0 {
		if k := L0 >> s.blockShift; w.end == w.off || k < w.fb {
			grow = k
		}
	}

	var entries []uint32
	var val []byte
	put := func(page int64) error {
		val = appendPage(val[:0], entries)
		if err := b.Set(pageKey(w.id, page), val, nil); err != nil {
			return fmt.Errorf("batch checksum page %d: %w", page, err)
		}
		return nil
	}
	growPage := int64(-1)
	if grow >= 0 {
		growPage = grow / crcsPerPage
	}
	// The grown block's page, when the write's blocks do not also touch it.
	if grow >= 0 && (w.end == w.off || growPage != w.fb/crcsPerPage) {
		var err error
		if entries, err = s.loadPage(w.id, growPage, entries[:0]); err != nil {
			return err
		}
		if w.growBlock(entries, grow, growPage) {
			if err := put(growPage); err != nil {
				return err
			}
		}
	}
	if w.end == w.off {
		return nil
	}

	lb := w.fb + int64(len(w.crcs)) - 1
	for page := w.fb / crcsPerPage; page <= lb/crcsPerPage; page++ {
		start := page * crcsPerPage
		from, to := max(w.fb, start), min(lb, start+crcsPerPage-1) // blocks set in this page
		entries = entries[:0]
		if from != start || to != start+crcsPerPage-1 {
			// Partly covered: keep the other entries.
			var err error
			if entries, err = s.loadPage(w.id, page, entries); err != nil {
				return err
			}
			if page == growPage {
				w.growBlock(entries, grow, growPage)
			}
		}
		// Blocks between the page's last entry and the write are holes
		// before data, hence full blocks of zeros.
		for int64(len(entries)) < from-start {
			entries = append(entries, s.zeroBlockCRC)
		}
		for int64(len(entries)) <= to-start {
			entries = append(entries, 0) // set just below
		}
		copy(entries[from-start:], w.crcs[from-w.fb:to-w.fb+1])
		if err := put(page); err != nil {
			return err
		}
	}
	return nil
}

// growBlock extends block k's stored CRC (if any) by the zeros the chunk
// grows by. It reports whether it changed entries.
func (w *Write) growBlock(entries []uint32, k, page int64) bool {
	i := k - page*crcsPerPage
	if i >= int64(len(entries)) {
		return false // no entry: the block is all zeros and stays so
	}
	bsize := int64(w.s.blockSize)
	ext := min((k+1)*bsize, w.newLen) - w.old.Length
	entries[i] = crcCombine(entries[i], crcZeros(ext), ext)
	return true
}

// finishEdge completes block i's CRC with the bytes of the block the write
// does not cover: committed bytes before the write's start, or after its
// end up to the block's end. They are read from the chunk file, which the
// write does not modify there (overwrites are staged). They were checked
// against their own checksum when the write began (checkEdges).
func (w *Write) finishEdge(i int64, buf []byte) error {
	bsize := int64(w.s.blockSize)
	s0 := i * bsize
	e0 := min(s0+bsize, w.newLen)
	segS, segE := max(s0, w.off), min(e0, w.end)
	crc := w.crcs[i-w.fb]
	if segS > s0 {
		pre, err := crcOfFile(w, s0, segS, buf)
		if err != nil {
			return err
		}
		crc = crcCombine(pre, crc, segE-segS)
	}
	if segE < e0 {
		suf, err := crcOfFile(w, segE, e0, buf)
		if err != nil {
			return err
		}
		crc = crcCombine(crc, suf, e0-segE)
	}
	w.crcs[i-w.fb] = crc
	return nil
}

// checkEdges verifies, as the write begins, the committed bytes of the
// (at most two) blocks it covers in part: their checksum will be combined
// over those bytes, and a CRC combined over corrupt bytes would vouch for
// them, hiding the corruption for good. A bad edge block fails the write
// with ErrCorrupt (and is reported) before anything is placed or
// forwarded; once the copy is healed the write goes through. The write
// owns the chunk from here to its commit, so the bytes cannot change in
// between.
func (w *Write) checkEdges() error {
	if w.end == w.off {
		return nil
	}
	bsize := int64(w.s.blockSize)
	fb, lb := w.off>>w.s.blockShift, (w.end-1)>>w.s.blockShift
	var bp *[]byte
	for i := fb; i <= lb; i += max(1, lb-fb) {
		s0 := i * bsize
		e0 := min(s0+bsize, w.newLen)
		segS, segE := max(s0, w.off), min(e0, w.end)
		if kept := min(s0+bsize, w.old.Length); s0 < kept && (segS > s0 || segE < e0) {
			if bp == nil {
				bp = w.s.getCopyBuf()
				defer w.s.putCopyBuf(bp)
			}
			if err := w.checkOldBlock(i, s0, kept, *bp); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOldBlock verifies block i's committed bytes [s0, kept) against the
// checksum stored before this write.
func (w *Write) checkOldBlock(i, s0, kept int64, buf []byte) error {
	s := w.s
	entries, err := s.loadPage(w.id, i/crcsPerPage, nil)
	if err != nil {
		return err
	}
	got, err := crcOfFile(w, s0, kept, buf)
	if err != nil {
		return err
	}
	if want := s.storedCRC(entries, i, w.old.Length); got != want {
		bad := extent.List{{Off: s0, Len: kept - s0}}
		s.noteCorrupt(w.id, w.old.Version, bad)
		return fmt.Errorf("the block at %d, which the write covers in part, fails its checksum (crc %#08x, stored %#08x): %w", s0, got, want, ErrCorrupt)
	}
	return nil
}

// crcOfFile returns the CRC32C of the chunk file's bytes [from, to).
func crcOfFile(w *Write, from, to int64, buf []byte) (uint32, error) {
	var crc uint32
	for from < to {
		p := buf[:min(int64(len(buf)), to-from)]
		if err := readFull(w.f, p, from); err != nil {
			return 0, fmt.Errorf("read block edge [%d, %d): %w", from, to, err)
		}
		crc = crc32c.Update(crc, p)
		from += int64(len(p))
	}
	return crc, nil
}

// storedCRC is block i's checksum in a chunk of the given length, from
// entries, the checksum page holding it: a block past the page's last
// entry never held data, so it is zeros.
func (s *Store) storedCRC(entries []uint32, i, length int64) uint32 {
	bsize := int64(s.blockSize)
	switch idx := i % crcsPerPage; {
	case idx < int64(len(entries)):
		return entries[idx]
	case (i+1)*bsize <= length:
		return s.zeroBlockCRC
	default:
		return crcZeros(length - i*bsize) // the last block
	}
}

// loadPage appends the stored CRCs of a checksum page to dst (nothing if
// the page does not exist).
func (s *Store) loadPage(id ids.ChunkID, page int64, dst []uint32) ([]uint32, error) {
	v, closer, err := s.db.Get(pageKey(id, page))
	if errors.Is(err, pebble.ErrNotFound) {
		return dst, nil
	}
	if err != nil {
		return dst, fmt.Errorf("read checksum page %d: %w", page, err)
	}
	defer closer.Close()
	dst, err = decodePage(dst, v)
	if err != nil {
		return dst, fmt.Errorf("checksum page %d: %w", page, err)
	}
	return dst, nil
}

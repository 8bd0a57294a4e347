package store

import (
	"fmt"
	"hash/crc32"

	"github.com/sluicefs/sluice/internal/ids"
)

// Verify re-reads every block of id and checks it against its stored
// checksum, returning ErrCorrupt naming the first bad block. It works a
// checksum page (256 blocks) per read view so a scrub never holds off
// commits for long; a commit landing in between is simply verified from
// the next page on.
func (s *Store) Verify(id ids.ChunkID) error {
	buf := make([]byte, s.blockSize)
	var sums []uint32
	for first := int64(0); ; first += crcsPerPage {
		r, err := s.OpenRead(id)
		if err != nil {
			return fmt.Errorf("store: verify: %w", err)
		}
		err = r.verifyPage(first, buf, &sums)
		r.Close()
		if err != nil || first+crcsPerPage >= r.numBlocks() {
			return err
		}
	}
}

// verifyPage checks blocks [first, first+crcsPerPage) that exist.
func (r *Read) verifyPage(first int64, buf []byte, sums *[]uint32) error {
	nb := r.numBlocks()
	if first >= nb {
		return nil
	}
	n := min(crcsPerPage, nb-first)
	var err error
	*sums, err = r.Checksums(int(first), int(n), (*sums)[:0])
	if err != nil {
		return fmt.Errorf("store: verify %v: %w", r.id, err)
	}
	bsize := int64(r.s.blockSize)
	for j, want := range *sums {
		i := first + int64(j)
		start := i * bsize
		p := buf[:min(bsize, r.info.Length-start)]
		if err := readFull(r.f, p, start); err != nil {
			return fmt.Errorf("store: verify %v block %d: %w", r.id, i, err)
		}
		if got := crc32.Checksum(p, castagnoli); got != want {
			return fmt.Errorf("store: verify %v v%d: block %d [%d, %d) has crc %#08x, want %#08x: %w",
				r.id, r.info.Version, i, start, start+int64(len(p)), got, want, ErrCorrupt)
		}
	}
	return nil
}

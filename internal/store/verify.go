package store

import (
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// maxSuspectExtents bounds the bad extents remembered per chunk (see
// Suspect): one more than a report can list, so that a longer list still
// reads as "more than can be said".
const maxSuspectExtents = 257

// Verify re-reads every block of id and checks it against its stored
// checksum. It returns the blocks that fail — or cannot be read at all
// (an I/O error on the disk) — merged into extents of chunk offsets, and
// then an error wrapping ErrCorrupt that names the first. A copy that
// cannot be read as a whole (its file gone, its checksums unreadable) is
// bad throughout: ErrUnreadable, with [0, Length) as the bad extent. It
// works a checksum page (256 blocks) per read view so a scrub never holds
// off commits for long; a commit landing in between is simply verified
// from the next page on. Bad blocks found are also noted (see Suspect)
// and reported to Options.OnCorrupt.
func (s *Store) Verify(id ids.ChunkID) (extent.List, error) { return s.verify(id, true) }

// BadBlocks is Verify for a chunk known to be corrupt (a repair healing
// it): what it finds is not noted or reported again.
func (s *Store) BadBlocks(id ids.ChunkID) (extent.List, error) { return s.verify(id, false) }

func (s *Store) verify(id ids.ChunkID, note bool) (extent.List, error) {
	buf := make([]byte, s.blockSize)
	var sums []uint32
	var bad extent.List
	var first error
	var version uint64
	for page := int64(0); ; page += crcsPerPage {
		r, err := s.OpenRead(id)
		if err == nil {
			version = r.info.Version
			bad, err = r.verifyPage(page, buf, &sums, bad)
		}
		if errors.Is(err, ErrCorrupt) {
			// The copy is unreadable as a whole: bad throughout.
			if r != nil {
				r.Close()
			}
			info, serr := s.Stat(id)
			if serr != nil || info.Length == 0 {
				return bad, fmt.Errorf("store: verify %v: %w", id, err)
			}
			bad = extent.List{{Off: 0, Len: info.Length}}
			if note {
				s.noteCorrupt(id, info.Version, bad)
			}
			return bad, fmt.Errorf("store: verify %v: %w (%w)", id, ErrUnreadable, err)
		}
		if err != nil {
			if r != nil {
				r.Close()
			}
			return bad, fmt.Errorf("store: verify: %w", err)
		}
		last := page+crcsPerPage >= r.numBlocks()
		r.Close()
		if first == nil && len(bad) > 0 {
			first = fmt.Errorf("store: verify %v v%d: block at %d fails its checksum (%d bad bytes in %d extents): %w",
				id, version, bad[0].Off, bad.Bytes(), len(bad), ErrCorrupt)
		}
		if last {
			break
		}
	}
	if len(bad) == 0 {
		s.suspects.clear(id, version)
		return nil, nil
	}
	if note {
		s.noteCorrupt(id, version, bad)
	}
	return bad, first
}

// verifyPage checks blocks [first, first+crcsPerPage) that exist and adds
// those that fail, or cannot be read, to bad.
func (r *Read) verifyPage(first int64, buf []byte, sums *[]uint32, bad extent.List) (extent.List, error) {
	nb := r.numBlocks()
	if first >= nb {
		return bad, nil
	}
	n := min(crcsPerPage, nb-first)
	var err error
	*sums, err = r.Checksums(int(first), int(n), (*sums)[:0])
	if err != nil {
		return bad, fmt.Errorf("store: verify %v: %w", r.id, err)
	}
	bsize := int64(r.s.blockSize)
	for j, want := range *sums {
		i := first + int64(j)
		start := i * bsize
		p := buf[:min(bsize, r.info.Length-start)]
		if err := readFull(r.f, p, start); err != nil || crc32c.Checksum(p) != want {
			bad = bad.Add(start, int64(len(p)))
		}
	}
	return bad, nil
}

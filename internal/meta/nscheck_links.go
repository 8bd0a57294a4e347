package meta

import (
	"encoding/binary"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The link index (scope.go) is derived from the entries, so the check
// does not report it as a problem of the namespace: it finds records
// that disagree with the entries, and repair rewrites them (after the
// entries themselves are repaired). Check, the invariant tests run,
// counts any disagreement as a fault: a wrong index would let a confined
// principal in, or keep it out of its own files.

// linkRef is a name of a non-directory inode.
type linkRef struct {
	ino, parent ids.Ino
	name        string
}

// checkLink notes an entry of a non-directory whose index record is
// missing.
func (c *checker) checkLink(parent ids.Ino, name string, d dirent) error {
	if d.Type == metaapi.TypeDir {
		return nil
	}
	_, found, err := getRaw(c.r, linkKey(d.Ino, parent, name))
	if err == nil && !found {
		c.indexFaults = append(c.indexFaults, linkRef{d.Ino, parent, name})
	}
	return err
}

// scanLinks notes index records no entry agrees with.
func (c *checker) scanLinks() error {
	return c.scan(pLink, func(k, _ []byte) (bool, error) {
		if len(k) < 17 {
			c.metadataf("malformed name index key %x", k)
			return true, nil
		}
		ref := linkRef{ids.Ino(binary.BigEndian.Uint64(k[1:9])), ids.Ino(binary.BigEndian.Uint64(k[9:17])), string(k[17:])}
		d, found, err := loadEntry(c.r, ref.parent, ref.name)
		if err != nil || !found || d.Ino != ref.ino || d.Type == metaapi.TypeDir {
			c.indexFaults = append(c.indexFaults, ref)
		}
		return true, nil
	})
}

func (r linkRef) String() string {
	return fmt.Sprintf("name index: inode %d as %q in directory %d disagrees with the entries", r.ino, r.name, r.parent)
}

// fixLinks makes each index record found wrong agree with the entry it
// names, as the entries are now.
func fixLinks(tx *txn, batch []linkRef) (fixed, changed int64, err error) {
	for _, ref := range batch {
		d, found, err := tx.entry(ref.parent, ref.name)
		if err != nil {
			// Unreadable: the entry is the problem (a dangling entry),
			// and has no index record.
			d, found = dirent{}, false
		}
		names := found && d.Ino == ref.ino && d.Type != metaapi.TypeDir
		if names {
			err = tx.b.Set(linkKey(ref.ino, ref.parent, ref.name), nil, nil)
		} else {
			err = tx.b.Delete(linkKey(ref.ino, ref.parent, ref.name), nil)
		}
		if err != nil {
			return fixed, changed, err
		}
		fixed++
	}
	return fixed, changed, nil
}

// indexFaultErrors renders the faults for Check.
func indexFaultErrors(refs []linkRef) []error {
	var errs []error
	for _, r := range refs[:min(len(refs), metaapi.MaxCheckExamples)] {
		errs = append(errs, fmt.Errorf("%s", r))
	}
	if more := len(refs) - metaapi.MaxCheckExamples; more > 0 {
		errs = append(errs, fmt.Errorf("name index: %d more", more))
	}
	return errs
}

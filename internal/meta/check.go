package meta

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The namespace half of `sluice check`: an fsck of meta's own records.
// It verifies the invariants that tie them together: every entry names a
// live inode of the recorded type in a live directory; link counts match
// the names (directories: 2 plus their subdirectories); each directory has
// exactly one name, knows its parent and is reachable from the root; every
// other inode has a name or is a file kept open after its removal (an
// orphan record); chunks belong to files and are indexed by their ids
// below the counter, and a file counting its chunks (st_blocks) has as
// many records; the counters match what is stored; the lock tables
// agree. nscheck.go walks the records, nsrepair.go fixes what is safe.
//
// It reads a pebble snapshot taken under the read lock, so it judges one
// consistent state without holding off mutations while it walks a large
// namespace. It keeps a small summary of every inode in memory (about 100
// bytes each, plus the names of directories), as fsck does.

// NamespaceCheck is what CheckNamespace walked and found: each kind of
// problem (dangling-entry, orphan-inode, link-count, metadata) found at
// least once, in that order, with every instance counted and at most
// metaapi.MaxCheckExamples examples. With repair, Repaired and Action say
// what was fixed and why the rest was left.
type NamespaceCheck struct {
	Files    int64 // inodes other than directories
	Dirs     int64
	Chunks   int64 // chunk records
	Problems []metaapi.CheckProblem
	// Path names an inode for an example (see checker.path), with the
	// directories as the check read them and names looked up in r (the
	// check's own snapshot is closed by then). Not safe for concurrent use.
	Path func(r pebble.Reader, ino ids.Ino) string

	// indexFaults: link index records found disagreeing with the
	// entries (rewritten by a repair; see nscheck_links.go).
	indexFaults []linkRef
}

// CheckNamespace checks meta's namespace and records (see above) and,
// with repair, fixes what is safe: it removes dangling entries, links
// orphan inodes into /lost+found (made if missing: root's, mode 0700) as
// "#<inode>", and sets wrong link counts to the names counted. It never
// frees an inode or a chunk; metadata problems are left to an operator.
// Each repair is made in a transaction that first makes sure what the
// snapshot showed still holds; what changed since is left for the next
// check.
func (s *Service) CheckNamespace(repair bool) (NamespaceCheck, error) {
	return s.checkNamespace(repair, nil)
}

// Check returns every problem CheckNamespace finds (its examples, and how
// many more of each kind), or nil when the namespace is consistent.
func (s *Service) Check() error {
	res, err := s.CheckNamespace(false)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range res.Problems {
		for _, e := range p.Examples {
			errs = append(errs, fmt.Errorf("%s: %s", p.Kind, e))
		}
		if more := p.Count - int64(len(p.Examples)); more > 0 {
			errs = append(errs, fmt.Errorf("%s: %d more", p.Kind, more))
		}
	}
	errs = append(errs, indexFaultErrors(res.indexFaults)...)
	return errors.Join(errs...)
}

// checkNamespace is CheckNamespace; tests pass hook, which runs at
// "walking" (the inodes read, the entries not yet) and "judged" (before
// any repair).
func (s *Service) checkNamespace(repair bool, hook func(stage string)) (NamespaceCheck, error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return NamespaceCheck{}, errClosed
	}
	snap := s.db.NewSnapshot()
	ctr := s.ctr
	nodes := make([]ids.NodeID, 0, len(s.nodes))
	for id := range s.nodes {
		nodes = append(nodes, id)
	}
	seen := s.dur.committed()
	// Close waits for it (the snapshot must be closed before the
	// database) and stops it early through s.stop.
	s.wg.Add(1)
	s.mu.RUnlock()
	defer s.wg.Done()
	defer snap.Close()
	// Judge (and repair from) only what is durable, as every read does.
	if err := s.dur.wait(seen); err != nil {
		return NamespaceCheck{}, err
	}
	if hook == nil {
		hook = func(string) {}
	}
	c := newChecker(snap, ctr, nodes, s.stop, repair)
	c.hook = hook
	if err := c.run(); err != nil {
		return NamespaceCheck{}, fmt.Errorf("checking the namespace: %w", err)
	}
	res := c.result()
	res.indexFaults = c.indexFaults
	hook("judged")
	if repair {
		if err := s.repairNamespace(c, &res); err != nil {
			return res, fmt.Errorf("repairing the namespace: %w", err)
		}
	}
	return res, nil
}

// result counts and renders what the checker found.
func (c *checker) result() NamespaceCheck {
	res := NamespaceCheck{Files: c.files, Dirs: c.dirs, Chunks: c.chunks, Path: func(r pebble.Reader, ino ids.Ino) string {
		c.r = r
		return c.path(ino)
	}}
	for k, t := range c.tallies {
		if t.count == 0 {
			continue
		}
		p := metaapi.CheckProblem{Kind: kindNames[k], Count: t.count}
		for _, ex := range t.examples {
			p.Examples = append(p.Examples, ex())
		}
		res.Problems = append(res.Problems, p)
	}
	return res
}

// problem returns the entry for kind k in res, adding it if needed.
func (res *NamespaceCheck) problem(k kind) *metaapi.CheckProblem {
	for i := range res.Problems {
		if res.Problems[i].Kind == kindNames[k] {
			return &res.Problems[i]
		}
	}
	res.Problems = append(res.Problems, metaapi.CheckProblem{Kind: kindNames[k]})
	return &res.Problems[len(res.Problems)-1]
}

// kind indexes the kinds of problem the namespace check reports.
type kind int

const (
	kDangling kind = iota
	kOrphan
	kLinks
	kMeta
	nKinds
)

var kindNames = [nKinds]metaapi.CheckKind{
	metaapi.CheckDanglingEntry, metaapi.CheckOrphanInode, metaapi.CheckLinkCount, metaapi.CheckMetadata,
}

// tally is one kind's count and its first examples, rendered once the
// walk is done (paths need every directory's name).
type tally struct {
	count    int64
	examples []func() string
}

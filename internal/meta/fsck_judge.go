package meta

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/inventory"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/repairplan"
)

// Judging a check: every chunk record against the copies the nodes
// listed, then the copies against the records.

// problems gathers problems by kind, with counts and a few examples.
type problems struct {
	byKind map[metaapi.CheckKind]*metaapi.CheckProblem
	order  []metaapi.CheckKind
}

// add counts one problem of kind; the example is formatted only if it is
// kept.
func (p *problems) add(kind metaapi.CheckKind, format string, args ...any) {
	pr := p.of(kind)
	pr.Count++
	if len(pr.Examples) < metaapi.MaxCheckExamples {
		pr.Examples = append(pr.Examples, fmt.Sprintf(format, args...))
	}
}

func (p *problems) of(kind metaapi.CheckKind) *metaapi.CheckProblem {
	if p.byKind == nil {
		p.byKind = map[metaapi.CheckKind]*metaapi.CheckProblem{}
	}
	pr := p.byKind[kind]
	if pr == nil {
		pr = &metaapi.CheckProblem{Kind: kind}
		p.byKind[kind] = pr
		p.order = append(p.order, kind)
	}
	return pr
}

// merge adds a problem found elsewhere (the namespace check's).
func (p *problems) merge(o metaapi.CheckProblem) {
	pr := p.of(o.Kind)
	pr.Count += o.Count
	pr.Repaired += o.Repaired
	pr.Action = cmp.Or(pr.Action, o.Action)
	pr.Examples = append(pr.Examples, o.Examples[:min(len(o.Examples), metaapi.MaxCheckExamples-len(pr.Examples))]...)
}

func (p *problems) list() []metaapi.CheckProblem {
	out := make([]metaapi.CheckProblem, 0, len(p.order))
	for _, k := range p.order {
		out = append(out, *p.byKind[k])
	}
	return out
}

// lazyString is a %s argument computed only when formatted.
type lazyString func() string

func (f lazyString) String() string { return f() }

// damagedChunk is a chunk whose copies --repair has restored.
type damagedChunk struct {
	ref    chunkRef
	id     ids.ChunkID
	copies map[ids.NodeID]extent.List // nil list: bad throughout
}

// judgeCheck compares every chunk record with what the nodes listed, and
// runs the namespace's check. It reads snapshots, holding no lock.
func (s *Service) judgeCheck(c *checkRun) (metaapi.CheckResp, error) {
	var res metaapi.CheckResp
	ns, err := s.CheckNamespace(c.repair)
	if err != nil {
		return res, err
	}
	res.Files, res.Dirs = ns.Files, ns.Dirs
	var p problems
	for _, pr := range ns.Problems { // the namespace's first
		p.merge(pr)
	}
	now, ctr, err := s.snapshot()
	if err != nil {
		return res, err
	}
	defer now.Close()
	var due []damagedChunk
	var last *inode // chunk keys are in inode order
	err = scan(now, []byte{pChunk}, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
		var rec chunkRec
		if len(k) != 17 || json.Unmarshal(val, &rec) != nil {
			return true, nil // the namespace check reports it
		}
		res.Chunks++
		ref := chunkRef{ids.Ino(beUint64(k[1:])), int64(beUint64(k[9:]))}
		if last == nil || last.Ino != ref.ino {
			in, err := loadInode(now, ref.ino)
			if err != nil {
				last = nil
				return true, nil // the namespace check reports it
			}
			last = in
		}
		a := last.Attr
		if !unchanged(c.before, k, &rec) || rec.Version == 0 {
			// Written, moved or removed during the check; or never
			// written (a write under way, or one that never completed:
			// it reads as zeros, and the next write or repair settles it).
			return true, nil
		}
		// Named (a path lookup) only if it makes an example.
		what := lazyString(func() string { return fmt.Sprintf("%s chunk %d (%v)", ns.Path(now, ref.ino), ref.index, rec.ID) })
		if a.ChunkSize > 0 && ref.index*a.ChunkSize >= a.Size {
			p.add(metaapi.CheckPastEOF, "%s: starts at %d, the file has %d bytes", what, ref.index*a.ChunkSize, a.Size)
		}
		want := 1
		if a.Policy != nil {
			want = a.Policy.Units()
		}
		seen := make([]copySeen, len(rec.Nodes))
		for i, n := range rec.Nodes {
			cn := c.nodes[n]
			if !cn.reached() {
				continue
			}
			h, held := cn.copies[rec.ID]
			seen[i] = copySeen{reached: true, held: held, version: h.Version, bad: h.Bad, badUnlisted: h.BadUnlisted}
		}
		j := judgeCopies(seen, rec.Version, a.Policy != nil && a.Policy.EC != nil)
		switch {
		case j.intact < want && j.unreached > 0:
			p.add(metaapi.CheckUnreached, "%s: %d of %d members on nodes that did not list their chunks", what, j.unreached, len(rec.Nodes))
		case j.intact < want:
			note := ""
			if rec.Reconciling {
				note = "; meta is repairing it"
			}
			p.add(metaapi.CheckBelowPolicy, "%s: %d of %d copies intact%s (%s%s)", what, j.intact, want, j.where, describeCopies(rec.Nodes, seen, rec.Version), note)
		}
		if j.behind {
			p.add(metaapi.CheckUnitVersions, "%s: units at versions %s, meta recorded %d", what, j.versions, rec.Version)
		}
		if j.intact < want && j.unreached == 0 || j.behind {
			due = append(due, damagedChunk{ref, rec.ID, damaged(rec.Nodes, seen, rec.Version)})
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	if err := s.judgeHeld(c, now, ctr, &p); err != nil {
		return res, err
	}
	res.Problems = p.list()
	if c.repair {
		s.repairChecked(res.Problems, due)
	}
	for i := range res.Problems {
		if res.Problems[i].Kind == metaapi.CheckUnknownCopy && res.Problems[i].Action == "" {
			res.Problems[i].Action = fmt.Sprintf("each is collected once the nodes' inventories have found it stray for --orphan-grace (%s); "+
				"a displaced one only once its chunk's recorded members all hold it whole (else it may be adopted: docs/backup.md)", s.opts.OrphanGrace)
		}
	}
	return res, nil
}

// unchanged reports whether chunk record k is as it was when the check
// began: same id, version and members.
func unchanged(before pebble.Reader, k []byte, rec *chunkRec) bool {
	var old chunkRec
	found, err := getJSON(before, k, &old)
	return err == nil && found && old.ID == rec.ID && old.Version == rec.Version && slices.Equal(old.Nodes, rec.Nodes)
}

// judgeHeld finds the copies nodes listed that no file needs there. A
// copy of a chunk whose record changed during the check (its file removed,
// the copy moved) is not judged.
func (s *Service) judgeHeld(c *checkRun, now pebble.Reader, ctr counters, p *problems) error {
	for _, n := range slices.Sorted(mapsKeys(c.nodes)) {
		cn := c.nodes[n]
		if !cn.reached() {
			continue
		}
		for _, id := range slices.Sorted(mapsKeys(cn.copies)) {
			r, err := copyRecord(now, n, id)
			if err != nil {
				continue // an index problem: the namespace check reports it
			}
			verdict := inventory.Judge(id, ctr.NextChunk, r)
			switch verdict {
			case inventory.Unknown, inventory.NotMember, inventory.Displaced:
				if then, err := copyRecord(c.before, n, id); err != nil || then != r {
					continue // the file removed, or the copy moved, during the check
				}
			case inventory.Ahead:
			default:
				continue
			}
			h := cn.copies[id]
			p.add(metaapi.CheckUnknownCopy, "%v on %v (version %d, %d bytes): %s", id, n, h.Version, h.Length, verdict.Kind())
		}
	}
	return nil
}

// mapsKeys iterates a map's keys.
func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// repairChecked has the copies found damaged (missing, behind, with bad
// blocks) restored: each is recorded corrupt on its chunk record, as a
// scrub's findings are once the scan has them, so status counts them,
// and the chunk is queued for reconciliation.
func (s *Service) repairChecked(ps []metaapi.CheckProblem, due []damagedChunk) {
	started := s.repairs.started.Load()
	queued := 0
	if started {
		for _, d := range due {
			if err := s.markCorrupt(d.ref, d.id, d.copies); err != nil {
				s.log.Warn("check: recording damaged copies", "chunk", d.id, "err", err)
				continue
			}
			s.repairs.add(d.ref, repairplan.Margin(0, 0), false)
			queued++
		}
	}
	for i := range ps {
		pr := &ps[i]
		switch pr.Kind {
		case metaapi.CheckBelowPolicy, metaapi.CheckUnitVersions:
			if !started {
				pr.Action = "left: this meta service repairs nothing by itself (--repair-parallel 0)"
				continue
			}
			pr.Repaired = int64(queued)
			pr.Action = fmt.Sprintf("%d chunks queued for reconciliation: meta restores them in the background (sluice status shows progress)", queued)
		case metaapi.CheckPastEOF:
			pr.Action = "left: a write extending the file may be under way"
		case metaapi.CheckUnreached:
			pr.Action = "left: run the check again once the nodes are up"
		}
	}
}

// copySeen is what a check saw of one member's copy.
type copySeen struct {
	reached     bool // its node listed a whole round
	held        bool // ... and this copy in it
	version     uint64
	bad         extent.List
	badUnlisted bool
}

// copyJudgement is the outcome of judging a chunk's copies.
type copyJudgement struct {
	intact    int    // the fewest intact copies of any byte
	where     string // where that is, if some bytes have more
	unreached int
	behind    bool   // stripe units behind the recorded version
	versions  string // the units' versions, when behind
}

// judgeCopies counts the intact copies of a chunk recorded at version:
// a member counts where its node listed the copy at that version (or
// later: a write under way), less its bad blocks. A stripe group with
// units behind the others is said so.
func judgeCopies(seen []copySeen, version uint64, ec bool) copyJudgement {
	var j copyJudgement
	bad := make([]extent.List, len(seen))
	absent := make([]bool, len(seen))
	versions := map[uint64]int{}
	for i, s := range seen {
		if !s.reached {
			j.unreached++
		}
		absent[i] = !s.reached || !s.held || s.version < version || s.badUnlisted
		bad[i] = s.bad
		if s.reached && s.held {
			versions[s.version]++
			j.behind = j.behind || ec && s.version < version
		}
	}
	j.intact = extent.MinGood(bad, absent)
	whole := 0
	for i := range seen {
		if !absent[i] {
			whole++
		}
	}
	if j.intact < whole {
		for _, seg := range extent.Segments(0, 1<<62, bad, absent) {
			if len(seg.Good) == j.intact {
				j.where = fmt.Sprintf(" at bytes %v", seg.Extent)
				break
			}
		}
	}
	if j.behind {
		var parts []string
		for v, n := range versions {
			parts = append(parts, fmt.Sprintf("%d×%d", n, v))
		}
		slices.Sort(parts)
		j.versions = strings.Join(parts, ", ")
	}
	return j
}

// damaged lists the members of a chunk whose copies are missing, behind
// version, or have bad blocks (nil: bad throughout).
func damaged(nodes []ids.NodeID, seen []copySeen, version uint64) map[ids.NodeID]extent.List {
	out := map[ids.NodeID]extent.List{}
	for i, s := range seen {
		switch {
		case !s.reached:
		case !s.held || s.version < version || s.badUnlisted:
			out[nodes[i]] = nil
		case len(s.bad) > 0:
			out[nodes[i]] = s.bad
		}
	}
	return out
}

// describeCopies says what is wrong with each member's copy.
func describeCopies(nodes []ids.NodeID, seen []copySeen, version uint64) string {
	var parts []string
	for i, s := range seen {
		switch {
		case !s.reached:
			parts = append(parts, fmt.Sprintf("%v not reached", nodes[i]))
		case !s.held:
			parts = append(parts, fmt.Sprintf("%v holds no copy", nodes[i]))
		case s.version < version:
			parts = append(parts, fmt.Sprintf("%v at version %d", nodes[i], s.version))
		case s.badUnlisted:
			parts = append(parts, fmt.Sprintf("%v has many bad blocks", nodes[i]))
		case len(s.bad) > 0:
			parts = append(parts, fmt.Sprintf("%v bad at %v", nodes[i], s.bad))
		}
	}
	return strings.Join(parts, "; ")
}

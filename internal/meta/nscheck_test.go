package meta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// byKind indexes a check's problems by kind.
func byKind(res NamespaceCheck) map[metaapi.CheckKind]metaapi.CheckProblem {
	out := map[metaapi.CheckKind]metaapi.CheckProblem{}
	for _, p := range res.Problems {
		out[p.Kind] = p
	}
	return out
}

func (f *fixture) checkNS(repair bool) NamespaceCheck {
	f.t.Helper()
	res, err := f.s.CheckNamespace(repair)
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

// dump is every record of meta.db, to compare states.
func (f *fixture) dump() string {
	f.t.Helper()
	var b bytes.Buffer
	if err := scan(f.s.db, nil, nil, func(k, v []byte) (bool, error) {
		fmt.Fprintf(&b, "%x=%x\n", k, v)
		return true, nil
	}); err != nil {
		f.t.Fatal(err)
	}
	return b.String()
}

// TestCheckBigNamespace: 5,000 entries with hundreds of problems of each
// repairable kind: every instance is counted, examples stay bounded,
// repair fixes them all (the orphans in /lost+found), a second check is
// clean and a second repair changes nothing.
func TestCheckBigNamespace(t *testing.T) {
	f := newFixture(t)
	const dirs, perDir = 50, 99
	for d := range dirs {
		f.mk("/", fmt.Sprintf("d%02d", d), metaapi.TypeDir, 0o755, root)
		for i := range perDir {
			f.mk(fmt.Sprintf("/d%02d", d), fmt.Sprintf("f%02d", i), metaapi.TypeFile, 0o644, root)
		}
	}
	want := map[metaapi.CheckKind]int64{}
	b := f.s.db.NewBatch()
	var dropped int64
	for d := range dirs {
		dir := f.ino(fmt.Sprintf("/d%02d", d))
		for i := range perDir {
			name := fmt.Sprintf("f%02d", i)
			a := f.attr(fmt.Sprintf("/d%02d/%s", d, name))
			switch n := d*perDir + i; {
			case n%7 == 0:
				b.Delete(inodeKey(a.Ino), nil)
				dropped++
				want[metaapi.CheckDanglingEntry]++
			case n%11 == 0:
				b.Delete(direntKey(dir, name), nil)
				want[metaapi.CheckOrphanInode]++
			case n%13 == 0:
				in, err := loadInode(f.s.db, a.Ino)
				if err != nil {
					t.Fatal(err)
				}
				in.Nlink += 2
				b.Set(inodeKey(a.Ino), mustJSON(in), nil)
				want[metaapi.CheckLinkCount]++
			}
		}
	}
	// A directory and all it holds cut off: one orphan; the root's
	// link count is one too high.
	b.Delete(direntKey(ids.RootIno, "d03"), nil)
	want[metaapi.CheckOrphanInode]++
	want[metaapi.CheckLinkCount]++
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	f.adjustCounters(func(c *counters) { c.Files -= dropped })

	res := f.checkNS(false)
	if res.Files != dirs*perDir-dropped || res.Dirs != dirs+1 {
		t.Errorf("walked %d files, %d dirs; want %d, %d", res.Files, res.Dirs, dirs*perDir-dropped, dirs+1)
	}
	got := byKind(res)
	if len(got) != len(want) {
		t.Errorf("kinds found %v, want %v", got, want)
	}
	for k, n := range want {
		p := got[k]
		if p.Count != n || len(p.Examples) != metaapi.MaxCheckExamples {
			t.Errorf("%s: count %d with %d examples, want %d with %d", k, p.Count, len(p.Examples), n, metaapi.MaxCheckExamples)
		}
		for _, e := range p.Examples {
			if e == "" || strings.Contains(e, "\n") {
				t.Errorf("%s: example %q", k, e)
			}
		}
	}
	if e := got[metaapi.CheckDanglingEntry].Examples[0]; !strings.HasPrefix(e, "/d00/f00: names inode ") {
		t.Errorf("dangling example %q does not name the entry's path", e)
	}
	if err := f.s.Check(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("dangling-entry: %d more", want[metaapi.CheckDanglingEntry]-10)) {
		t.Errorf("Check: %v", err)
	}

	res = f.checkNS(true)
	for k, p := range byKind(res) {
		if p.Repaired != want[k] || p.Count != want[k] {
			t.Errorf("%s: %d found, %d repaired (%s), want %d", k, p.Count, p.Repaired, p.Action, want[k])
		}
	}
	res = f.checkNS(false)
	if len(res.Problems) != 0 || res.Dirs != dirs+2 {
		t.Fatalf("after repair: %+v", res)
	}
	if n := len(f.names("/lost+found")); int64(n) != want[metaapi.CheckOrphanInode] {
		t.Errorf("/lost+found holds %d, want %d", n, want[metaapi.CheckOrphanInode])
	}
	if d03 := 2 + 3*(perDir+1); !f.exists(fmt.Sprintf("/lost+found/#%d/f01", d03)) { // inodes: d00, its files, d01...
		t.Errorf("d03's files are not under /lost+found: %v", f.names("/lost+found"))
	}
	before := f.dump()
	if res := f.checkNS(true); len(res.Problems) != 0 {
		t.Fatalf("second repair found %+v", res.Problems)
	}
	if f.dump() != before {
		t.Fatal("a second repair changed meta.db")
	}

	// A check gives up when the service closes (every 4,096 records).
	snap := f.s.db.NewSnapshot()
	defer snap.Close()
	stop := make(chan struct{})
	close(stop)
	if err := newChecker(snap, f.s.ctr, nil, stop, false).run(); !errors.Is(err, errClosed) {
		t.Fatalf("a check of a closing service: %v", err)
	}
}

// TestCheckHoldsNoLock: while a check walks the records and before it
// repairs, mutations go on (none waits for it), and it does not see
// them: it judges the one state it started from. Its repair leaves what
// changed since to the next check: a link added to a file with a wrong
// count and to an orphan, a file made under the number a dangling entry
// named.
func TestCheckHoldsNoLock(t *testing.T) {
	f := newFixture(t)
	f.tree("/a/", "/f", "/o", "/g", "/r")
	fIno, oIno, next := f.ino("/f"), f.ino("/o"), f.s.ctr.NextIno
	f.corrupt("nlink /f 5")
	f.corrupt("nlink /g 3")
	f.corrupt("drop-entry /o")
	f.corrupt(fmt.Sprintf("add-entry / x @%d file", next))
	// run runs fn as a client would, failing if it waits for the check.
	run := func(fn func() error) {
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a mutation waits for the check")
		}
	}
	res, err := f.s.checkNamespace(true, func(stage string) {
		switch stage {
		case "walking":
			run(func() error {
				if _, err := f.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: "new", Type: metaapi.TypeFile, Who: root}); err != nil {
					return err
				}
				return f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "r", Who: root})
			})
		case "judged":
			run(func() error {
				if _, err := f.s.Link(metaapi.LinkReq{Ino: fIno, NewParent: f.ino("/a"), NewName: "f2", Who: root}); err != nil {
					return err
				}
				_, err := f.s.Link(metaapi.LinkReq{Ino: oIno, NewParent: f.ino("/a"), NewName: "o", Who: root})
				return err
			})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 4 {
		t.Errorf("the check saw %d files, want the 4 it started from", res.Files)
	}
	got := byKind(res)
	for k, w := range map[metaapi.CheckKind][2]int64{
		metaapi.CheckDanglingEntry: {1, 0}, metaapi.CheckOrphanInode: {1, 0}, metaapi.CheckLinkCount: {2, 1},
	} {
		if p := got[k]; p.Count != w[0] || p.Repaired != w[1] || !strings.Contains(p.Action, "1 changed since the check read them") {
			t.Errorf("%s: %+v, want %d found, %d repaired, 1 changed", k, p, w[0], w[1])
		}
	}
	if len(got) != 3 {
		t.Errorf("found %+v", res.Problems)
	}
	if a := f.attr("/g"); a.Nlink != 1 {
		t.Errorf("/g has link count %d after repair", a.Nlink)
	}
	if a := f.attr("/f"); a.Nlink != 6 {
		t.Errorf("/f, changed since, has link count %d: the repair touched it", a.Nlink)
	}
	if !f.exists("/x") {
		t.Error("an entry naming a file made since was removed")
	}
	// The next check judges what is there now: /f has two names, /a/o
	// is /o's only one, the new file is also /x.
	res = f.checkNS(true)
	if p := byKind(res)[metaapi.CheckLinkCount]; len(res.Problems) != 1 || p.Count != 3 || p.Repaired != 3 {
		t.Errorf("second repair: %+v", res.Problems)
	}
	if a := f.attr("/f"); a.Nlink != 2 {
		t.Errorf("/f has link count %d", a.Nlink)
	}
	if f.exists("/lost+found") {
		t.Error("an orphan named since the check was linked into /lost+found")
	}
}

// TestCheckCloseWhileRepairing: a service closing under a check waits
// for it (its snapshot is closed before the database) and the check
// stops with EAGAIN rather than repairing a closed database.
func TestCheckCloseWhileRepairing(t *testing.T) {
	f := newFixture(t)
	f.tree("/f")
	f.corrupt("nlink /f 4")
	closed := make(chan error, 1)
	_, err := f.s.checkNamespace(true, func(stage string) {
		if stage != "judged" {
			return
		}
		go func() { closed <- f.s.Close() }()
		deadline := time.Now().Add(time.Minute)
		for !f.s.isClosed() {
			if time.Now().After(deadline) {
				t.Fatal("Close did not start")
			}
			runtime.Gosched()
		}
	})
	if !metaapi.IsCode(err, metaapi.EAGAIN) {
		t.Errorf("repair on a closing service: %v", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not return after the check")
	}
}

// TestCheckExamplesOneLine: names are any bytes but '/' and NUL; an
// example shows a strange one quoted, on one line.
func TestCheckExamplesOneLine(t *testing.T) {
	f := newFixture(t)
	f.mk("/", "two\nlines", metaapi.TypeDir, 0o755, root)
	f.mk("/two\nlines", "bad\xffbyte", metaapi.TypeFile, 0o644, root)
	in, err := loadInode(f.s.db, f.ino("/two\nlines/bad\xffbyte"))
	if err != nil {
		t.Fatal(err)
	}
	in.Nlink = 3
	if err := f.s.db.Set(inodeKey(in.Ino), mustJSON(in), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	res := f.checkNS(false)
	p := byKind(res)[metaapi.CheckLinkCount]
	if want := `"two\nlines"/"bad\xffbyte": file with link count 3 but 1 name`; len(p.Examples) != 1 || p.Examples[0] != "/"+want {
		t.Fatalf("examples %q, want %q", p.Examples, "/"+want)
	}
	f.checkNS(true)
}

// FuzzCheckRepair writes hostile records over a small namespace (inodes
// of any type and link count, entries of any type naming anything,
// records that do not decode, orphan records) and checks that a check
// never fails, that its repair frees nothing and leaves no problem of a
// kind it repairs (orphans only if /lost+found cannot be used), and that
// a second repair changes nothing.
func FuzzCheckRepair(f *testing.F) {
	f.Add([]byte{3, 0, 0, 1, 2, 0, 2, 4, 1, 6})
	f.Add([]byte{0, 7, 1, 1, 1, 3, 7, 0, 7, 2, 3, 0, 1, 7, 2})
	f.Add([]byte{4, 0, 0, 4, 1, 1, 5, 3, 0, 1, 1, 3, 2, 3, 0, 1, 2})
	types := []metaapi.FileType{metaapi.TypeFile, metaapi.TypeDir, metaapi.TypeSymlink, metaapi.TypeFIFO, "bogus"}
	names := []string{"a", "b", "c", lostFoundName, "#3", "", "x/y", "\n"}
	f.Fuzz(func(t *testing.T, ops []byte) {
		fx := newFixture(t)
		t.Cleanup(func() { fx.s.Close() }) // what is left for an operator is not this test's
		fx.tree("/a/", "/a/f", "/b", "/a/d/")
		fx.adjustCounters(func(c *counters) { c.NextIno = 100 })
		b := fx.s.db.NewBatch()
		for len(ops) >= 5 && len(ops) < 400 {
			o := ops[:5]
			ops = ops[5:]
			ino := ids.Ino(1 + o[1]%12)
			switch o[0] % 7 {
			case 0:
				in := inode{Attr: metaapi.Attr{Ino: ino, Type: types[o[2]%5], Nlink: uint32(o[3] % 5), Mode: 0o755}, Parent: ids.Ino(1 + o[4]%12)}
				b.Set(inodeKey(ino), mustJSON(&in), nil)
			case 1:
				b.Delete(inodeKey(ino), nil)
			case 2:
				b.Set(inodeKey(ino), []byte("{"), nil)
			case 3:
				b.Set(direntKey(ino, names[o[2]%8]), append(binary.BigEndian.AppendUint64(nil, uint64(1+o[3]%12)), o[4]%6), nil)
			case 4:
				b.Delete(direntKey(ino, names[o[2]%8]), nil)
			case 5:
				b.Set(orphanKey(ino), make([]byte, 8), nil)
			case 6:
				b.Set(direntKey(ino, names[o[2]%8]), []byte{o[3]}, nil)
			}
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		inodes := fx.inodeKeys()
		res, err := fx.s.CheckNamespace(true)
		if err != nil {
			t.Fatalf("repair: %v", err)
		}
		for ino := range inodes {
			if !fx.inodeKeys()[ino] {
				t.Fatalf("repair freed inode %d", ino)
			}
		}
		left := strings.Contains(byKind(res)[metaapi.CheckOrphanInode].Action, "left")
		again, err := fx.s.CheckNamespace(false)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range again.Problems {
			if p.Kind != metaapi.CheckMetadata && !(p.Kind == metaapi.CheckOrphanInode && left) {
				t.Fatalf("after repair (%+v):\n%+v", res.Problems, p)
			}
		}
		if left {
			return
		}
		before := fx.dump()
		if _, err := fx.s.CheckNamespace(true); err != nil {
			t.Fatal(err)
		}
		if fx.dump() != before {
			t.Fatal("a second repair changed meta.db")
		}
	})
}

// inodeKeys is the set of inode numbers with a record.
func (f *fixture) inodeKeys() map[ids.Ino]bool {
	f.t.Helper()
	out := map[ids.Ino]bool{}
	if err := scan(f.s.db, []byte{pInode}, []byte{pInode + 1}, func(k, _ []byte) (bool, error) {
		if len(k) == 9 {
			out[ids.Ino(beUint64(k[1:]))] = true
		}
		return true, nil
	}); err != nil {
		f.t.Fatal(err)
	}
	return out
}

package meta

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestCheckScenarios runs testdata/check: each file is one namespace,
// built through the service, corrupted by writing meta.db's records
// directly, then checked (and repaired). Commands:
//
//	tree            paths to create, as fixture.tree ("d/", "f", "l->t", "p|")
//	do              namespace operations, one a line (see do)
//	corrupt         record surgery, one a line (see corrupt)
//	check [repair]  what CheckNamespace reports
//	ls PATH         a directory's entries
//	stat PATH       an inode (kept: it has an orphan record)
//
// A path may be "@N": inode N.
func TestCheckScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/check", func(t *testing.T, file string) {
		f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
		f.addNodes(1)
		// Files may end with problems left for an operator: the
		// fixture's own final Check is theirs to make.
		t.Cleanup(func() { f.s.Close() })
		datadriven.RunTest(t, file, func(t *testing.T, d *datadriven.TestData) string {
			f.t = t
			switch d.Cmd {
			case "tree":
				f.tree(strings.Fields(d.Input)...)
			case "do":
				for _, line := range lines(d.Input) {
					f.do(line)
				}
			case "corrupt":
				for _, line := range lines(d.Input) {
					f.corrupt(line)
				}
			case "check":
				res, err := f.s.CheckNamespace(d.HasArg("repair"))
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return renderCheck(res)
			case "ls":
				return f.ls(d.CmdArgs[0].Key)
			case "stat":
				return f.stat(d.CmdArgs[0].Key)
			default:
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			return ""
		})
	})
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func renderCheck(res NamespaceCheck) string {
	var b strings.Builder
	fmt.Fprintf(&b, "files=%d dirs=%d chunks=%d\n", res.Files, res.Dirs, res.Chunks)
	for _, p := range res.Problems {
		fmt.Fprintf(&b, "%s count=%d", p.Kind, p.Count)
		if p.Action != "" {
			fmt.Fprintf(&b, " repaired=%d: %s", p.Repaired, p.Action)
		}
		b.WriteString("\n")
		for _, e := range p.Examples {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	return b.String()
}

// inoOf resolves a path, or "@N".
func (f *fixture) inoOf(p string) ids.Ino {
	f.t.Helper()
	if n, ok := strings.CutPrefix(p, "@"); ok {
		v, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			f.t.Fatalf("bad inode %q", p)
		}
		return ids.Ino(v)
	}
	return f.ino(p)
}

// do runs one operation as root: "ln OLD NEW", "rm PATH", "rm-open
// PATH" (removed while open), "tmpfile DIR", "mv OLD NEW", "write PATH
// BYTES", "mknod PATH TYPE [MAJOR MINOR]" (a socket or device).
func (f *fixture) do(line string) {
	f.t.Helper()
	w := strings.Fields(line)
	var err error
	switch w[0] {
	case "ln":
		dir, name := path.Split(w[2])
		_, err = f.s.Link(metaapi.LinkReq{Ino: f.inoOf(w[1]), NewParent: f.ino(dir), NewName: metaapi.ByteString(name), Who: root})
	case "rm", "rm-open":
		dir, name := path.Split(w[1])
		err = f.s.Remove(metaapi.RemoveReq{Parent: f.ino(dir), Name: metaapi.ByteString(name), Keep: w[0] == "rm-open", Who: root})
	case "tmpfile":
		_, err = f.s.Create(metaapi.CreateReq{Parent: f.ino(w[1]), Type: metaapi.TypeFile, Tmpfile: true, Mode: 0o600, Who: root})
	case "mv":
		od, on := path.Split(w[1])
		nd, nn := path.Split(w[2])
		err = f.s.Rename(metaapi.RenameReq{OldParent: f.ino(od), OldName: metaapi.ByteString(on), NewParent: f.ino(nd), NewName: metaapi.ByteString(nn), Who: root})
	case "write":
		n, _ := strconv.ParseInt(w[2], 10, 64)
		f.layout(w[1], 0, n, true)
	case "mknod":
		dir, name := path.Split(w[1])
		var rdev uint64
		if len(w) == 5 {
			major, _ := strconv.ParseUint(w[3], 10, 32)
			minor, _ := strconv.ParseUint(w[4], 10, 32)
			rdev = metaapi.Mkdev(uint32(major), uint32(minor))
		}
		_, err = f.s.Create(metaapi.CreateReq{Parent: f.ino(dir), Name: metaapi.ByteString(name), Type: metaapi.FileType(w[2]), Mode: 0o644, Rdev: rdev, Who: root})
	default:
		f.t.Fatalf("unknown operation %q", line)
	}
	if err != nil {
		f.t.Fatalf("%s: %v", line, err)
	}
}

// corrupt rewrites records directly, one change a line:
//
//	drop-inode PATH          the inode record goes (the counters follow)
//	garble-inode PATH        its record no longer decodes
//	drop-entry PATH          the entry goes, the inode stays
//	nlink PATH N             the link count is set
//	parent DIR NEWPARENT     a directory's recorded parent is set
//	retype PATH TYPE         the entry says another type
//	garble-entry PATH        the entry's value no longer decodes
//	add-entry DIR NAME INO [TYPE]  an entry is added (type: the inode's)
//	mv-entry PATH DIR NAME   the entry moves, nothing else changes
//	orphan-record PATH       an orphan record is added
//	rdev PATH N              the inode's device number is set
//	counters FIELD=DELTA...  files, dirs, chunks, next-ino
func (f *fixture) corrupt(line string) {
	f.t.Helper()
	w := strings.Fields(line)
	b := f.s.db.NewBatch()
	defer b.Close()
	entry := func(p string) []byte {
		dir, name := path.Split(p)
		return direntKey(f.ino(dir), name)
	}
	load := func(ino ids.Ino) *inode {
		in, err := loadInode(f.s.db, ino)
		if err != nil {
			f.t.Fatalf("%s: %v", line, err)
		}
		return in
	}
	switch w[0] {
	case "drop-inode":
		ino := f.inoOf(w[1])
		in := load(ino)
		b.Delete(inodeKey(ino), nil)
		f.adjustCounters(func(c *counters) {
			if in.isDir() {
				c.Dirs--
			} else {
				c.Files--
			}
		})
	case "garble-inode":
		b.Set(inodeKey(f.inoOf(w[1])), []byte("{"), nil)
	case "drop-entry":
		b.Delete(entry(w[1]), nil)
	case "nlink":
		in := load(f.inoOf(w[1]))
		n, _ := strconv.ParseUint(w[2], 10, 32)
		in.Nlink = uint32(n)
		b.Set(inodeKey(in.Ino), mustJSON(in), nil)
	case "parent":
		in := load(f.inoOf(w[1]))
		in.Parent = f.inoOf(w[2])
		b.Set(inodeKey(in.Ino), mustJSON(in), nil)
	case "retype":
		ino := f.inoOf(w[1])
		b.Set(entry(w[1]), encodeDirent(dirent{Ino: ino, Type: metaapi.FileType(w[2])}), nil)
	case "garble-entry":
		b.Set(entry(w[1]), []byte("xx"), nil)
	case "add-entry":
		ino := f.inoOf(w[3])
		var typ metaapi.FileType
		if len(w) > 4 {
			typ = metaapi.FileType(w[4])
		} else {
			typ = load(ino).Type
		}
		b.Set(direntKey(f.inoOf(w[1]), w[2]), encodeDirent(dirent{Ino: ino, Type: typ}), nil)
	case "mv-entry":
		raw, _, err := getRaw(f.s.db, entry(w[1]))
		if err != nil || raw == nil {
			f.t.Fatalf("%s: no entry (%v)", line, err)
		}
		b.Delete(entry(w[1]), nil)
		b.Set(direntKey(f.inoOf(w[2]), w[3]), raw, nil)
	case "orphan-record":
		b.Set(orphanKey(f.inoOf(w[1])), make([]byte, 8), nil)
	case "rdev":
		in := load(f.inoOf(w[1]))
		in.Rdev, _ = strconv.ParseUint(w[2], 10, 64)
		b.Set(inodeKey(in.Ino), mustJSON(in), nil)
	case "counters":
		f.adjustCounters(func(c *counters) {
			for _, kv := range w[1:] {
				k, v, _ := strings.Cut(kv, "=")
				d, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "files":
					c.Files += d
				case "dirs":
					c.Dirs += d
				case "chunks":
					c.Chunks += d
				case "next-ino":
					c.NextIno = ids.Ino(int64(c.NextIno) + d)
				default:
					f.t.Fatalf("%s: unknown counter %s", line, k)
				}
			}
		})
	default:
		f.t.Fatalf("unknown corruption %q", line)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		f.t.Fatal(err)
	}
}

// adjustCounters changes the counters, in memory and stored.
func (f *fixture) adjustCounters(fn func(*counters)) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	fn(&f.s.ctr)
	if err := f.s.db.Set(keyCounters, mustJSON(&f.s.ctr), pebble.Sync); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) ls(p string) string {
	f.t.Helper()
	r, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.inoOf(p), Who: root})
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	var b strings.Builder
	for _, e := range r.Entries {
		fmt.Fprintf(&b, "%s %s @%d\n", e.Name, e.Type, e.Ino)
	}
	return b.String()
}

func (f *fixture) stat(p string) string {
	f.t.Helper()
	var in *inode
	var kept bool
	err := f.s.read(func(v view) error {
		var err error
		if in, err = loadInode(v.r, f.inoOf(p)); err != nil {
			return err
		}
		_, kept, err = getRaw(v.r, orphanKey(in.Ino))
		return err
	})
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	out := fmt.Sprintf("%s @%d nlink=%d mode=%o uid=%d gid=%d parent=%d", in.Type, in.Ino, in.Nlink, in.Mode, in.UID, in.GID, in.Parent)
	if kept {
		out += " kept"
	}
	return out + "\n"
}

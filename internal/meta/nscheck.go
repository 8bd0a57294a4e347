package meta

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// nsInode is what the check keeps of an inode.
type nsInode struct {
	typ     metaapi.FileType // "": a record that does not decode (not judged)
	nlink   uint32
	names   uint32  // entries naming it that are not dangling
	subdirs uint32  // directories: entries in it naming directories
	parent  ids.Ino // directories: the recorded parent
	at      ids.Ino // the directory holding its first name
	size    int64
	orphan  bool // it has an orphan record (which keeps a file removed while open)
	// chunks: a counted file's recorded chunk count (Attr.Chunks), until
	// checkRecords compared it with its chunk records; else -1.
	chunks int64
	// chunkEnd: a counted file's Attr.ChunkEnd, one past the highest
	// index of its chunks (0: none, or not known).
	chunkEnd int64
}

// checker walks one snapshot. Records that do not decode are problems
// like any other: the walk goes on.
type checker struct {
	r     pebble.Reader
	ctr   counters
	nodes []ids.NodeID
	stop  <-chan struct{}
	read  int  // records read, to look at stop now and then
	fix   bool // collect what repair needs
	hook  func(stage string)

	inodes  map[ids.Ino]nsInode
	dirName map[ids.Ino]string // a directory's name in its at
	sorted  []ids.Ino          // inode numbers in order, once all are read
	maxIno  ids.Ino
	files   int64
	dirs    int64
	chunks  int64
	tallies [nKinds]tally

	indexFaults []linkRef // link index records that disagree with the entries (nscheck_links.go)

	dangling []entryRef
	orphans  []orphanFix
	links    []linkFix

	names map[ids.Ino]string // rendering: a file's name in its at
}

// entryRef is a directory entry as the snapshot held it.
type entryRef struct {
	parent ids.Ino
	name   string
	raw    []byte // its value
}

// orphanFix is an inode to link into lost+found: one no entry names, or
// the member of a detached cycle of directories to move there (cycle:
// the entries making the cycle, the member's own first).
type orphanFix struct {
	ino   ids.Ino
	typ   metaapi.FileType
	nlink uint32
	kept  bool // it had an orphan record
	cycle []entryRef
}

// linkFix is an inode whose link count is wrong: names is what it must
// be for a non-directory (directories are counted again when fixed).
type linkFix struct {
	ino   ids.Ino
	dir   bool
	nlink uint32
	names uint32
}

func newChecker(r pebble.Reader, ctr counters, nodes []ids.NodeID, stop <-chan struct{}, fix bool) *checker {
	return &checker{
		r: r, ctr: ctr, nodes: nodes, stop: stop, fix: fix,
		inodes:  map[ids.Ino]nsInode{},
		dirName: map[ids.Ino]string{},
		names:   map[ids.Ino]string{},
	}
}

func (c *checker) run() error {
	for i, step := range []func() error{c.scanInodes, c.scanOrphans, c.scanXattrs, c.scanEntries, c.scanLinks} {
		if i == 1 && c.hook != nil {
			c.hook("walking")
		}
		if err := step(); err != nil {
			return err
		}
	}
	c.sorted = slices.Sorted(maps.Keys(c.inodes))
	c.judgeInodes()
	c.findCycles()
	return c.checkRecords()
}

// problem counts one instance of kind k, keeping its example if there is
// room.
func (c *checker) problem(k kind, example func() string) {
	t := &c.tallies[k]
	t.count++
	if len(t.examples) < metaapi.MaxCheckExamples {
		t.examples = append(t.examples, example)
	}
}

// metadataf counts a metadata problem, its example formatted at once
// (args may be keys or values valid only during a scan's call).
func (c *checker) metadataf(format string, args ...any) {
	msg := ""
	if len(c.tallies[kMeta].examples) < metaapi.MaxCheckExamples {
		msg = oneLine(fmt.Sprintf(format, args...))
	}
	c.problem(kMeta, func() string { return msg })
}

// scan walks the records under prefix p, giving up when the service
// closes.
func (c *checker) scan(p byte, fn func(k, v []byte) (bool, error)) error {
	return scan(c.r, []byte{p}, []byte{p + 1}, func(k, v []byte) (bool, error) {
		if c.read++; c.read%4096 == 0 {
			select {
			case <-c.stop:
				return false, errClosed
			default:
			}
		}
		return fn(k, v)
	})
}

func (c *checker) scanInodes() error {
	return c.scan(pInode, func(k, val []byte) (bool, error) {
		if len(k) != 9 {
			c.metadataf("malformed inode key %x", k)
			return true, nil
		}
		ino := ids.Ino(binary.BigEndian.Uint64(k[1:]))
		c.maxIno = max(c.maxIno, ino)
		in := new(inode)
		if err := json.Unmarshal(val, in); err != nil {
			c.metadataf("inode %d: record does not decode: %v", ino, err)
			c.inodes[ino] = nsInode{}
			return true, nil
		}
		if in.Ino != ino {
			c.metadataf("inode key %d holds inode %d", ino, in.Ino)
		}
		n := nsInode{typ: in.Type, nlink: in.Nlink, parent: in.Parent, size: in.Size, chunks: -1}
		if in.Type == metaapi.TypeFile && in.Counted {
			n.chunks, n.chunkEnd = in.Chunks, in.ChunkEnd
		}
		switch in.Type {
		case metaapi.TypeDir:
			c.dirs++
		case metaapi.TypeFile, metaapi.TypeSymlink, metaapi.TypeFIFO, metaapi.TypeSocket, metaapi.TypeBlock, metaapi.TypeChar:
			c.files++
			if in.Type == metaapi.TypeFile && (in.Policy == nil || in.ChunkSize <= 0) {
				c.problem(kMeta, func() string { return c.path(ino) + ": file with no policy or chunk size" })
			}
			if in.Rdev != 0 && !in.Type.IsDevice() {
				c.problem(kMeta, func() string { return c.path(ino) + ": a device number on a " + string(in.Type) })
			}
		default:
			c.metadataf("inode %d has unknown type %q", ino, in.Type)
			n = nsInode{}
		}
		c.inodes[ino] = n
		return true, nil
	})
}

func (c *checker) scanOrphans() error {
	return c.scan(pOrphan, func(k, val []byte) (bool, error) {
		if len(k) != 9 || len(val) != 8 {
			c.metadataf("malformed orphan record %x: %x", k, val)
			return true, nil
		}
		ino := ids.Ino(binary.BigEndian.Uint64(k[1:]))
		n, ok := c.inodes[ino]
		if !ok || n.typ != metaapi.TypeFile {
			c.metadataf("orphan record for missing or non-file inode %d", ino)
		}
		if !ok {
			return true, nil
		}
		n.orphan = true
		c.inodes[ino] = n
		return true, nil
	})
}

func (c *checker) scanXattrs() error {
	return c.scan(pXattr, func(k, _ []byte) (bool, error) {
		if len(k) < 10 {
			c.metadataf("malformed attribute key %x", k)
		} else if ino := ids.Ino(binary.BigEndian.Uint64(k[1:9])); !c.has(ino) {
			c.metadataf("attribute %q of missing inode %d", k[9:], ino)
		}
		return true, nil
	})
}

func (c *checker) has(ino ids.Ino) bool { _, ok := c.inodes[ino]; return ok }

// scanEntries counts each inode's names and each directory's
// subdirectories, leaving out dangling entries: those are removed by a
// repair, so what they name is judged without them.
func (c *checker) scanEntries() error {
	return c.scan(pDirent, func(k, val []byte) (bool, error) {
		if len(k) < 9 {
			c.metadataf("malformed entry key %x", k)
			return true, nil
		}
		parent := ids.Ino(binary.BigEndian.Uint64(k[1:9]))
		name := string(k[9:])
		if err := validName(name); err != nil {
			c.problem(kMeta, func() string { return c.entryPath(parent, name) + ": bad name: " + oneLine(err.Error()) })
		}
		p, pok := c.inodes[parent]
		d, derr := decodeDirent(val)
		if derr == nil {
			if err := c.checkLink(parent, name, d); err != nil {
				return false, err
			}
		}
		ch, cok := c.inodes[d.Ino]
		if fault := entryFault(parent, p.typ, pok, d, derr, ch.typ, cok && derr == nil); fault != "" {
			c.problem(kDangling, func() string { return c.entryPath(parent, name) + ": " + fault })
			if c.fix {
				c.dangling = append(c.dangling, entryRef{parent, name, slices.Clone(val)})
			}
			return true, nil
		}
		ch.names++
		if ch.names == 1 {
			ch.at = parent
			if d.Type == metaapi.TypeDir {
				c.dirName[d.Ino] = name
			}
		}
		c.inodes[d.Ino] = ch
		if d.Type == metaapi.TypeDir {
			p = c.inodes[parent] // it may be d.Ino itself
			p.subdirs++
			c.inodes[parent] = p
		}
		return true, nil
	})
}

// entryFault says what makes an entry dangling, or "" if it is not: its
// value does not decode, its directory is missing or not a directory, or
// it names a missing inode or one of another type. Records that do not
// decode (type "") are not judged by the entries naming them.
func entryFault(parent ids.Ino, ptyp metaapi.FileType, pfound bool, d dirent, derr error, ctyp metaapi.FileType, cfound bool) string {
	switch {
	case derr != nil:
		return "unreadable entry: " + derr.Error()
	case !pfound:
		return fmt.Sprintf("its directory, inode %d, does not exist", parent)
	case ptyp != metaapi.TypeDir && ptyp != "":
		return fmt.Sprintf("its directory, inode %d, is a %s", parent, ptyp)
	case !cfound:
		return fmt.Sprintf("names inode %d, which does not exist", d.Ino)
	case ctyp != d.Type && ctyp != "":
		return fmt.Sprintf("says %s, but inode %d is a %s", d.Type, d.Ino, ctyp)
	}
	return ""
}

// judgeInodes checks each inode against the names counted.
func (c *checker) judgeInodes() {
	if !c.has(ids.RootIno) {
		c.metadataf("no root directory")
	}
	for _, ino := range c.sorted {
		n := c.inodes[ino]
		switch {
		case n.typ == "":
		case n.typ == metaapi.TypeDir:
			if want := 2 + n.subdirs; n.nlink != want {
				c.problem(kLinks, func() string {
					return fmt.Sprintf("%s: directory with link count %d, want %d (2 + %s)", c.path(ino), n.nlink, want, plural(n.subdirs, "subdirectory", "subdirectories"))
				})
				if c.fix {
					c.links = append(c.links, linkFix{ino: ino, dir: true, nlink: n.nlink})
				}
			}
			c.judgeDir(ino, n)
		case n.names == 0:
			if n.orphan && n.nlink == 0 && n.typ == metaapi.TypeFile {
				continue // removed while open: kept until released
			}
			c.problem(kOrphan, func() string {
				return fmt.Sprintf("inode %d (%s of %d bytes, link count %d): no entry names it and no open file keeps it", ino, n.typ, n.size, n.nlink)
			})
			if c.fix {
				c.orphans = append(c.orphans, orphanFix{ino: ino, typ: n.typ, nlink: n.nlink, kept: n.orphan})
			}
		case n.names != n.nlink:
			c.problem(kLinks, func() string {
				return fmt.Sprintf("%s: %s with link count %d but %s", c.path(ino), n.typ, n.nlink, plural(n.names, "name", "names"))
			})
			if c.fix {
				c.links = append(c.links, linkFix{ino: ino, nlink: n.nlink, names: n.names})
			}
		}
	}
}

// judgeDir checks a directory's names and parent.
func (c *checker) judgeDir(ino ids.Ino, n nsInode) {
	if ino == ids.RootIno {
		if n.parent != ids.RootIno {
			c.metadataf("the root's parent is %d", n.parent)
		}
		if n.names != 0 {
			c.problem(kMeta, func() string { return "the root directory is named " + c.below(n.at, c.dirName[ino], ino) })
		}
		return
	}
	switch {
	case n.names == 0:
		c.problem(kOrphan, func() string {
			return fmt.Sprintf("inode %d (directory, last in %s): no entry names it", ino, c.path(n.parent))
		})
		if c.fix {
			c.orphans = append(c.orphans, orphanFix{ino: ino, typ: metaapi.TypeDir})
		}
	case n.names > 1:
		c.problem(kMeta, func() string { return fmt.Sprintf("%s: directory with %d names", c.path(ino), n.names) })
	case n.parent != n.at:
		c.problem(kMeta, func() string {
			return fmt.Sprintf("%s: directory whose recorded parent is %s, not %s", c.path(ino), c.path(n.parent), c.path(n.at))
		})
	}
}

// findCycles finds directories no path from the root reaches although
// each has one name: they name each other in a cycle (walking up from
// any other directory ends at the root or at a directory with no name,
// itself an orphan). Each cycle is one orphan, fixed by moving its lowest
// inode into lost+found.
func (c *checker) findCycles() {
	const onPath, done = 1, 2
	state := map[ids.Ino]uint8{}
	for _, start := range c.sorted {
		var path []ids.Ino
		for ino := start; ; {
			n := c.inodes[ino]
			if ino == ids.RootIno || n.typ != metaapi.TypeDir || n.names != 1 || state[ino] == done {
				break
			}
			if state[ino] == onPath {
				c.cycle(path[slices.Index(path, ino):])
				break
			}
			state[ino] = onPath
			path = append(path, ino)
			ino = n.at
		}
		for _, ino := range path {
			state[ino] = done
		}
	}
}

func (c *checker) cycle(members []ids.Ino) {
	i := slices.Index(members, slices.Min(members))
	members = append(slices.Clone(members[i:]), members[:i]...) // the lowest first
	c.problem(kOrphan, func() string {
		list := make([]string, 0, 9)
		for i, m := range members {
			if i == 8 {
				list = append(list, "...")
				break
			}
			list = append(list, strconv.FormatUint(uint64(m), 10))
		}
		list = append(list, strconv.FormatUint(uint64(members[0]), 10))
		return fmt.Sprintf("inode %d (directory named %s in inode %d): in a cycle of %s no path from / reaches (%s)",
			members[0], display(c.dirName[members[0]]), c.inodes[members[0]].at,
			plural(uint32(len(members)), "directory", "directories"), strings.Join(list, " in "))
	})
	if c.fix {
		f := orphanFix{ino: members[0], typ: metaapi.TypeDir}
		for _, m := range members {
			f.cycle = append(f.cycle, entryRef{c.inodes[m].at, c.dirName[m], encodeDirent(dirent{m, metaapi.TypeDir})})
		}
		c.orphans = append(c.orphans, f)
	}
}

// ---- rendering ----

// maxShownDepth bounds the components a path shows.
const maxShownDepth = 32

// path names an inode for an example: its path from the root through its
// first name, "[inode N]/..." below a directory no path from the root
// reaches, or "inode N" for one with no name.
func (c *checker) path(ino ids.Ino) string {
	n, ok := c.inodes[ino]
	switch {
	case ino == ids.RootIno:
		return "/"
	case !ok || n.names == 0:
		return fmt.Sprintf("inode %d", ino)
	case n.typ == metaapi.TypeDir:
		return c.below(n.at, c.dirName[ino], ino)
	}
	name, ok := c.names[ino]
	if !ok {
		name = c.nameIn(n.at, ino)
		c.names[ino] = name
	}
	return c.below(n.at, name, ino)
}

func (c *checker) entryPath(parent ids.Ino, name string) string { return c.below(parent, name, 0) }

// below renders the path of name (inode self, if known) in directory
// dir, from the root or from what stops the walk up: "[inode N]" (a
// directory with no name, or none at all), "[cycle]" (directories naming
// each other), "..." (too deep to show).
func (c *checker) below(dir ids.Ino, name string, self ids.Ino) string {
	parts := []string{name}
	seen := map[ids.Ino]bool{self: true}
	top := ""
	for ino := dir; ino != ids.RootIno; {
		n, ok := c.inodes[ino]
		if !ok || n.typ != metaapi.TypeDir || n.names == 0 || seen[ino] || len(parts) == maxShownDepth {
			switch {
			case seen[ino]:
				top = "[cycle]"
			case len(parts) == maxShownDepth:
				top = "..."
			default:
				top = fmt.Sprintf("[inode %d]", ino)
			}
			break
		}
		seen[ino] = true
		parts = append(parts, c.dirName[ino])
		ino = n.at
	}
	for i, p := range parts {
		parts[i] = display(p)
	}
	slices.Reverse(parts)
	return top + "/" + strings.Join(parts, "/")
}

// nameIn finds a name of ino in directory dir (walking the directory: a
// few examples need it, so the check keeps no file's name).
func (c *checker) nameIn(dir, ino ids.Ino) string {
	name := fmt.Sprintf("[inode %d]", ino)
	p := direntPrefix(dir)
	_ = scan(c.r, p, prefixEnd(p), func(k, v []byte) (bool, error) {
		if d, err := decodeDirent(v); err == nil && d.Ino == ino {
			name = string(k[len(p):])
			return false, nil
		}
		return true, nil
	})
	return name
}

// display makes a name safe to show on one line: a name is any bytes
// but '/' and NUL.
func display(name string) string {
	if len(name) > metaapi.MaxNameLen {
		name = name[:metaapi.MaxNameLen] + "..."
	}
	if utf8.ValidString(name) && strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return name
	}
	return strconv.Quote(name)
}

func plural(n uint32, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

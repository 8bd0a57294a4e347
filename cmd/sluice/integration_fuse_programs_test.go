package main

// Real programs on a real mount, each checked for correct output and not
// just its exit status: tar (a source tree of more than 5,000 files,
// compared byte for byte with the original), git, the sqlite3 shell
// (rollback journal and WAL), fio with data verification, and RocksDB's
// db_bench. Every program runs in a replicated directory and in an
// erasure-coded (2+1) one. The programs are Debian packages that
// scripts/test installs (tar, git, sqlite3, fio, rocksdb-tools); a
// machine without them fails these tests rather than skipping them.
//
// Reads that check a program's output go through a second mount of the
// same cluster wherever they can: what they see comes from the cluster,
// not from the writing mount's page cache.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// progTools are the programs these tests run, with the Debian package
// that has each.
var progTools = []struct{ exe, pkg string }{
	{"tar", "tar"},
	{"git", "git"},
	{"sqlite3", "sqlite3"},
	{"fio", "fio"},
	{"db_bench", "rocksdb-tools"},
	{"cp", "coreutils"},
}

// progRequireTools fails (never skips) when a program is missing: the
// issue requires every one of them to run on the mount.
func progRequireTools(t *testing.T) {
	t.Helper()
	var missing []string
	for _, tool := range progTools {
		if _, err := exec.LookPath(tool.exe); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", tool.exe, tool.pkg))
		}
	}
	if len(missing) > 0 {
		t.Fatalf("programs the FUSE program tests must run are not installed: %s; scripts/test installs them",
			strings.Join(missing, ", "))
	}
}

// progEnv is one cluster, mounted twice, and the directory the programs
// run in.
type progEnv struct {
	conf    string
	m1, m2  *mounted
	rel     string // the work directory, relative to the cluster's root
	ec      bool   // rel has an erasure-coding (2+1) policy
	treeMin int    // regular files the source tree must have at least
	stage   string // in memory, for the test's whole run: the original tree
	tree    *progTree
}

func (e *progEnv) dir1(elem ...string) string {
	return filepath.Join(append([]string{e.m1.dir, e.rel}, elem...)...)
}

func (e *progEnv) dir2(elem ...string) string {
	return filepath.Join(append([]string{e.m2.dir, e.rel}, elem...)...)
}

// TestFUSEProgramsReplicated runs the programs in a directory with the
// cluster's default policy, 3 replicas. The source tree is the Go
// toolchain's own, cut to a little over 5,000 files.
func TestFUSEProgramsReplicated(t *testing.T) {
	progRequireTools(t)
	progSuite(t, &progEnv{rel: "rep", treeMin: 5100})
}

// TestFUSEProgramsErasureCoded runs the same programs in a directory
// whose policy is erasure coding 2+1 (the 3-node cluster has exactly the
// nodes that needs), on a smaller part of the Go source tree.
func TestFUSEProgramsErasureCoded(t *testing.T) {
	progRequireTools(t)
	progSuite(t, &progEnv{rel: "ec", ec: true, treeMin: 1500})
}

func progSuite(t *testing.T, e *progEnv) {
	c, m1 := fuseCluster(t)
	e.conf, e.m1 = c.conf, m1
	e.m2 = mountAt(t, c.conf, "mnt2")
	e.stage = baseDir(t)
	if err := os.Mkdir(e.dir1(), 0o755); err != nil {
		t.Fatal(err)
	}
	if e.ec {
		mustRun(t, e.conf, nil, "policy", "set", "/"+e.rel, "--ec", "2+1")
		if out := string(mustRun(t, e.conf, nil, "policy", "get", "/"+e.rel).stdout); !strings.Contains(out, "ec=2+1") {
			t.Fatalf("policy get /%s: %q", e.rel, out)
		}
	}
	t.Run("SourceTree", func(t *testing.T) { progSourceTree(t, e) })
	t.Run("Git", func(t *testing.T) { progGit(t, e) })
	t.Run("SQLite", func(t *testing.T) {
		t.Run("RollbackJournal", func(t *testing.T) { progSQLite(t, e, false) })
		t.Run("WAL", func(t *testing.T) { progSQLite(t, e, true) })
	})
	t.Run("Fio", func(t *testing.T) {
		t.Run("Sequential", func(t *testing.T) { progFio(t, e, "seq", "write", "1m", 64<<20) })
		t.Run("Random", func(t *testing.T) { progFio(t, e, "rand", "randwrite", "4k", 16<<20) })
	})
	t.Run("DBBench", func(t *testing.T) { progDBBench(t, e) })
}

// progCheckPolicy checks that the file at path on a mount (m1 or m2) has
// the work directory's policy.
func progCheckPolicy(t *testing.T, e *progEnv, path string) {
	t.Helper()
	rel, err := filepath.Rel(e.m1.dir, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		if rel, err = filepath.Rel(e.m2.dir, path); err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("%s is on neither mount", path)
		}
	}
	out := mustRun(t, e.conf, nil, "stat", "--json", "/"+filepath.ToSlash(rel)).stdout
	var st struct {
		Policy struct {
			Replicas int `json:"replicas"`
			EC       *struct {
				Data   int `json:"data"`
				Parity int `json:"parity"`
			} `json:"ec"`
		} `json:"policy"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("stat --json %s: %v in %q", rel, err, out)
	}
	switch {
	case e.ec && (st.Policy.EC == nil || st.Policy.EC.Data != 2 || st.Policy.EC.Parity != 1):
		t.Errorf("/%s: policy %s, want ec 2+1", rel, out)
	case !e.ec && (st.Policy.EC != nil || st.Policy.Replicas != 3):
		t.Errorf("/%s: policy %s, want 3 replicas", rel, out)
	}
}

// ---- running programs ----

type progResult struct {
	stdout, stderr string
	code           int
	elapsed        time.Duration
}

// progTimeout bounds one program run; none comes near it when all is
// well, and a program hung on the mount fails the test instead of
// stalling the whole suite.
const progTimeout = 3 * time.Minute

// progRun runs a program in dir with extra environment variables; it
// fails the test only if the program cannot start or hangs.
func progRun(t *testing.T, dir string, env []string, stdin io.Reader, name string, args ...string) progResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), progTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := progResult{stdout: out.String(), stderr: errb.String(), elapsed: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		t.Fatalf("%s %s: still running after %s (hung on the mount?); stderr:\n%s", name, strings.Join(args, " "), progTimeout, tail(r.stderr, 30))
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	t.Logf("%s %s: exit %d in %s", name, progShortArgs(args), r.code, r.elapsed.Round(time.Millisecond))
	return r
}

// progMust is progRun that fails the test unless the program exits 0.
func progMust(t *testing.T, dir string, env []string, stdin io.Reader, name string, args ...string) progResult {
	t.Helper()
	r := progRun(t, dir, env, stdin, name, args...)
	if r.code != 0 {
		t.Fatalf("%s %s (in %s): exit %d\nstderr:\n%s\nstdout:\n%s", name, strings.Join(args, " "), dir, r.code, tail(r.stderr, 40), tail(r.stdout, 20))
	}
	return r
}

func progShortArgs(args []string) string {
	s := strings.Join(args, " ")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// ---- the source tree ----

// progTree is the original tree, on /dev/shm, and its archive.
type progTree struct {
	root    string // the original: <stage>/src
	tar     string
	entries map[string]progEntry
	files   int // regular files
	tracked int // what git tracks: regular files and symlinks
}

// progEntry is what a tree walk records of one path.
type progEntry struct {
	mode     uint32 // st_mode: type and permission bits
	uid, gid uint32
	size     int64
	mtime    int64 // ns
	target   string
	ino      uint64
	nlink    uint64
	rdev     uint64 // devices
}

func (p progEntry) typ() uint32 { return p.mode & syscall.S_IFMT }

// progScan walks root (not following symlinks) and records every path
// under it, relative to root.
func progScan(root string) (map[string]progEntry, error) {
	out := map[string]progEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		e := progEntry{mode: st.Mode, uid: st.Uid, gid: st.Gid, size: st.Size, mtime: st.Mtim.Nano(), ino: st.Ino, nlink: uint64(st.Nlink), rdev: st.Rdev}
		if e.typ() == syscall.S_IFLNK {
			if e.target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		out[filepath.ToSlash(rel)] = e
		return nil
	})
	return out, err
}

// progBuildTree copies the Go toolchain's source tree ($GOROOT/src: its
// top-level files, then its top-level directories in order, leaving out
// cmd, until at least minFiles regular files) to /dev/shm, adds what the
// Go tree lacks (symbolic links, a hard link, unusual modes and owners,
// an empty directory, a multi-megabyte file, nanosecond times), and
// archives it with tar (POSIX format: times to the nanosecond), all in
// stage.
func progBuildTree(t *testing.T, stage string, minFiles int) *progTree {
	t.Helper()
	goroot := strings.TrimSpace(progMust(t, "", nil, nil, "go", "env", "GOROOT").stdout)
	src := filepath.Join(goroot, "src")
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatalf("the Go source tree: %v", err)
	}
	var picked []string
	count := 0
	for _, d := range ents {
		if d.Type().IsRegular() {
			picked = append(picked, d.Name())
			count++
		}
	}
	// Directories in order, leaving out those that would overshoot the
	// target by much: the test's time grows with the file count.
	for _, d := range ents {
		if !d.IsDir() || d.Name() == "cmd" || count >= minFiles {
			continue
		}
		n := 0
		filepath.WalkDir(filepath.Join(src, d.Name()), func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() {
				n++
			}
			return nil
		})
		if count+n > minFiles+minFiles/10 {
			continue
		}
		count += n
		picked = append(picked, d.Name())
	}
	if count < minFiles {
		t.Fatalf("%s has only %d regular files outside cmd/, want at least %d", src, count, minFiles)
	}

	root := filepath.Join(stage, "src")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	progMust(t, src, nil, nil, "cp", append(append([]string{"-a"}, picked...), root)...)
	progAddExtras(t, filepath.Join(root, "zz-sluice-extras"))

	tr := &progTree{root: root, tar: filepath.Join(stage, "src.tar")}
	progMust(t, stage, nil, nil, "tar", "--format=posix", "-cf", tr.tar, "src")
	if tr.entries, err = progScan(root); err != nil {
		t.Fatal(err)
	}
	for _, e := range tr.entries {
		switch e.typ() {
		case syscall.S_IFREG:
			tr.files++
			tr.tracked++
		case syscall.S_IFLNK:
			tr.tracked++
		}
	}
	if tr.files < minFiles || tr.files < 1000 {
		t.Fatalf("the tree has %d regular files, want at least %d", tr.files, minFiles)
	}
	return tr
}

// progAddExtras makes, in dir, what a real source tree may hold and the
// Go tree does not.
func progAddExtras(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	file := func(name string, data []byte, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, name)
		must(os.WriteFile(p, data, 0o600))
		must(os.Chmod(p, mode)) // not cut by the umask, setuid kept
	}
	must(os.Mkdir(dir, 0o755))
	for _, d := range []string{"private", "sticky", "emptydir", "a/b/c/d/e/f/g/h"} {
		must(os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(os.Chmod(filepath.Join(dir, "private"), 0o700))
	must(os.Chmod(filepath.Join(dir, "sticky"), 0o1777))
	file("empty", nil, 0o644)
	file("big.bin", randomBytes(t, 3<<20+12345), 0o600) // several 1 MiB FUSE writes
	file("readonly.txt", []byte("read only\n"), 0o444)
	file("script.sh", []byte("#!/bin/sh\necho hello\n"), 0o755)
	file("setuid", []byte("#!/bin/sh\n"), 0o4755)
	file("setgid", []byte("#!/bin/sh\n"), 0o2750)
	file("group-writable", []byte("shared\n"), 0o664)
	file("private/secret", []byte("secret\n"), 0o600)
	file("sticky/tmp", []byte("tmp\n"), 0o644)
	file("a/b/c/d/e/f/g/h/deep.txt", []byte("deep\n"), 0o644)
	file("naïve file with spaces.txt", []byte("unicode name\n"), 0o644)
	file("owned", []byte("owned by someone else\n"), 0o640)
	must(os.Lchown(filepath.Join(dir, "owned"), 1234, 5678))
	file("hard-a", []byte("one file, two names\n"), 0o644)
	must(os.Link(filepath.Join(dir, "hard-a"), filepath.Join(dir, "hard-b")))
	for name, target := range map[string]string{
		"link-rel":      "../go.mod",
		"link-dir":      "private",
		"link-abs":      "/nonexistent/absolute/target",
		"link-dangling": "does-not-exist",
		"link-chain":    "link-rel",
		"link-deep":     "a/b/c/d/e/f/g/h/deep.txt",
	} {
		must(os.Symlink(target, filepath.Join(dir, name)))
	}
	must(os.Lchown(filepath.Join(dir, "link-chain"), 1234, 5678))
	// Distinct times to the nanosecond, children before parents.
	var paths []string
	must(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for i, p := range paths {
		ts := unix.NsecToTimespec(int64(1000000000+i*86413)*1e9 + int64(i)*1234567 + 89)
		must(unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// progErrs collects a comparison's differences, reporting the first few
// in full.
type progErrs struct {
	t  *testing.T
	mu sync.Mutex
	n  int
}

func (c *progErrs) add(format string, args ...any) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n <= 25 {
		c.t.Errorf(format, args...)
	}
}

func (c *progErrs) done(what string) {
	c.t.Helper()
	if c.n > 25 {
		c.t.Errorf("%s: %d differences in all, the first 25 above", what, c.n)
	}
}

// progCompareTrees checks that the tree at got is the original, byte for
// byte: the same paths, types, permission bits, owners, times, symbolic
// link targets, hard links, and file contents.
func progCompareTrees(t *testing.T, orig *progTree, got string) {
	t.Helper()
	ge, err := progScan(got)
	if err != nil {
		t.Fatalf("walking %s: %v", got, err)
	}
	errs := &progErrs{t: t}
	var missing, extra []string
	for p := range orig.entries {
		if _, ok := ge[p]; !ok {
			missing = append(missing, p)
		}
	}
	for p := range ge {
		if _, ok := orig.entries[p]; !ok {
			extra = append(extra, p)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("%d paths of the original are missing, e.g. %q", len(missing), missing[:min(10, len(missing))])
	}
	if len(extra) > 0 {
		t.Errorf("%d paths are not in the original, e.g. %q", len(extra), extra[:min(10, len(extra))])
	}
	files := 0
	var regular []string
	for p, o := range orig.entries {
		g, ok := ge[p]
		if !ok {
			continue
		}
		if g.mode != o.mode {
			errs.add("%s: mode %#o, want %#o", p, g.mode, o.mode)
			continue
		}
		if g.uid != o.uid || g.gid != o.gid {
			errs.add("%s: owner %d:%d, want %d:%d", p, g.uid, g.gid, o.uid, o.gid)
		}
		if g.mtime != o.mtime {
			errs.add("%s: mtime %s, want %s (as the archive has it)", p, time.Unix(0, g.mtime).UTC().Format(time.RFC3339Nano), time.Unix(0, o.mtime).UTC().Format(time.RFC3339Nano))
		}
		switch o.typ() {
		case syscall.S_IFREG:
			files++
			if g.size != o.size {
				errs.add("%s: size %d, want %d", p, g.size, o.size)
				continue
			}
			if g.nlink != o.nlink {
				errs.add("%s: %d links, want %d", p, g.nlink, o.nlink)
			}
			regular = append(regular, p)
		case syscall.S_IFLNK:
			if g.target != o.target {
				errs.add("%s: symbolic link to %q, want %q", p, g.target, o.target)
			}
		case syscall.S_IFBLK, syscall.S_IFCHR:
			if g.rdev != o.rdev {
				errs.add("%s: device %d:%d, want %d:%d", p, unix.Major(g.rdev), unix.Minor(g.rdev), unix.Major(o.rdev), unix.Minor(o.rdev))
			}
		}
	}
	if files < orig.files {
		t.Errorf("%d regular files of the original's %d are there", files, orig.files)
	}
	// Hard links: names of one original file are names of one file.
	byIno := map[uint64][]string{}
	for p, o := range orig.entries {
		if o.typ() == syscall.S_IFREG && o.nlink > 1 {
			byIno[o.ino] = append(byIno[o.ino], p)
		}
	}
	for _, names := range byIno {
		for _, n := range names[1:] {
			if a, b := ge[names[0]], ge[n]; a.ino != b.ino {
				errs.add("%s and %s are hard links to one file in the original, but inodes %d and %d here", names[0], n, a.ino, b.ino)
			}
		}
	}
	// Contents, byte for byte, a few files at a time.
	sort.Strings(regular)
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				want, err := os.ReadFile(filepath.Join(orig.root, p))
				if err != nil {
					errs.add("reading the original %s: %v", p, err)
					continue
				}
				data, err := os.ReadFile(filepath.Join(got, p))
				if err != nil {
					errs.add("reading %s: %v", p, err)
					continue
				}
				if !bytes.Equal(data, want) {
					i := 0
					for i < len(data) && i < len(want) && data[i] == want[i] {
						i++
					}
					errs.add("%s: %d bytes differ from the original's %d, first at offset %d", p, len(data), len(want), i)
				}
			}
		}()
	}
	for _, p := range regular {
		work <- p
	}
	close(work)
	wg.Wait()
	errs.done("tree comparison")
	t.Logf("compared %d paths (%d regular files) with the original", len(orig.entries), files)
}

// progSourceTree untars the tree on the mount with tar and compares the
// result, read through the second mount, with the original.
func progSourceTree(t *testing.T, e *progEnv) {
	start := time.Now()
	tr := progBuildTree(t, e.stage, e.treeMin)
	t.Logf("original: %d paths, %d regular files, archive %s (built in %s)", len(tr.entries), tr.files, tr.tar, time.Since(start).Round(time.Millisecond))
	r := progMust(t, e.dir1(), nil, nil, "tar", "-xf", tr.tar)
	if r.stderr != "" {
		t.Errorf("tar -x warned:\n%s", tail(r.stderr, 30))
	}
	e.tree = tr // for the Git subtest, even if the comparison fails
	start = time.Now()
	progCompareTrees(t, tr, e.dir2("src"))
	t.Logf("comparison took %s", time.Since(start).Round(time.Millisecond))
	progCheckPolicy(t, e, e.dir2("src", "go.mod"))
	progCheckPolicy(t, e, e.dir2("src", "zz-sluice-extras", "big.bin"))
}

// ---- git ----

// progGitEnv keeps the machine's git configuration out of the tests.
func progGitEnv(t *testing.T, home string) []string {
	t.Helper()
	global := filepath.Join(home, "gitconfig")
	if err := os.WriteFile(global, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{
		"HOME=" + home, "XDG_CONFIG_HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + global,
		"GIT_AUTHOR_NAME=Sluice Test", "GIT_AUTHOR_EMAIL=sluice@example.com",
		"GIT_COMMITTER_NAME=Sluice Test", "GIT_COMMITTER_EMAIL=sluice@example.com",
		"GIT_AUTHOR_DATE=2020-02-02T02:02:02Z", "GIT_COMMITTER_DATE=2020-02-02T02:02:02Z",
		"LC_ALL=C",
	}
}

// progGitArgs are settings every git command here gets: no automatic
// gc in the middle of a timed step, no pager.
var progGitArgs = []string{"-c", "gc.auto=0", "-c", "core.pager=cat", "-c", "init.defaultBranch=main"}

// progGitMaxFiles bounds how much of the tree git commits. Measured on
// a 2-core machine, git init, add, commit, status and fsck of the whole
// 5,166-file tree took 49 to 66 s (git add alone over 30 s: some ten meta
// round trips per object written), more than the ~60 s one test may
// take; so of a larger tree git commits a part: its top-level files, the
// extras, and whole top-level directories in order up to about this many
// files. git still works at the root of the untarred tree; the rest of it
// stays untracked. (The erasure-coded test's tree is committed whole.)
const progGitMaxFiles = 2600

// progGitPaths returns the pathspecs of what git commits of tr (nil: all
// of it) and how many files that is.
func progGitPaths(tr *progTree) (paths []string, tracked int) {
	if tr.tracked <= progGitMaxFiles {
		return nil, tr.tracked
	}
	files := map[string]int{}
	isDir := map[string]bool{}
	for p, e := range tr.entries {
		top, _, nested := strings.Cut(p, "/")
		if !nested {
			isDir[top] = e.typ() == syscall.S_IFDIR
		}
		if e.typ() == syscall.S_IFREG || e.typ() == syscall.S_IFLNK {
			files[top]++
		}
	}
	tops := make([]string, 0, len(isDir))
	for top := range isDir {
		tops = append(tops, top)
	}
	sort.Strings(tops)
	for _, top := range tops {
		if !isDir[top] || top == "zz-sluice-extras" || tracked+files[top] <= progGitMaxFiles {
			paths = append(paths, top)
			tracked += files[top]
		}
	}
	return paths, tracked
}

func progGit(t *testing.T, e *progEnv) {
	if e.tree == nil {
		t.Fatal("needs the tree the SourceTree subtest untars, which tar failed to extract")
	}
	tr := e.tree
	env := progGitEnv(t, t.TempDir())
	git := func(dir string, args ...string) progResult {
		t.Helper()
		return progMust(t, dir, env, nil, "git", append(append([]string{}, progGitArgs...), args...)...)
	}
	paths, tracked := progGitPaths(tr)
	if paths != nil {
		t.Logf("git commits %d of the tree's %d files: %s", tracked, tr.tracked, strings.Join(paths, " "))
	}
	addArgs := append([]string{"add", "-A", "--"}, paths...)

	// The tree git should record, computed from the original in memory.
	ref := filepath.Join(baseDir(t), "ref.git")
	refEnv := append(append([]string{}, env...), "GIT_DIR="+ref, "GIT_WORK_TREE="+tr.root)
	progMust(t, tr.root, refEnv, nil, "git", append(append([]string{}, progGitArgs...), "init", "-q")...)
	progMust(t, tr.root, refEnv, nil, "git", append(append([]string{}, progGitArgs...), addArgs...)...)
	wantTree := strings.TrimSpace(progMust(t, tr.root, refEnv, nil, "git", "write-tree").stdout)

	// All of git's work happens on the mount, in the untarred tree.
	dir := e.dir1("src")
	git(dir, "init", "-q")
	for key, want := range map[string]string{"core.filemode": "true", "core.symlinks": "true"} {
		// git init probes the file system and turns these off where
		// it finds executable bits or symbolic links do not work.
		if got := strings.TrimSpace(progRun(t, dir, env, nil, "git", "config", "--get", key).stdout); got != want && got != "" {
			t.Errorf("git init set %s = %q on the mount, want %q", key, got, want)
		}
	}
	git(dir, addArgs...)
	git(dir, "commit", "-q", "-m", "import the Go source tree")
	log := git(dir, "log", "--oneline").stdout
	if !regexp.MustCompile(`^[0-9a-f]{7,40} import the Go source tree\n$`).MatchString(log) {
		t.Errorf("git log --oneline: %q, want the one commit", log)
	}
	if got := strings.TrimSpace(git(dir, "rev-parse", "HEAD^{tree}").stdout); got != wantTree {
		t.Errorf("the commit's tree is %s, want %s (git add of the original tree)", got, wantTree)
	}
	ls := git(dir, "ls-files", "-z").stdout
	if n := strings.Count(ls, "\x00"); n != tracked {
		t.Errorf("git ls-files lists %d files, want %d (the regular files and symbolic links added)", n, tracked)
	}
	if st := git(dir, append([]string{"status", "--porcelain", "--untracked-files=all", "--"}, paths...)...).stdout; st != "" {
		t.Errorf("git status --porcelain after the commit:\n%s", tail(st, 20))
	}
	if st := git(dir, "status", "--porcelain", "--untracked-files=no").stdout; st != "" {
		t.Errorf("git status --porcelain --untracked-files=no after the commit:\n%s", tail(st, 20))
	}
	fsck := git(dir, "fsck", "--full", "--strict", "--no-dangling")
	if out := fsck.stdout + fsck.stderr; regexp.MustCompile(`(?i)error|missing|broken|corrupt|bad`).MatchString(out) {
		t.Errorf("git fsck reported problems:\n%s", tail(out, 30))
	}
	// A file git stored, read back out of the object store on the
	// mount, through the other mount.
	show := progMust(t, e.dir2("src"), env, nil, "git", append(append([]string{}, progGitArgs...), "show", "HEAD:zz-sluice-extras/big.bin")...)
	if want, err := os.ReadFile(filepath.Join(tr.root, "zz-sluice-extras", "big.bin")); err != nil || show.stdout != string(want) {
		t.Errorf("git show HEAD:zz-sluice-extras/big.bin through the second mount: %d bytes, want the original's %d (%v)", len(show.stdout), len(want), err)
	}
	progCheckPolicy(t, e, e.dir2("src", ".git", "index"))
}

// ---- SQLite ----

// progSQLRow is one row the script inserts.
type progSQLRow struct {
	key string
	v   int64
}

// progSQLScript returns the writer's SQL (5 transactions of 1,000
// inserts, an update, a transaction rolled back, a delete) and the rows
// the database holds afterwards.
func progSQLScript() (string, map[int]progSQLRow) {
	var b strings.Builder
	rows := map[int]progSQLRow{}
	b.WriteString("CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT NOT NULL UNIQUE, v INTEGER NOT NULL, pad BLOB);\n")
	b.WriteString("CREATE INDEX t_v ON t(v);\n")
	id := 0
	for tx := 0; tx < 5; tx++ {
		b.WriteString("BEGIN;\n")
		for i := 0; i < 1000; i++ {
			id++
			r := progSQLRow{key: fmt.Sprintf("key-%06d-%x", id, id*2654435761%4294967296), v: int64(id) * 7919 % 100003}
			rows[id] = r
			fmt.Fprintf(&b, "INSERT INTO t(id, k, v, pad) VALUES(%d, '%s', %d, randomblob(%d));\n", id, r.key, r.v, 100+id%300)
		}
		b.WriteString("COMMIT;\n")
	}
	b.WriteString("BEGIN;\nUPDATE t SET v = v + 1 WHERE id % 10 = 0;\nCOMMIT;\n")
	for i, r := range rows {
		if i%10 == 0 {
			r.v++
			rows[i] = r
		}
	}
	// Undone: the journal (or the WAL) must restore every page.
	b.WriteString("BEGIN;\nDELETE FROM t WHERE id % 2 = 0;\nUPDATE t SET v = -1;\n")
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&b, "INSERT INTO t(k, v, pad) VALUES('junk-%d', 1, randomblob(500));\n", i)
	}
	b.WriteString("ROLLBACK;\n")
	b.WriteString("BEGIN;\nDELETE FROM t WHERE id % 97 = 0;\nCOMMIT;\n")
	for i := range rows {
		if i%97 == 0 {
			delete(rows, i)
		}
	}
	return b.String(), rows
}

// progSQLCheck is the reader's query and what it must print.
func progSQLCheck(rows map[int]progSQLRow) (query, want string) {
	var sumV, sumLen int64
	for _, r := range rows {
		sumV += r.v
		sumLen += int64(len(r.key))
	}
	query = "SELECT count(*), sum(v), sum(length(k)), count(DISTINCT k) FROM t;\n" +
		"SELECT count(*) FROM t WHERE k LIKE 'junk-%' OR v < 0;\n" +
		"PRAGMA integrity_check;\n"
	want = fmt.Sprintf("%d|%d|%d|%d\n0\nok\n", len(rows), sumV, sumLen, len(rows))
	return query, want
}

// progSQLite runs the sqlite3 shell on a database on the mount. The
// writer stays open (with WAL, nothing checkpointed) while a second
// sqlite3 on the same mount reads the database — with WAL, through the
// shared-memory index the two map from the -shm file; after the writer
// exits, a third reads it through the second mount.
func progSQLite(t *testing.T, e *progEnv, wal bool) {
	name := "journal.db"
	if wal {
		name = "wal.db"
	}
	if err := os.MkdirAll(e.dir1("sqlite"), 0o755); err != nil {
		t.Fatal(err)
	}
	db := e.dir1("sqlite", name)
	script, rows := progSQLScript()
	query, want := progSQLCheck(rows)

	ctx, cancel := context.WithTimeout(context.Background(), progTimeout)
	defer cancel()
	w := exec.CommandContext(ctx, "sqlite3", "-batch", "-bail", db)
	w.WaitDelay = 5 * time.Second
	stdin, err := w.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var werr bytes.Buffer
	w.Stderr = &werr
	start := time.Now()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		w.Process.Kill()
		w.Wait()
	}()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// readUntil returns the writer's output lines up to the marker line.
	readUntil := func(marker string) []string {
		t.Helper()
		var got []string
		timeout := time.After(progTimeout)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("sqlite3 (writer) exited before printing %q; output %q; stderr:\n%s", marker, got, tail(werr.String(), 30))
				}
				if l == marker {
					return got
				}
				got = append(got, l)
			case <-timeout:
				t.Fatalf("sqlite3 (writer) printed no %q within %s; output %q; stderr:\n%s", marker, progTimeout, got, tail(werr.String(), 30))
			}
		}
	}
	prelude := "PRAGMA journal_mode=DELETE;\n"
	if wal {
		prelude = "PRAGMA journal_mode=WAL;\nPRAGMA wal_autocheckpoint=0;\n"
	}
	if _, err := io.WriteString(stdin, prelude+script+".print SLUICE-WRITTEN\n"); err != nil {
		t.Fatalf("writing to sqlite3: %v; stderr:\n%s", err, tail(werr.String(), 30))
	}
	out := readUntil("SLUICE-WRITTEN")
	// The pragmas print the journal mode (and the checkpoint setting).
	wantMode, wantOut := "delete", []string{"delete"}
	if wal {
		wantMode, wantOut = "wal", []string{"wal", "0"}
	}
	if strings.Join(out, "\n") != strings.Join(wantOut, "\n") {
		t.Fatalf("sqlite3 (writer): the pragmas printed %q, want %q; stderr:\n%s", out, wantOut, tail(werr.String(), 30))
	}
	t.Logf("sqlite3 (writer): %d rows written in %s", len(rows), time.Since(start).Round(time.Millisecond))
	if wal {
		fi, err := os.Stat(db + "-wal")
		if err != nil || fi.Size() == 0 {
			t.Errorf("with the writer open and checkpoints off, %s-wal should hold the transactions: %v", db, err)
		}
		if _, err := os.Stat(db + "-shm"); err != nil {
			t.Errorf("the WAL index: %v", err)
		}
	}

	// A reader while the writer is open, on the same mount.
	r := progMust(t, e.dir1("sqlite"), nil, strings.NewReader(query), "sqlite3", "-batch", "-bail", db)
	if r.stdout != want || r.stderr != "" {
		t.Errorf("sqlite3 (reader, writer still open): printed %q, want %q; stderr %q", r.stdout, want, r.stderr)
	}
	// The writer checks too, then exits (with WAL: checkpointing).
	if _, err := io.WriteString(stdin, query+".print SLUICE-CHECKED\n"); err != nil {
		t.Fatalf("writing to sqlite3: %v", err)
	}
	if got := strings.Join(readUntil("SLUICE-CHECKED"), "\n") + "\n"; got != want {
		t.Errorf("sqlite3 (writer): printed %q, want %q", got, want)
	}
	stdin.Close()
	if err := w.Wait(); err != nil || werr.Len() > 0 {
		t.Fatalf("sqlite3 (writer): %v; stderr:\n%s", err, tail(werr.String(), 30))
	}
	if wal {
		if _, err := os.Stat(db + "-wal"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s-wal after the last connection closed: %v, want it checkpointed and removed", db, err)
		}
	}

	// Another process, through the other mount: what the cluster holds.
	r = progMust(t, e.dir2("sqlite"), nil, strings.NewReader(query+"PRAGMA journal_mode;\n"), "sqlite3", "-batch", "-bail", e.dir2("sqlite", name))
	if want2 := want + wantMode + "\n"; r.stdout != want2 || r.stderr != "" {
		t.Errorf("sqlite3 (through the second mount): printed %q, want %q; stderr %q", r.stdout, want2, r.stderr)
	}
	progCheckPolicy(t, e, e.dir2("sqlite", name))
}

// ---- fio ----

// progFioReport is the part of fio's JSON output the tests check.
type progFioReport struct {
	Jobs []struct {
		Name  string `json:"jobname"`
		Error int    `json:"error"`
		Read  struct {
			Bytes int64 `json:"io_bytes"`
		} `json:"read"`
		Write struct {
			Bytes int64 `json:"io_bytes"`
		} `json:"write"`
	} `json:"jobs"`
}

// progFio runs one fio job that writes size bytes (rw: write or
// randwrite, in blocks of bs) with crc32c checksums in every block, then
// reads everything back and verifies it; then, through the second mount,
// a verify-only run of the same job reads and verifies the file again,
// from the cluster.
func progFio(t *testing.T, e *progEnv, name, rw, bs string, size int64) {
	for _, m := range []string{e.dir1("fio"), e.dir2("fio")} {
		if err := os.MkdirAll(m, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	scratch := t.TempDir() // fio's state and reports, off the mount
	job := func(dir string, verifyOnly bool) progFioReport {
		t.Helper()
		report := filepath.Join(scratch, fmt.Sprintf("%s-%v.json", name, verifyOnly))
		args := []string{
			"--name=" + name, "--directory=" + dir, "--rw=" + rw, "--bs=" + bs,
			"--size=" + strconv.FormatInt(size, 10), "--ioengine=psync", "--direct=0",
			"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--randrepeat=1",
			"--output-format=json", "--output=" + report,
		}
		if verifyOnly {
			args = append(args, "--verify_only")
		}
		r := progRun(t, scratch, nil, nil, "fio", args...)
		raw, err := os.ReadFile(report)
		if r.code != 0 || err != nil {
			t.Fatalf("fio %s: exit %d (%v)\nstderr:\n%s\nstdout:\n%s\nreport:\n%s", strings.Join(args, " "), r.code, err, tail(r.stderr, 30), tail(r.stdout, 30), tail(string(raw), 30))
		}
		if strings.Contains(r.stderr+r.stdout, "verify failed") || strings.Contains(r.stderr+r.stdout, "bad magic") {
			t.Errorf("fio reported verification failures:\n%s", tail(r.stderr+r.stdout, 30))
		}
		var rep progFioReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatalf("fio's JSON report: %v in\n%s", err, tail(string(raw), 30))
		}
		if len(rep.Jobs) != 1 || rep.Jobs[0].Name != name {
			t.Fatalf("fio's report has jobs %+v, want one named %s", rep.Jobs, name)
		}
		if rep.Jobs[0].Error != 0 {
			t.Errorf("fio job %s: error %d", name, rep.Jobs[0].Error)
		}
		return rep
	}

	rep := job(e.dir1("fio"), false)
	if j := rep.Jobs[0]; j.Write.Bytes != size || j.Read.Bytes != size {
		t.Errorf("fio %s: wrote %d bytes and read back %d to verify, want %d and %d", name, j.Write.Bytes, j.Read.Bytes, size, size)
	}
	data := e.dir2("fio", name+".0.0")
	if fi, err := os.Stat(data); err != nil || fi.Size() != size {
		t.Fatalf("fio's file through the second mount: %v, want %d bytes", err, size)
	}
	rep = job(e.dir2("fio"), true)
	if j := rep.Jobs[0]; j.Read.Bytes != size {
		t.Errorf("fio %s --verify_only through the second mount: read %d bytes, want %d", name, j.Read.Bytes, size)
	}
	progCheckPolicy(t, e, data)
}

// ---- db_bench ----

var (
	progReFillseq    = regexp.MustCompile(`(?m)^fillseq\s*:.*\s(\d+) operations;`)
	progReReadrandom = regexp.MustCompile(`(?m)^readrandom\s*:.*\s(\d+) operations;.*\((\d+) of (\d+) found\)`)
)

// progDBBench fills a RocksDB database on the mount with db_bench and
// reads it back at random: every key must be found. Memtables are small,
// so the data goes to SST files on the mount; a second run, through the
// second mount, reopens the database and reads every key again from
// those files.
func progDBBench(t *testing.T, e *progEnv) {
	const num = 20000
	if err := os.MkdirAll(e.dir1("rocksdb"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := func(db, benchmarks string, existing bool) []string {
		return []string{
			"--benchmarks=" + benchmarks, "--db=" + db, "--num=" + strconv.Itoa(num), "--reads=" + strconv.Itoa(num),
			"--use_existing_db=" + strconv.FormatBool(existing), "--value_size=400", "--compression_type=none",
			"--write_buffer_size=1048576", "--target_file_size_base=2097152", "--seed=1", "--threads=1",
			"--progress_reports=false", "--histogram=false",
		}
	}
	check := func(r progResult, fill bool) {
		t.Helper()
		if fill {
			if m := progReFillseq.FindStringSubmatch(r.stdout); m == nil || m[1] != strconv.Itoa(num) {
				t.Errorf("db_bench fillseq: no line reporting %d operations in\n%s", num, tail(r.stdout, 30))
			}
		}
		m := progReReadrandom.FindStringSubmatch(r.stdout)
		if m == nil {
			t.Fatalf("db_bench: no readrandom result in\n%s\nstderr:\n%s", tail(r.stdout, 30), tail(r.stderr, 30))
		}
		if m[1] != strconv.Itoa(num) || m[2] != strconv.Itoa(num) || m[3] != strconv.Itoa(num) {
			t.Errorf("db_bench readrandom: %s operations, %s of %s keys found, want %d of %d", m[1], m[2], m[3], num, num)
		}
	}
	db := e.dir1("rocksdb", "db")
	check(progMust(t, e.dir1("rocksdb"), nil, nil, "db_bench", args(db, "fillseq,readrandom", false)...), true)
	ssts, _ := filepath.Glob(filepath.Join(e.dir2("rocksdb", "db"), "*.sst"))
	if len(ssts) < 2 {
		t.Errorf("db_bench left %d SST files in %s, want several (memtables of 1 MiB)", len(ssts), db)
	}
	check(progMust(t, e.dir2("rocksdb"), nil, nil, "db_bench", args(e.dir2("rocksdb", "db"), "readrandom", true)...), false)
	if len(ssts) > 0 {
		progCheckPolicy(t, e, ssts[0])
	}
}

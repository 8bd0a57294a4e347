package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// TestDataIsPrivate (issue 15, defect 7): meta, a storage node and
// `sluice up`, started with umask 022, write nothing any other account
// can read — chunk files, the index, identities, the secret, client
// credentials — and a restart makes private what an older version left
// readable by everyone.
func TestDataIsPrivate(t *testing.T) {
	old := syscall.Umask(0o022) // the children inherit it
	t.Cleanup(func() { syscall.Umask(old) })
	dir := baseDir(t)
	data := randomBytes(t, 3<<20) // big enough for direct placement
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}

	// Separate processes.
	c := startMeta(t, dir)
	n := c.startNode(t, "n1")
	waitNodesUp(t, c.conf, 1, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "1")
	mustRun(t, c.conf, nil, "put", src, "/a")
	mustRun(t, c.conf, nil, "put", src, "/b")
	mustRun(t, c.conf, nil, "rm", "/b")
	eventually(t, 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		free, _ := filepath.Glob(filepath.Join(n.dir, "store", "free", "*"))
		return len(free) > 0, "the removed file's chunk file is not recycled yet"
	})
	metaDir := filepath.Join(dir, "meta")
	checkPrivate(t, metaDir, n.dir)
	checkClean(t, c.conf, 30*time.Second)

	// `sluice up`, its client.conf and its nodes.
	upDir := filepath.Join(dir, "up")
	u := startUp(t, upDir, 1)
	mustRun(t, u.conf, nil, "policy", "set", "/", "--replicas", "1")
	mustRun(t, u.conf, nil, "put", src, "/a")
	checkPrivate(t, upDir)
	if code := u.proc.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("up exited %d", code)
	}

	// An upgrade from a version that left everything open: the restarted
	// processes close it.
	if code := n.proc.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("node exited %d", code)
	}
	if code := c.metaProc.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("meta exited %d", code)
	}
	opened := 0
	for _, d := range []string{metaDir, n.dir, upDir} {
		opened += openUp(t, d)
	}
	if opened < 20 {
		t.Fatalf("opened only %d entries", opened)
	}
	c2 := startMeta(t, dir)
	n2 := c2.startNode(t, "n1")
	waitNodesUp(t, c2.conf, 1, 15*time.Second)
	if got := mustRun(t, c2.conf, nil, "cat", "/a").stdout; !bytes.Equal(got, data) {
		t.Fatalf("cat /a after the restart: %d bytes, want the %d written", len(got), len(data))
	}
	mustRun(t, c2.conf, nil, "put", src, "/c")
	u2 := startUp(t, upDir, 1)
	mustRun(t, u2.conf, nil, "put", src, "/c")
	checkPrivate(t, metaDir, n2.dir, upDir)
}

// checkPrivate fails t for every entry under dirs (dirs included) that
// lets group or others in, and for finding too few to mean anything.
func checkPrivate(t *testing.T, dirs ...string) {
	t.Helper()
	seen := map[string]int{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if os.IsNotExist(err) {
					return nil // removed while walking
				}
				return err
			}
			fi, err := os.Lstat(p)
			if os.IsNotExist(err) {
				return nil
			} else if err != nil {
				return err
			}
			if fi.Mode().Type() == fs.ModeSymlink {
				return nil
			}
			seen[filepath.Ext(p)]++
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s is %v: others may read it", p, fi.Mode())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The entries the test means to cover: chunk files, the index's log,
	// the secret, client credentials, the node's identity.
	for _, ext := range []string{".chunk", ".log", ".secret", ".conf", ".json"} {
		if seen[ext] == 0 {
			t.Errorf("no %s file under %v: the test looks at the wrong place (%v)", ext, dirs, seen)
		}
	}
}

// openUp gives group and others read (and search) access to everything
// under dir, as an older version's umask would have; it returns how many
// entries it changed.
func openUp(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		} else if !d.Type().IsRegular() {
			return nil
		}
		n++
		return os.Chmod(p, mode)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDataDirOthersCanWrite (issue 16, item 6): `sluice node`, `sluice
// meta` and `sluice up` refuse a data directory other users can write
// (they could plant chunk files or an identity), with a message saying
// so, and create nothing in it; made private, it is accepted.
func TestDataDirOthersCanWrite(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	open := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
		return p
	}
	want := []string{`writable by group or others`, `refusing to use it`}
	nodeDir, metaDir, upDir := open("node"), open("meta2"), open("up")
	mustFail(t, c.conf, append(want, regexp.QuoteMeta(nodeDir)), "node", "--data", nodeDir, "--meta", c.meta, "--join", "SJ1-unused")
	mustFail(t, c.conf, append(want, regexp.QuoteMeta(metaDir)), "meta", "--data", metaDir, "--listen", "127.0.0.1:0")
	mustFail(t, c.conf, append(want, regexp.QuoteMeta(upDir)), "up", "--data", upDir, "--listen", "127.0.0.1:0", "--nodes", "1")
	// A directory below one others can write could be swapped for theirs.
	mustFail(t, c.conf, []string{`its parent ` + regexp.QuoteMeta(nodeDir) + ` is writable`, `refusing`},
		"node", "--data", filepath.Join(nodeDir, "sub"), "--meta", c.meta, "--join", "SJ1-unused")
	for _, d := range []string{nodeDir, metaDir, upDir} {
		if ents, err := os.ReadDir(d); err != nil || len(ents) != 0 {
			t.Errorf("%s: %d entries (%v) after the refusal", d, len(ents), err)
		}
	}
	if err := os.Chmod(nodeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	c.startNodeIn(t, "node", nodeDir)
	waitNodesUp(t, c.conf, 1, 15*time.Second)
}

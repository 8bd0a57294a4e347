package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMetaBackupRestore (issue 17, item 2): a backup taken while a
// writer writes, restored onto a "new host" (another loopback address)
// after meta is killed, serves the same namespace and data to the same
// nodes; truncated, corrupted and foreign backups are refused, each
// with its reason, leaving the directory as it was.
func TestMetaBackupRestore(t *testing.T) {
	nodeArgs := []string{"--inventory-interval", "1s"}
	c := threeNodes(t, []string{"--orphan-grace", "2s"}, nodeArgs)
	dir := c.dir

	// Files of several sizes and directories, all before the backup.
	before := map[string][]byte{}
	mustRun(t, c.conf, nil, "mkdir", "/d", "/d/e")
	for i, size := range []int{0, 1, 4 << 10, 1 << 20, 5<<20 + 3} {
		p := fmt.Sprintf("/d/e/f%d", i)
		if i%2 == 0 {
			p = fmt.Sprintf("/g%d", i)
		}
		before[p] = randomBytes(t, size)
		mustRun(t, c.conf, bytes.NewReader(before[p]), "put", "-", p)
	}

	// A writer keeps writing during the backup.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var written atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			if r := run(t, c.conf, bytes.NewReader(randomBytes(t, 256<<10)), "put", "-", fmt.Sprintf("/w%d", i)); r.code != 0 {
				t.Errorf("writer: %s", r)
				return
			}
			written.Add(1)
		}
	}()
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) { return written.Load() >= 2, "writer has not written" })
	backup := filepath.Join(dir, "meta.backup")
	out := string(mustRun(t, c.conf, nil, "meta", "backup", backup).stdout)
	if !regexp.MustCompile(`^sluice: backup of cluster sha256:[0-9a-f]{64} \(meta ` + regexp.QuoteMeta(c.meta) + `, taken \S+\) written to ` + regexp.QuoteMeta(backup) + `, \d+ bytes\n$`).MatchString(out) {
		t.Errorf("backup printed %q", out)
	}
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return written.Load() >= 4, "writer stopped writing during the backup"
	})
	stop.Store(true)
	wg.Wait()
	if st, err := os.Stat(backup); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v, mode %v (want 0600: it holds the cluster's keys)", err, st.Mode())
	}
	if ents, _ := filepath.Glob(filepath.Join(c.dir, "meta", ".backup-*")); len(ents) != 0 {
		t.Errorf("meta left its checkpoint behind: %v", ents)
	}

	// Only an admin may take one: it holds every key of the cluster.
	bob := filepath.Join(dir, "bob.conf")
	mustRun(t, c.conf, nil, "auth", "add", "bob", "--conf-out", bob)
	mustFail(t, bob, []string{"not an admin"}, "meta", "backup", filepath.Join(dir, "bob.backup"))
	if _, err := os.Stat(filepath.Join(dir, "bob.backup")); !os.IsNotExist(err) {
		t.Errorf("a refused backup left a file (%v)", err)
	}

	// Meta's host is lost.
	c.metaProc.kill()
	for _, n := range c.nodes {
		n.proc.stop(t, 20*time.Second)
	}

	// Bad backups are refused by name, leaving the directory as it was.
	oldDir := filepath.Join(dir, "meta")
	whole, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	bad := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(whole)
	flipped[len(flipped)/2] ^= 1
	newDir := filepath.Join(dir, "meta-new")
	os.Mkdir(newDir, 0o700)
	for _, tc := range []struct{ file, dir, want string }{
		{bad("half.backup", whole[:len(whole)/2]), newDir, `truncated or corrupted \(its checksum does not match\)`},
		{bad("flipped.backup", flipped), newDir, `truncated or corrupted`},
		{bad("text.backup", []byte("hello\n")), newDir, `not a Sluice meta backup`},
		{backup, oldDir, `already holds this cluster's meta: --force replaces it`},
	} {
		snap := snapshotDir(t, tc.dir)
		mustFail(t, c.conf, []string{tc.want, regexp.QuoteMeta(tc.dir) + " is unchanged"}, "meta", "restore", tc.file, "--data", tc.dir)
		if after := snapshotDir(t, tc.dir); fmt.Sprint(after) != fmt.Sprint(snap) {
			t.Errorf("a refused restore of %s changed %s", tc.file, tc.dir)
		}
	}
	// Another cluster's backup onto this cluster's directory.
	os.MkdirAll(filepath.Join(dir, "other"), 0o700)
	other := startMeta(t, filepath.Join(dir, "other"))
	otherBackup := filepath.Join(dir, "other.backup")
	mustRun(t, other.conf, nil, "meta", "backup", otherBackup)
	snap := snapshotDir(t, oldDir)
	mustFail(t, c.conf, []string{`holds the meta of another cluster`, regexp.QuoteMeta(oldDir) + " is unchanged"},
		"meta", "restore", otherBackup, "--data", oldDir, "--force")
	if fmt.Sprint(snapshotDir(t, oldDir)) != fmt.Sprint(snap) {
		t.Errorf("restoring another cluster's backup changed %s", oldDir)
	}

	// Restore on the "new host": 127.0.0.2.
	mustRun(t, c.conf, nil, "meta", "restore", backup, "--data", newDir)
	p := startDaemon(t, dir, "meta-new", "meta", "--data", newDir, "--listen", "127.0.0.2:0", "--advertise", "127.0.0.2",
		"--node-timeout", "2s", "--orphan-grace", "2s")
	info := p.waitReady(t, 20*time.Second)
	c.meta, c.conf = info.Meta, info.Conf
	if host := c.meta[:len("127.0.0.2")]; host != "127.0.0.2" {
		t.Fatalf("restored meta serves at %s", c.meta)
	}
	for id, n := range c.nodes {
		delete(c.nodes, id)
		c.startNodeIn(t, n.proc.name, n.dir, nodeArgs...)
	}
	st := waitNodesUp(t, c.conf, 3, 30*time.Second)
	if st.MetaAddr != c.meta {
		t.Errorf("restored meta reports address %s, serves at %s", st.MetaAddr, c.meta)
	}
	for p, want := range before {
		got := mustRun(t, c.conf, nil, "cat", p).stdout
		if !bytes.Equal(got, want) {
			t.Errorf("%s after restore: %d bytes (sum %s), want %d (sum %s)", p, len(got), sum(got), len(want), sum(want))
		}
	}
	ls := string(mustRun(t, c.conf, nil, "ls", "/d/e").stdout)
	if !regexp.MustCompile(`f1`).MatchString(ls) || !regexp.MustCompile(`f3`).MatchString(ls) {
		t.Errorf("ls /d/e after restore: %q", ls)
	}
	// New files get chunk ids the lost meta never gave out: nodes hold
	// copies (and tombstones) under the ids it gave out after the backup.
	after := randomBytes(t, 1<<20)
	for i := 0; i < 5; i++ {
		p := fmt.Sprintf("/after%d", i)
		mustRun(t, c.conf, bytes.NewReader(after), "put", "-", p)
		if got := mustRun(t, c.conf, nil, "cat", p).stdout; !bytes.Equal(got, after) {
			t.Errorf("%s written after the restore: %d bytes back, want %d", p, len(got), len(after))
		}
	}
	// Copies written after the backup are strays to the restored meta:
	// collected, and then the cluster checks clean.
	checkClean(t, c.conf, 90*time.Second)
}

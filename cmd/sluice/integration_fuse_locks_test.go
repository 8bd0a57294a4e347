package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockCluster starts meta (with a short lock lease), three nodes and two
// mounts of the cluster.
func lockCluster(t *testing.T) (c *splitCluster, a, b *mounted) {
	t.Helper()
	requireFUSE(t)
	c = startMeta(t, baseDir(t), "--lock-lease", "3s")
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	return c, mountAt(t, c.conf, "mnt-a"), mountAt(t, c.conf, "mnt-b")
}

// setlk is fcntl(F_SETLK or another command) of [start, start+len).
func setlk(fd, cmd int, typ int16, start, length int64) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: length}
	for {
		err := unix.FcntlFlock(uintptr(fd), cmd, &lk)
		if err != syscall.EINTR {
			return err
		}
	}
}

func getlk(t *testing.T, fd int, typ int16, start, length int64) unix.Flock_t {
	t.Helper()
	lk := unix.Flock_t{Type: typ, Start: start, Len: length}
	mustOK(t, "F_GETLK", unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk))
	return lk
}

// TestFUSELocksAcrossMounts: fcntl, OFD and flock locks taken on one mount
// hold against the other, end as Linux ends them, and carry the data
// written under them.
func TestFUSELocksAcrossMounts(t *testing.T) {
	c, a, b := lockCluster(t)
	pa, pb := filepath.Join(a.dir, "locked"), filepath.Join(b.dir, "locked")
	writeFile(t, pa, make([]byte, 4096))
	fa := openFD(t, pa, os.O_RDWR, 0)
	fb := openFD(t, pb, os.O_RDWR, 0)

	// Record locks: a range held on A blocks an overlapping one on B,
	// and F_GETLK on B describes it.
	mustOK(t, "A locks 0-99", setlk(fa, unix.F_SETLK, unix.F_WRLCK, 0, 100))
	wantErrno(t, "B locks 50-59 over A's lock", setlk(fb, unix.F_SETLK, unix.F_WRLCK, 50, 10), syscall.EAGAIN, syscall.EACCES)
	wantErrno(t, "B read-locks 99 over A's write lock", setlk(fb, unix.F_SETLK, unix.F_RDLCK, 99, 1), syscall.EAGAIN, syscall.EACCES)
	if lk := getlk(t, fb, unix.F_WRLCK, 10, 1); lk.Type != unix.F_WRLCK || lk.Start != 0 || lk.Len != 100 {
		t.Errorf("F_GETLK on B: %+v, want A's write lock 0+100", lk)
	}
	if lk := getlk(t, fb, unix.F_WRLCK, 100, 0); lk.Type != unix.F_UNLCK {
		t.Errorf("F_GETLK on B past A's range: %+v, want unlocked", lk)
	}
	mustOK(t, "B read-locks 100-", setlk(fb, unix.F_SETLK, unix.F_RDLCK, 100, 0))
	mustOK(t, "A read-locks 200-299 beside B's read lock", setlk(fa, unix.F_SETLK, unix.F_RDLCK, 200, 100))
	wantErrno(t, "A write-locks 150 over B's read lock", setlk(fa, unix.F_SETLK, unix.F_WRLCK, 150, 1), syscall.EAGAIN, syscall.EACCES)
	mustOK(t, "B unlocks", setlk(fb, unix.F_SETLK, unix.F_UNLCK, 0, 0))

	// F_SETLKW on B waits for A's unlock, and no longer.
	got := make(chan error, 1)
	go func() { got <- setlk(fb, unix.F_SETLKW, unix.F_WRLCK, 0, 0) }()
	select {
	case err := <-got:
		t.Fatalf("F_SETLKW on B returned (%v) while A held 0-99", err)
	case <-time.After(500 * time.Millisecond):
	}
	unlocked := time.Now()
	mustOK(t, "A unlocks", setlk(fa, unix.F_SETLK, unix.F_UNLCK, 0, 0))
	select {
	case err := <-got:
		mustOK(t, "F_SETLKW on B", err)
		t.Logf("F_SETLKW on B granted %s after A's unlock", time.Since(unlocked).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("F_SETLKW on B still waiting 5 s after A unlocked")
	}
	wantErrno(t, "A locks while B holds the file", setlk(fa, unix.F_SETLK, unix.F_RDLCK, 0, 1), syscall.EAGAIN, syscall.EACCES)

	// Closing any descriptor of the file drops its process's POSIX locks.
	extra := openFD(t, pb, os.O_RDONLY, 0)
	mustOK(t, "close", syscall.Close(extra))
	mustOK(t, "A locks after B's process closed a descriptor", setlk(fa, unix.F_SETLK, unix.F_WRLCK, 0, 0))
	mustOK(t, "A unlocks", setlk(fa, unix.F_SETLK, unix.F_UNLCK, 0, 0))

	// The data written under a lock is what the next holder reads, even
	// with the old contents cached by the reader's kernel.
	before := readFile(t, pb)
	mustOK(t, "A locks to write", setlk(fa, unix.F_SETLKW, unix.F_WRLCK, 0, 0))
	fresh := randomBytes(t, 3<<20+17)
	pwrite(t, fa, fresh, 0)
	mustOK(t, "A unlocks after writing", setlk(fa, unix.F_SETLK, unix.F_UNLCK, 0, 0))
	mustOK(t, "B locks to read", setlk(fb, unix.F_SETLKW, unix.F_RDLCK, 0, 0))
	buf := make([]byte, len(fresh)+100)
	n, err := pread(fb, buf, 0)
	mustOK(t, "B reads under its lock", err)
	if !bytes.Equal(buf[:n], fresh) {
		t.Errorf("B read %d bytes under its lock after A's locked write of %d: %s", n, len(fresh), describeMismatch(buf[:n], fresh, before))
	}
	if st := fstat(t, fb); st.Size != int64(len(fresh)) {
		t.Errorf("B's fstat under its lock: size %d, want %d", st.Size, len(fresh))
	}
	mustOK(t, "B unlocks", setlk(fb, unix.F_SETLK, unix.F_UNLCK, 0, 0))

	// OFD locks belong to the open file: two descriptors of one process
	// on one mount conflict, and the lock goes with its last close.
	o1 := openFD(t, pa, os.O_RDWR, 0)
	o2 := openFD(t, pa, os.O_RDWR, 0)
	mustOK(t, "OFD lock on o1", setlk(o1, unix.F_OFD_SETLK, unix.F_WRLCK, 0, 10))
	wantErrno(t, "OFD lock on o2", setlk(o2, unix.F_OFD_SETLK, unix.F_WRLCK, 5, 1), syscall.EAGAIN, syscall.EACCES)
	wantErrno(t, "B over the OFD lock", setlk(fb, unix.F_SETLK, unix.F_WRLCK, 0, 1), syscall.EAGAIN, syscall.EACCES)
	mustOK(t, "close o1", syscall.Close(o1))
	eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := setlk(o2, unix.F_OFD_SETLK, unix.F_WRLCK, 5, 1)
		return err == nil, fmt.Sprintf("OFD lock on o2 after o1's close: %v", err)
	})
	mustOK(t, "close o2", syscall.Close(o2))
	// Its OFD lock goes with the kernel's RELEASE, after close returns.
	eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := setlk(fb, unix.F_SETLK, unix.F_WRLCK, 5, 1)
		return err == nil, fmt.Sprintf("POSIX lock on B after o2's close: %v", err)
	})
	mustOK(t, "B unlocks after o2's close", setlk(fb, unix.F_SETLK, unix.F_UNLCK, 5, 1))

	// BSD locks, likewise across mounts.
	mustOK(t, "flock on A", unix.Flock(fa, unix.LOCK_EX|unix.LOCK_NB))
	wantErrno(t, "flock on B", unix.Flock(fb, unix.LOCK_SH|unix.LOCK_NB), syscall.EWOULDBLOCK)
	mustOK(t, "POSIX lock on B beside A's BSD lock", setlk(fb, unix.F_SETLK, unix.F_WRLCK, 0, 0))
	mustOK(t, "B unlocks", setlk(fb, unix.F_SETLK, unix.F_UNLCK, 0, 0))
	mustOK(t, "flock unlock on A", unix.Flock(fa, unix.LOCK_UN))
	mustOK(t, "flock on B after A's unlock", unix.Flock(fb, unix.LOCK_SH|unix.LOCK_NB))
	mustOK(t, "close B's descriptor", syscall.Close(fb))
	eventually(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := unix.Flock(fa, unix.LOCK_EX|unix.LOCK_NB)
		return err == nil, fmt.Sprintf("flock on A after B closed its locked file: %v", err)
	})
	mustOK(t, "close A's descriptor", syscall.Close(fa))

	// A mount killed holding a lock blocks the others for one lease.
	cm := mountAt(t, c.conf, "mnt-c")
	fc := openFD(t, filepath.Join(cm.dir, "locked"), os.O_RDWR, 0)
	mustOK(t, "C locks", setlk(fc, unix.F_SETLK, unix.F_WRLCK, 0, 0))
	fb = openFD(t, pb, os.O_RDWR, 0)
	defer syscall.Close(fb)
	cm.proc.kill()
	killed := time.Now()
	wantErrno(t, "B locks right after C died", setlk(fb, unix.F_SETLK, unix.F_WRLCK, 0, 0), syscall.EAGAIN, syscall.EACCES)
	eventually(t, 15*time.Second, 100*time.Millisecond, func() (bool, string) {
		err := setlk(fb, unix.F_SETLK, unix.F_WRLCK, 0, 0)
		return err == nil, fmt.Sprintf("B locks after C's death (lease 3s): %v", err)
	})
	t.Logf("a killed mount's lock lapsed %s after the kill (lease 3s)", time.Since(killed).Round(100*time.Millisecond))
	syscall.Close(fc) // on a dead mount: errors are expected
}

// TestFUSESQLiteTwoMounts runs two sqlite3 shells, one on each mount,
// incrementing one counter in a database in concurrent transactions
// (rollback journal, as SQLite recommends for network file systems):
// with locks and data coherent across mounts, no increment is lost and
// the database stays intact.
func TestFUSESQLiteTwoMounts(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Fatalf("sqlite3 is needed (scripts/test installs it): %v", err)
	}
	_, a, b := lockCluster(t)
	dbA, dbB := filepath.Join(a.dir, "shared.db"), filepath.Join(b.dir, "shared.db")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sql := func(db, script string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "sqlite3", "-batch", "-bail", db, script).CombinedOutput()
		if err != nil {
			t.Fatalf("sqlite3 %s: %v\n%s", db, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	sql(dbA, "PRAGMA journal_mode=DELETE; CREATE TABLE c(id INTEGER PRIMARY KEY, n INTEGER); INSERT INTO c VALUES(1, 0); CREATE TABLE log(who TEXT, i INTEGER);")

	const perShell = 60
	script := func(who string) string {
		var s strings.Builder
		s.WriteString(".timeout 60000\n")
		for i := 0; i < perShell; i++ {
			fmt.Fprintf(&s, "BEGIN IMMEDIATE; UPDATE c SET n = n + 1 WHERE id = 1; INSERT INTO log VALUES('%s', (SELECT n FROM c WHERE id = 1)); COMMIT;\n", who)
		}
		return s.String()
	}
	start := time.Now()
	errs := make(chan error, 2)
	for _, sh := range []struct{ who, db string }{{"a", dbA}, {"b", dbB}} {
		go func() {
			cmd := exec.CommandContext(ctx, "sqlite3", "-batch", "-bail", sh.db)
			cmd.Stdin = strings.NewReader(script(sh.who))
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = fmt.Errorf("sqlite3 on mount %s: %v\n%s", sh.who, err, tail(string(out), 20))
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d transactions from two mounts in %s", 2*perShell, time.Since(start).Round(time.Millisecond))

	for _, db := range []string{dbA, dbB} {
		if got := sql(db, "PRAGMA integrity_check;"); got != "ok" {
			t.Errorf("integrity_check through %s: %q", db, got)
		}
		want := fmt.Sprintf("%d|%d|%d|%d", 2*perShell, 2*perShell, 2*perShell, perShell)
		if got := sql(db, "SELECT n, (SELECT count(*) FROM log), (SELECT count(DISTINCT i) FROM log), (SELECT count(*) FROM log WHERE who = 'b') FROM c;"); got != want {
			t.Errorf("through %s: counter|log rows|distinct values|b's rows = %s, want %s (an increment was lost or doubled)", db, got, want)
		}
	}
}

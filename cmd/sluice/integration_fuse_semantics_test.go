package main

// FUSE semantics beyond go-fuse's posixtest suite (TestFUSEPosixSuite):
// POSIX corner cases with exact errno values, permission checks against
// the calling user, consistency between two mounts of one cluster,
// buffering of small writes, and faults (a storage node or meta killed,
// an unmount while a file is open) on real `sluice mount` processes.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ---- helpers ----

// wantErrno fails unless err is one of want.
func wantErrno(t *testing.T, what string, err error, want ...syscall.Errno) {
	t.Helper()
	for _, w := range want {
		if errors.Is(err, w) {
			return
		}
	}
	t.Errorf("%s: got %v, want %s", what, err, errnoNames(want))
}

func errnoNames(es []syscall.Errno) string {
	var s []string
	for _, e := range es {
		s = append(s, unix.ErrnoName(e))
	}
	return strings.Join(s, " or ")
}

// errnoOf returns the errno in err, 0 if none.
func errnoOf(err error) syscall.Errno {
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return 0
}

func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	mustOK(t, "write "+path, os.WriteFile(path, data, 0o644))
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	mustOK(t, "read "+path, err)
	return b
}

func wantContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("read %s: %v", path, err)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: %d bytes (%s) %s, want %d bytes (%s) %s", path, len(got), sum(got), preview(got), len(want), sum(want), preview(want))
	}
}

func preview(b []byte) string {
	if len(b) > 40 {
		return fmt.Sprintf("%q...", b[:40])
	}
	return fmt.Sprintf("%q", b)
}

func lstat(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	mustOK(t, "lstat "+path, unix.Lstat(path, &st))
	return st
}

func fstat(t *testing.T, fd int) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	mustOK(t, "fstat", unix.Fstat(fd, &st))
	return st
}

// pread reads exactly len(b) bytes at off with one pread(2) per call
// until done or EOF; it returns the count.
func pread(fd int, b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Pread(fd, b[n:], off+int64(n))
		if err != nil {
			return n, err
		}
		if k == 0 {
			break
		}
		n += k
	}
	return n, nil
}

func pwrite(t *testing.T, fd int, b []byte, off int64) {
	t.Helper()
	n, err := unix.Pwrite(fd, b, off)
	if err != nil || n != len(b) {
		t.Fatalf("pwrite %d bytes at %d: %d, %v", len(b), off, n, err)
	}
}

func openFD(t *testing.T, path string, flags int, mode uint32) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
	mustOK(t, "open "+path, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// mkdirs makes a fresh directory on the mount for a subtest.
func mkdirs(t *testing.T, parts ...string) string {
	t.Helper()
	d := filepath.Join(parts...)
	mustOK(t, "mkdir", os.MkdirAll(d, 0o755))
	return d
}

// asUser runs fn on an OS thread whose file system identity is uid:gid
// with gid as its only supplementary group. The FUSE kernel module sends
// the calling thread's fsuid/fsgid in each request and checks
// default_permissions with them, and a non-zero fsuid drops root's file
// capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN...) from the
// thread: its system calls are those of that user, with exact errno
// values. fn must report with t.Error, not t.Fatal.
func asUser(t *testing.T, uid, gid uint32, fn func()) {
	t.Helper()
	setup := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the runtime ends the thread with this
		// goroutine, and the changed credentials with it.
		runtime.LockOSThread()
		// Raw system calls change this thread only (the syscall
		// package's wrappers change every thread of the process).
		groups := []uint32{gid}
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 1, uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
			setup <- fmt.Errorf("setgroups: %v", e)
			return
		}
		unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0)
		unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
		// setfs[ug]id return the previous value; an invalid one (-1)
		// changes nothing and reads it back.
		u, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
		g, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0)
		if uint32(u) != uid || uint32(g) != gid {
			setup <- fmt.Errorf("thread fsuid:fsgid is %d:%d after setting %d:%d", u, g, uid, gid)
			return
		}
		setup <- nil
		fn()
	}()
	if err := <-setup; err != nil {
		<-done
		t.Fatalf("as uid %d: %v", uid, err)
	}
	<-done
}

// letOthersReach makes the directories above a mount point searchable
// by every user: a test's own are private (0700).
func letOthersReach(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != "/dev/shm" && d != os.TempDir(); d = filepath.Dir(d) {
		mustOK(t, "chmod", os.Chmod(d, 0o755))
	}
}

// asUserCmd runs a command as uid:gid (a real process of that user).
func asUserCmd(uid, gid uint32, name string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid}}}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// pattern fills b with the bytes of a reproducible stream at file offset
// off: any range can be checked without keeping the data.
func pattern(b []byte, off int64) {
	for i := 0; i < len(b); {
		pos := off + int64(i)
		w := uint64(pos / 8)
		w ^= w >> 33
		w *= 0xff51afd7ed558ccd
		w ^= w >> 33
		w *= 0xc4ceb9fe1a85ec53
		w ^= w >> 33
		var word [8]byte
		binary.LittleEndian.PutUint64(word[:], w)
		k := copy(b[i:], word[pos%8:])
		i += k
	}
}

// checkPattern reads the whole file at path and reports the first
// offset that differs from pattern, and the size.
func checkPattern(path string) (size int64, bad int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, -1, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	want := make([]byte, len(buf))
	for {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			pattern(want[:n], size)
			if !bytes.Equal(buf[:n], want[:n]) {
				for i := range n {
					if buf[i] != want[i] {
						return size + int64(n), size + int64(i), nil
					}
				}
			}
			size += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return size, -1, nil
		}
		if err != nil {
			return size, -1, err
		}
	}
}

// mountedAt reports whether dir is a mount point (in /proc/self/mountinfo).
func mountedAt(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// within runs fn and fails the test if it takes longer than d (it is left
// running: a hung system call cannot be stopped).
func within(t *testing.T, d time.Duration, what string, fn func()) bool {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		t.Errorf("%s: still blocked after %s", what, d)
		return false
	}
}

// ---- 1. POSIX corner cases ----

func TestFUSEPosixCorners(t *testing.T) {
	_, m := fuseCluster(t)
	root := m.dir

	t.Run("CreateExclTrunc", func(t *testing.T) {
		d := mkdirs(t, root, "excl")
		p := filepath.Join(d, "f")
		writeFile(t, p, []byte("hello world"))
		_, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		wantErrno(t, "O_CREAT|O_EXCL of an existing file", err, syscall.EEXIST)
		mustOK(t, "symlink", os.Symlink("f", filepath.Join(d, "l")))
		_, err = unix.Open(filepath.Join(d, "l"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		wantErrno(t, "O_CREAT|O_EXCL of a symlink", err, syscall.EEXIST)
		_, err = unix.Open(d, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		wantErrno(t, "O_CREAT|O_EXCL of a directory", err, syscall.EEXIST)
		wantContent(t, p, []byte("hello world"))

		// O_TRUNC empties it; what follows is all there is.
		fd := openFD(t, p, unix.O_WRONLY|unix.O_TRUNC, 0)
		if st := fstat(t, fd); st.Size != 0 {
			t.Errorf("fstat after O_TRUNC: size %d, want 0", st.Size)
		}
		if st := lstat(t, p); st.Size != 0 {
			t.Errorf("stat after O_TRUNC: size %d, want 0", st.Size)
		}
		pwrite(t, fd, []byte("abc"), 0)
		mustOK(t, "close", unix.Close(fd))
		wantContent(t, p, []byte("abc"))
		// O_TRUNC with O_CREAT on an existing file, and on an empty one.
		fd = openFD(t, p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
		mustOK(t, "close", unix.Close(fd))
		wantContent(t, p, nil)
		fd = openFD(t, p, unix.O_RDWR|unix.O_TRUNC, 0)
		mustOK(t, "close", unix.Close(fd))
		wantContent(t, p, nil)
		// O_EXCL creates a new file when the name is free.
		fd, err = unix.Open(filepath.Join(d, "new"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		mustOK(t, "O_CREAT|O_EXCL of a new name", err)
		unix.Close(fd)
		if st := lstat(t, filepath.Join(d, "new")); st.Mode != unix.S_IFREG|0o600 || st.Size != 0 {
			t.Errorf("new file: mode %o size %d, want %o size 0", st.Mode, st.Size, unix.S_IFREG|0o600)
		}
	})

	t.Run("AppendTwoFDs", func(t *testing.T) {
		d := mkdirs(t, root, "append")
		p := filepath.Join(d, "log")
		writeFile(t, p, []byte("start\n"))
		a := openFD(t, p, unix.O_WRONLY|unix.O_APPEND, 0)
		b := openFD(t, p, unix.O_WRONLY|unix.O_APPEND, 0)
		var want bytes.Buffer
		want.WriteString("start\n")
		for i := range 50 {
			for _, w := range []struct {
				fd   int
				name string
			}{{a, "a"}, {b, "b"}} {
				line := []byte(fmt.Sprintf("%s%d %s\n", w.name, i, strings.Repeat(w.name, i%7*100)))
				n, err := unix.Write(w.fd, line)
				if err != nil || n != len(line) {
					t.Fatalf("append through %s: %d, %v", w.name, n, err)
				}
				want.Write(line)
			}
		}
		// A pwrite at offset 0 through an O_APPEND descriptor appends
		// too on Linux.
		if _, err := unix.Pwrite(a, []byte("P\n"), 0); err != nil {
			t.Fatal(err)
		}
		want.WriteString("P\n")
		if st := fstat(t, b); st.Size != int64(want.Len()) {
			t.Errorf("fstat while open: size %d, want %d", st.Size, want.Len())
		}
		mustOK(t, "close a", unix.Close(a))
		mustOK(t, "close b", unix.Close(b))
		wantContent(t, p, want.Bytes())
		// A later opener appends at the end too.
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		mustOK(t, "open", err)
		_, err = f.WriteString("end\n")
		mustOK(t, "append", err)
		mustOK(t, "close", f.Close())
		want.WriteString("end\n")
		wantContent(t, p, want.Bytes())
	})

	t.Run("PreadPwriteSparse", func(t *testing.T) {
		d := mkdirs(t, root, "sparse")
		p := filepath.Join(d, "f")
		base := randomBytes(t, 100)
		writeFile(t, p, base)
		fd := openFD(t, p, unix.O_RDWR, 0)
		pwrite(t, fd, []byte("XYZ"), 50)
		pwrite(t, fd, []byte("END"), 10000)
		want := make([]byte, 10003)
		copy(want, base)
		copy(want[50:], "XYZ")
		copy(want[10000:], "END")
		if st := fstat(t, fd); st.Size != 10003 {
			t.Errorf("fstat after pwrite beyond EOF: size %d, want 10003", st.Size)
		}
		for _, r := range []struct{ off, n int64 }{{0, 10003}, {48, 7}, {99, 2}, {100, 9900}, {5000, 100}, {9990, 13}, {10001, 100}} {
			buf := make([]byte, r.n)
			n, err := pread(fd, buf, r.off)
			if err != nil {
				t.Errorf("pread %d at %d: %v", r.n, r.off, err)
				continue
			}
			end := min(r.off+r.n, int64(len(want)))
			if !bytes.Equal(buf[:n], want[r.off:end]) {
				t.Errorf("pread %d at %d: %d bytes %s, want %d bytes %s", r.n, r.off, n, preview(buf[:n]), end-r.off, preview(want[r.off:end]))
			}
		}
		// Reads at and beyond EOF return 0 bytes, no error.
		for _, off := range []int64{10003, 20000, 1 << 40} {
			buf := make([]byte, 10)
			if n, err := unix.Pread(fd, buf, off); n != 0 || err != nil {
				t.Errorf("pread at %d (EOF 10003): %d, %v, want 0, nil", off, n, err)
			}
		}
		mustOK(t, "close", unix.Close(fd))
		wantContent(t, p, want)
		if st := lstat(t, p); st.Size != 10003 {
			t.Errorf("stat after close: size %d, want 10003", st.Size)
		}
	})

	t.Run("SparseAcrossChunk", func(t *testing.T) {
		// One byte past the first 64 MiB chunk: chunk 0 is a hole.
		d := mkdirs(t, root, "chunkhole")
		p := filepath.Join(d, "f")
		const off = 64<<20 + 5
		fd := openFD(t, p, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o644)
		pwrite(t, fd, []byte{'Q'}, off)
		check := func(fd int, when string) {
			if st := fstat(t, fd); st.Size != off+1 {
				t.Errorf("%s: size %d, want %d", when, st.Size, off+1)
			}
			for _, r := range []struct{ off, n int64 }{{0, 4096}, {32 << 20, 4096}, {64<<20 - 4096, 8192}, {64<<20 - 3, 100}} {
				buf := bytes.Repeat([]byte{0xEE}, int(r.n))
				n, err := pread(fd, buf, r.off)
				if err != nil {
					t.Errorf("%s: pread %d at %d: %v", when, r.n, r.off, err)
					continue
				}
				want := make([]byte, min(r.off+r.n, off+1)-r.off)
				if off >= r.off && off < r.off+r.n {
					want[off-r.off] = 'Q'
				}
				if !bytes.Equal(buf[:n], want) {
					t.Errorf("%s: pread %d at %d: %d bytes, nonzero at %d, want %d bytes of zeros with Q at %d",
						when, r.n, r.off, n, bytes.IndexFunc(buf[:n], func(r rune) bool { return r != 0 }), len(want), off-r.off)
				}
			}
		}
		check(fd, "open")
		mustOK(t, "close", unix.Close(fd))
		if st := lstat(t, p); st.Size != off+1 {
			t.Errorf("stat after close: size %d, want %d", st.Size, off+1)
		}
		fd = openFD(t, p, unix.O_RDONLY, 0)
		check(fd, "reopened")
		mustOK(t, "close", unix.Close(fd))
	})

	t.Run("TruncateGrowShrink", func(t *testing.T) {
		d := mkdirs(t, root, "trunc")
		p := filepath.Join(d, "f")
		data := randomBytes(t, 10000)
		writeFile(t, p, data)
		mustOK(t, "truncate shrink", os.Truncate(p, 4096))
		if st := lstat(t, p); st.Size != 4096 {
			t.Errorf("after truncate(4096): size %d", st.Size)
		}
		wantContent(t, p, data[:4096])
		// Growing again must read zeros, not the cut bytes.
		mustOK(t, "truncate grow", os.Truncate(p, 10000))
		want := append(append([]byte(nil), data[:4096]...), make([]byte, 10000-4096)...)
		wantContent(t, p, want)

		// ftruncate on an open descriptor, with writes around it.
		fd := openFD(t, p, unix.O_RDWR, 0)
		mustOK(t, "ftruncate shrink", unix.Ftruncate(fd, 100))
		if st := fstat(t, fd); st.Size != 100 {
			t.Errorf("fstat after ftruncate(100): size %d", st.Size)
		}
		// A write past the cut: the gap between reads as zeros.
		pwrite(t, fd, []byte("tail"), 5000)
		mustOK(t, "ftruncate grow", unix.Ftruncate(fd, 6000))
		want = make([]byte, 6000)
		copy(want, data[:100])
		copy(want[5000:], "tail")
		buf := make([]byte, 7000)
		n, err := pread(fd, buf, 0)
		mustOK(t, "pread", err)
		if !bytes.Equal(buf[:n], want) {
			t.Errorf("after ftruncate/pwrite/ftruncate: %d bytes %s, want %d %s", n, sum(buf[:n]), len(want), sum(want))
		}
		// A write buffered on the mount, then a truncation below it.
		pwrite(t, fd, []byte("buffered"), 6000)
		mustOK(t, "ftruncate after write", unix.Ftruncate(fd, 6002))
		want = append(want, "bu"...)
		mustOK(t, "close", unix.Close(fd))
		wantContent(t, p, want)
		// To zero and back.
		mustOK(t, "truncate 0", os.Truncate(p, 0))
		mustOK(t, "truncate grow", os.Truncate(p, 3000))
		wantContent(t, p, make([]byte, 3000))
		// Truncating a directory.
		wantErrno(t, "truncate of a directory", os.Truncate(d, 0), syscall.EISDIR)
	})

	t.Run("UnlinkWhileOpen", func(t *testing.T) {
		d := mkdirs(t, root, "unlinkopen")
		p := filepath.Join(d, "f")
		writeFile(t, p, []byte("before"))
		fd := openFD(t, p, unix.O_RDWR, 0)
		mustOK(t, "unlink", os.Remove(p))
		_, err := os.Lstat(p)
		wantErrno(t, "stat after unlink", err, syscall.ENOENT)
		pwrite(t, fd, []byte("+after"), 6)
		buf := make([]byte, 100)
		n, err := pread(fd, buf, 0)
		if err != nil || string(buf[:n]) != "before+after" {
			t.Errorf("read through the fd after unlink: %q, %v, want %q", buf[:n], err, "before+after")
		}
		mustOK(t, "fsync after unlink", unix.Fsync(fd))
		st := fstat(t, fd)
		if st.Nlink != 0 || st.Size != 12 {
			t.Errorf("fstat after unlink: nlink %d size %d, want nlink 0 size 12", st.Nlink, st.Size)
		}
		// Reads after the fsync come from the cluster.
		n, err = pread(fd, buf, 0)
		if err != nil || string(buf[:n]) != "before+after" {
			t.Errorf("read through the fd after fsync: %q, %v", buf[:n], err)
		}
		ents, err := os.ReadDir(d)
		mustOK(t, "readdir", err)
		if len(ents) != 0 {
			t.Errorf("readdir after unlink lists %v", ents)
		}
		mustOK(t, "close", unix.Close(fd))
		_, err = os.Lstat(p)
		wantErrno(t, "stat after close", err, syscall.ENOENT)
		// The name is free for a new, empty file.
		fd = openFD(t, p, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o644)
		if st := fstat(t, fd); st.Size != 0 || st.Nlink != 1 {
			t.Errorf("new file under the old name: size %d nlink %d", st.Size, st.Nlink)
		}
		unix.Close(fd)
	})

	// rename(2) itself: os.Rename refuses to replace a directory on its
	// own, before asking the file system.
	t.Run("Rename", func(t *testing.T) {
		d := mkdirs(t, root, "rename")
		a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
		writeFile(t, a, []byte("new contents"))
		writeFile(t, b, []byte("old"))
		// A reader of the replaced file keeps its data.
		old := openFD(t, b, unix.O_RDONLY, 0)
		mustOK(t, "rename over a file", unix.Rename(a, b))
		wantContent(t, b, []byte("new contents"))
		_, err := os.Lstat(a)
		wantErrno(t, "stat of the old name", err, syscall.ENOENT)
		buf := make([]byte, 10)
		if n, err := pread(old, buf, 0); err != nil || string(buf[:n]) != "old" {
			t.Errorf("read of the replaced file through an open fd: %q, %v", buf[:n], err)
		}
		unix.Close(old)

		// Across directories.
		d1, d2 := mkdirs(t, d, "d1"), mkdirs(t, d, "d2")
		writeFile(t, filepath.Join(d1, "f"), []byte("moving"))
		mustOK(t, "rename across dirs", unix.Rename(filepath.Join(d1, "f"), filepath.Join(d2, "g")))
		wantContent(t, filepath.Join(d2, "g"), []byte("moving"))
		if _, err := os.Lstat(filepath.Join(d1, "f")); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("old name after a rename across dirs: %v", err)
		}

		// A directory with its contents.
		mkdirs(t, d1, "sub")
		writeFile(t, filepath.Join(d1, "sub", "x"), []byte("x"))
		mustOK(t, "rename of a dir", unix.Rename(d1, filepath.Join(d, "d3")))
		wantContent(t, filepath.Join(d, "d3", "sub", "x"), []byte("x"))
		if _, err := os.Lstat(d1); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("old dir name after rename: %v", err)
		}
		// A directory over an empty one replaces it.
		empty := mkdirs(t, d, "empty")
		mustOK(t, "rename dir over empty dir", unix.Rename(filepath.Join(d, "d3"), empty))
		wantContent(t, filepath.Join(empty, "sub", "x"), []byte("x"))

		// Errors.
		full := mkdirs(t, d, "full")
		writeFile(t, filepath.Join(full, "keep"), nil)
		src := mkdirs(t, d, "src")
		wantErrno(t, "rename dir over a non-empty dir", unix.Rename(src, full), syscall.ENOTEMPTY, syscall.EEXIST)
		wantErrno(t, "rename file over a dir", unix.Rename(b, src), syscall.EISDIR)
		wantErrno(t, "rename dir over a file", unix.Rename(src, b), syscall.ENOTDIR)
		deep := mkdirs(t, src, "child", "grandchild")
		wantErrno(t, "rename dir into its own subtree", unix.Rename(src, filepath.Join(deep, "loop")), syscall.EINVAL)
		wantErrno(t, "rename of a missing name", unix.Rename(filepath.Join(d, "missing"), filepath.Join(d, "m2")), syscall.ENOENT)
		wantErrno(t, "rename into a missing dir", unix.Rename(b, filepath.Join(d, "nodir", "b")), syscall.ENOENT)
		// Everything is where it was.
		wantContent(t, b, []byte("new contents"))
		wantContent(t, filepath.Join(full, "keep"), nil)
		if _, err := os.Stat(deep); err != nil {
			t.Errorf("subtree after the refused rename: %v", err)
		}
		// RENAME_NOREPLACE.
		writeFile(t, a, []byte("a again"))
		err = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE)
		wantErrno(t, "RENAME_NOREPLACE over an existing file", err, syscall.EEXIST)
		wantContent(t, b, []byte("new contents"))

		// Across mounts: Sluice to /dev/shm.
		outside, err := os.MkdirTemp("/dev/shm", "sluice-xdev-*")
		mustOK(t, "tmp", err)
		defer os.RemoveAll(outside)
		wantErrno(t, "rename from the mount to /dev/shm", unix.Rename(b, filepath.Join(outside, "b")), syscall.EXDEV)
		writeFile(t, filepath.Join(outside, "o"), []byte("o"))
		wantErrno(t, "rename from /dev/shm to the mount", unix.Rename(filepath.Join(outside, "o"), filepath.Join(d, "o")), syscall.EXDEV)
		wantContent(t, b, []byte("new contents"))
	})

	t.Run("MkdirRmdir", func(t *testing.T) {
		d := mkdirs(t, root, "dirs")
		sub := filepath.Join(d, "sub")
		mustOK(t, "mkdir", unix.Mkdir(sub, 0o750))
		if st := lstat(t, sub); st.Mode != unix.S_IFDIR|0o750 {
			t.Errorf("mkdir 0750: mode %o", st.Mode)
		}
		wantErrno(t, "mkdir of an existing dir", unix.Mkdir(sub, 0o755), syscall.EEXIST)
		writeFile(t, filepath.Join(sub, "f"), []byte("f"))
		wantErrno(t, "mkdir over a file", unix.Mkdir(filepath.Join(sub, "f"), 0o755), syscall.EEXIST)
		wantErrno(t, "mkdir under a file", unix.Mkdir(filepath.Join(sub, "f", "x"), 0o755), syscall.ENOTDIR)
		wantErrno(t, "mkdir in a missing dir", unix.Mkdir(filepath.Join(d, "missing", "x"), 0o755), syscall.ENOENT)
		wantErrno(t, "rmdir of a non-empty dir", unix.Rmdir(sub), syscall.ENOTEMPTY, syscall.EEXIST)
		wantErrno(t, "rmdir of a file", unix.Rmdir(filepath.Join(sub, "f")), syscall.ENOTDIR)
		wantErrno(t, "unlink of a dir", unix.Unlink(sub), syscall.EISDIR)
		wantErrno(t, "rmdir of a missing dir", unix.Rmdir(filepath.Join(d, "missing")), syscall.ENOENT)
		mustOK(t, "unlink", unix.Unlink(filepath.Join(sub, "f")))
		mustOK(t, "rmdir", unix.Rmdir(sub))
		_, err := os.Lstat(sub)
		wantErrno(t, "stat after rmdir", err, syscall.ENOENT)
		if st := lstat(t, d); st.Nlink < 2 {
			t.Errorf("parent dir nlink %d", st.Nlink)
		}
	})

	t.Run("Readdir3000", func(t *testing.T) {
		d := mkdirs(t, root, "many")
		const n = 3000
		var want []string
		for i := range n {
			want = append(want, fmt.Sprintf("entry-%05d-%s", i, strings.Repeat("x", i%37)))
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					if err := unix.Mknod(filepath.Join(d, want[i]), unix.S_IFREG|0o644, 0); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("creating entries: %v", err)
		}
		t.Logf("created %d entries in %s", n, time.Since(start).Round(time.Millisecond))
		f, err := os.Open(d)
		mustOK(t, "open dir", err)
		defer f.Close()
		// Small getdents buffers: many calls, each resuming at its offset.
		var got []string
		dots := 0
		buf := make([]byte, 4096)
		for {
			k, err := unix.Getdents(int(f.Fd()), buf)
			mustOK(t, "getdents", err)
			if k == 0 {
				break
			}
			for b := buf[:k]; len(b) > 0; {
				reclen := int(binary.LittleEndian.Uint16(b[16:18]))
				typ := b[18]
				name := string(b[19:reclen])
				name = name[:strings.IndexByte(name, 0)]
				b = b[reclen:]
				if name == "." || name == ".." {
					dots++
					continue
				}
				if typ != unix.DT_REG {
					t.Errorf("%s: d_type %d, want DT_REG", name, typ)
				}
				got = append(got, name)
			}
		}
		if dots != 2 {
			t.Errorf("readdir listed . and .. %d times in all, want 2", dots)
		}
		slices.Sort(got)
		if len(got) != n || !slices.Equal(got, want) {
			missing, extra := diffNames(want, got)
			t.Errorf("readdir: %d entries, want %d; missing %d (%v...), unexpected %d (%v...)", len(got), n, len(missing), first(missing, 3), len(extra), first(extra, 3))
		}
		if st := lstat(t, filepath.Join(d, want[n-1])); st.Mode != unix.S_IFREG|0o644 {
			t.Errorf("an entry: mode %o", st.Mode)
		}
	})

	t.Run("SymlinkHardlink", func(t *testing.T) {
		d := mkdirs(t, root, "links")
		target := "some/where/over the rainbow"
		l := filepath.Join(d, "sym")
		mustOK(t, "symlink", os.Symlink(target, l))
		if got, err := os.Readlink(l); err != nil || got != target {
			t.Errorf("readlink: %q, %v, want %q", got, err, target)
		}
		if st := lstat(t, l); st.Mode&unix.S_IFMT != unix.S_IFLNK || st.Size != int64(len(target)) {
			t.Errorf("lstat of a symlink: mode %o size %d, want a symlink of size %d", st.Mode, st.Size, len(target))
		}
		_, err := os.Stat(l)
		wantErrno(t, "stat through a dangling symlink", err, syscall.ENOENT)
		wantErrno(t, "symlink over an existing name", os.Symlink("x", l), syscall.EEXIST)
		_, err = os.Readlink(d)
		wantErrno(t, "readlink of a dir", err, syscall.EINVAL)
		writeFile(t, filepath.Join(d, "real"), []byte("through the link"))
		mustOK(t, "symlink", os.Symlink("real", filepath.Join(d, "rel")))
		wantContent(t, filepath.Join(d, "rel"), []byte("through the link"))

		// Hard links.
		f, g := filepath.Join(d, "f"), filepath.Join(d, "g")
		writeFile(t, f, []byte("linked"))
		mustOK(t, "link", os.Link(f, g))
		sf, sg := lstat(t, f), lstat(t, g)
		if sf.Nlink != 2 || sg.Nlink != 2 || sf.Ino != sg.Ino {
			t.Errorf("after link: nlink %d and %d, inodes %d and %d; want 2, 2, one inode", sf.Nlink, sg.Nlink, sf.Ino, sg.Ino)
		}
		wantErrno(t, "link over an existing name", os.Link(f, g), syscall.EEXIST)
		wantErrno(t, "link of a dir", os.Link(d, filepath.Join(d, "dirlink")), syscall.EPERM)
		// Writes through one name are read through the other.
		fd := openFD(t, g, unix.O_WRONLY|unix.O_APPEND, 0)
		if _, err := unix.Write(fd, []byte(" twice")); err != nil {
			t.Fatal(err)
		}
		mustOK(t, "close", unix.Close(fd))
		wantContent(t, f, []byte("linked twice"))
		mustOK(t, "unlink", os.Remove(f))
		if st := lstat(t, g); st.Nlink != 1 {
			t.Errorf("after unlinking one name: nlink %d, want 1", st.Nlink)
		}
		wantContent(t, g, []byte("linked twice"))
	})

	t.Run("MknodFIFOStatfsFsync", func(t *testing.T) {
		d := mkdirs(t, root, "special")
		fifo := filepath.Join(d, "fifo")
		mustOK(t, "mkfifo", unix.Mkfifo(fifo, 0o640))
		if st := lstat(t, fifo); st.Mode != unix.S_IFIFO|0o640 {
			t.Errorf("FIFO: mode %o, want %o", st.Mode, unix.S_IFIFO|0o640)
		}
		if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			t.Errorf("FIFO: %v, %v", fi, err)
		}
		// It works as a pipe (the kernel serves it).
		r, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		mustOK(t, "open FIFO for reading", err)
		w, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		mustOK(t, "open FIFO for writing", err)
		unix.Write(w, []byte("ping"))
		buf := make([]byte, 10)
		if n, err := unix.Read(r, buf); err != nil || string(buf[:n]) != "ping" {
			t.Errorf("through the FIFO: %q, %v", buf[:n], err)
		}
		unix.Close(w)
		unix.Close(r)

		// Device nodes and sockets: integration_fuse_posix_test.go.

		var sfs unix.Statfs_t
		mustOK(t, "statfs", unix.Statfs(root, &sfs))
		if sfs.Blocks == 0 || sfs.Bfree == 0 || sfs.Bavail == 0 || sfs.Bsize == 0 || sfs.Bfree > sfs.Blocks {
			t.Errorf("statfs: blocks %d free %d avail %d bsize %d", sfs.Blocks, sfs.Bfree, sfs.Bavail, sfs.Bsize)
		}
		if sfs.Type != 0x65735546 { // FUSE_SUPER_MAGIC
			t.Errorf("statfs: type %#x, want FUSE", sfs.Type)
		}
		t.Logf("statfs: %d blocks of %d, %d free", sfs.Blocks, sfs.Bsize, sfs.Bfree)

		p := filepath.Join(d, "synced")
		fd := openFD(t, p, unix.O_RDWR|unix.O_CREAT, 0o644)
		pwrite(t, fd, []byte("durable"), 0)
		mustOK(t, "fsync", unix.Fsync(fd))
		mustOK(t, "fdatasync", unix.Fdatasync(fd))
		mustOK(t, "fsync with nothing written", unix.Fsync(fd))
		mustOK(t, "close", unix.Close(fd))
		dfd := openFD(t, d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		mustOK(t, "fsync of a directory", unix.Fsync(dfd))
		wantContent(t, p, []byte("durable"))
	})
}

func diffNames(want, got []string) (missing, extra []string) {
	w := map[string]int{}
	for _, s := range want {
		w[s]++
	}
	for _, s := range got {
		if w[s] > 0 {
			w[s]--
		} else {
			extra = append(extra, s)
		}
	}
	for _, s := range want {
		if w[s] > 0 {
			missing = append(missing, s)
			w[s]--
		}
	}
	return missing, extra
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// ---- 2. permissions ----

func TestFUSEPermissions(t *testing.T) {
	c, m := fuseCluster(t)
	letOthersReach(t, m.dir)
	const nobody = 65534
	dir := mkdirs(t, m.dir, "rootdir")
	mustOK(t, "chmod", os.Chmod(dir, 0o755))
	secret := filepath.Join(dir, "file")
	writeFile(t, secret, []byte("root's data"))
	mustOK(t, "chmod", os.Chmod(secret, 0o644))
	if st := lstat(t, dir); st.Uid != 0 || st.Gid != 0 || st.Mode != unix.S_IFDIR|0o755 {
		t.Fatalf("root's dir: %d:%d mode %o", st.Uid, st.Gid, st.Mode)
	}

	asUser(t, nobody, nobody, func() {
		// Reading a 0644 file is allowed; writing is not.
		if b, err := os.ReadFile(secret); err != nil || string(b) != "root's data" {
			t.Errorf("uid %d reading a 0644 file: %q, %v", nobody, b, err)
		}
		_, err := unix.Open(secret, unix.O_WRONLY, 0)
		wantErrno(t, "open for writing another's 0644 file", err, syscall.EACCES)
		_, err = unix.Open(secret, unix.O_RDWR|unix.O_TRUNC, 0)
		wantErrno(t, "O_TRUNC of another's 0644 file", err, syscall.EACCES)
		wantErrno(t, "truncate of another's 0644 file", unix.Truncate(secret, 0), syscall.EACCES)
		// Creating, removing and renaming in a root-owned 0755 dir.
		_, err = unix.Open(filepath.Join(dir, "mine"), unix.O_CREAT|unix.O_WRONLY, 0o644)
		wantErrno(t, "create in root's 0755 dir", err, syscall.EACCES)
		wantErrno(t, "mkdir in root's 0755 dir", unix.Mkdir(filepath.Join(dir, "d"), 0o755), syscall.EACCES)
		wantErrno(t, "symlink in root's 0755 dir", unix.Symlink("x", filepath.Join(dir, "l")), syscall.EACCES)
		wantErrno(t, "unlink in root's 0755 dir", unix.Unlink(secret), syscall.EACCES)
		wantErrno(t, "rename in root's 0755 dir", unix.Rename(secret, filepath.Join(dir, "moved")), syscall.EACCES)
		// Attributes of another's file.
		wantErrno(t, "chmod of another's file", unix.Chmod(secret, 0o666), syscall.EPERM)
		wantErrno(t, "chown of another's file", unix.Chown(secret, nobody, nobody), syscall.EPERM)
		wantErrno(t, "chgrp of another's file", unix.Chown(secret, -1, nobody), syscall.EPERM)
		ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
		wantErrno(t, "utimensat (explicit times) of another's file", unix.UtimesNanoAt(unix.AT_FDCWD, secret, ts, 0), syscall.EPERM)
		now := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
		wantErrno(t, "utimensat (now) of another's unwritable file", unix.UtimesNanoAt(unix.AT_FDCWD, secret, now, 0), syscall.EACCES)
	})
	wantContent(t, secret, []byte("root's data"))
	if st := lstat(t, secret); st.Mode != unix.S_IFREG|0o644 || st.Uid != 0 || st.Mtim.Sec == 1e9 {
		t.Errorf("root's file after refused changes: mode %o uid %d mtime %d", st.Mode, st.Uid, st.Mtim.Sec)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("root's dir after refused creations: %v", ents)
	}

	// A real process of that user sees the same.
	out, stderr, err := asUserCmd(nobody, nobody, "/bin/sh", "-c", "echo x > "+filepath.Join(dir, "sh-made"))
	if err == nil || !strings.Contains(stderr, "Permission denied") {
		t.Errorf("sh as uid %d creating in root's dir: %v, stderr %q, want Permission denied", nobody, err, stderr)
	}
	out, stderr, err = asUserCmd(nobody, nobody, "/bin/cat", secret)
	if err != nil || out != "root's data" {
		t.Errorf("cat as uid %d of a 0644 file: %q, %v, %q", nobody, out, err, stderr)
	}
	_, stderr, err = asUserCmd(nobody, nobody, "/bin/sh", "-c", "echo x >> "+secret)
	if err == nil || !strings.Contains(stderr, "Permission denied") {
		t.Errorf("sh as uid %d appending to a 0644 file: %v, stderr %q, want Permission denied", nobody, err, stderr)
	}
	// -c: no open(O_CREAT) first, whose EACCES touch would report.
	_, stderr, err = asUserCmd(nobody, nobody, "/usr/bin/touch", "-c", "-d", "2001-01-01", secret)
	if err == nil || !strings.Contains(stderr, "Operation not permitted") {
		t.Errorf("touch -d as uid %d of another's file: %v, stderr %q, want Operation not permitted", nobody, err, stderr)
	}
	_, stderr, err = asUserCmd(nobody, nobody, "/bin/chmod", "666", secret)
	if err == nil || !strings.Contains(stderr, "Operation not permitted") {
		t.Errorf("chmod as uid %d of another's file: %v, stderr %q, want Operation not permitted", nobody, err, stderr)
	}

	// Root changes owner, mode and times; stat shows them, here and at
	// meta.
	given := filepath.Join(dir, "given")
	writeFile(t, given, []byte("for nobody"))
	mustOK(t, "chown by root", os.Chown(given, nobody, nobody))
	mustOK(t, "chmod by root", os.Chmod(given, 0o640))
	at, mt := time.Date(2001, 2, 3, 4, 5, 6, 789000000, time.UTC), time.Date(2002, 3, 4, 5, 6, 7, 123456789, time.UTC)
	mustOK(t, "utimes by root", os.Chtimes(given, at, mt))
	st := lstat(t, given)
	if st.Uid != nobody || st.Gid != nobody || st.Mode != unix.S_IFREG|0o640 {
		t.Errorf("after chown/chmod by root: %d:%d mode %o, want %d:%d %o", st.Uid, st.Gid, st.Mode, nobody, nobody, unix.S_IFREG|0o640)
	}
	if got := time.Unix(st.Mtim.Unix()); !got.Equal(mt) {
		t.Errorf("mtime %s, want %s", got.UTC(), mt)
	}
	if got := time.Unix(st.Atim.Unix()); !got.Equal(at) {
		t.Errorf("atime %s, want %s", got.UTC(), at)
	}
	if out := string(mustRun(t, c.conf, nil, "stat", "/rootdir/given").stdout); !strings.Contains(out, "65534") || !strings.Contains(out, "640") {
		t.Errorf("sluice stat after chown/chmod on the mount:\n%s", out)
	}

	asUser(t, nobody, nobody, func() {
		// The owner now: may write, chmod and set times, but not give
		// the file away.
		if err := os.WriteFile(given, []byte("mine now"), 0); err != nil {
			t.Errorf("owner writing a 0640 file: %v", err)
		}
		if err := unix.Chmod(given, 0o600); err != nil {
			t.Errorf("owner chmod: %v", err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18 + 5)}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, given, ts, 0); err != nil {
			t.Errorf("owner utimensat: %v", err)
		}
		wantErrno(t, "owner chown to root", unix.Chown(given, 0, -1), syscall.EPERM)
		wantErrno(t, "owner chgrp to a group it is not in", unix.Chown(given, -1, 0), syscall.EPERM)
		// A missing name in a searchable dir is ENOENT, not EACCES.
		_, err := os.ReadFile(filepath.Join(dir, "private"))
		wantErrno(t, "reading a missing file", err, syscall.ENOENT)
	})
	st = lstat(t, given)
	if st.Mode != unix.S_IFREG|0o600 || st.Mtim.Sec != 1e9 || st.Mtim.Nsec != 5 || st.Uid != nobody {
		t.Errorf("after the owner's changes: mode %o mtime %d.%09d uid %d", st.Mode, st.Mtim.Sec, st.Mtim.Nsec, st.Uid)
	}
	wantContent(t, given, []byte("mine now"))

	private := filepath.Join(dir, "private")
	writeFile(t, private, []byte("root only"))
	mustOK(t, "chmod", os.Chmod(private, 0o600))
	asUser(t, nobody, nobody, func() {
		_, err := os.ReadFile(private)
		wantErrno(t, "reading another's 0600 file", err, syscall.EACCES)
		// Its own 0600 file is.
		_, err = os.ReadFile(given)
		if err != nil {
			t.Errorf("owner reading its 0600 file: %v", err)
		}
	})
	// Group permission: a root-owned 0640 file of group nobody.
	grp := filepath.Join(dir, "grp")
	writeFile(t, grp, []byte("group readable"))
	mustOK(t, "chown", os.Chown(grp, 0, nobody))
	mustOK(t, "chmod", os.Chmod(grp, 0o640))
	asUser(t, 12345, nobody, func() {
		if b, err := os.ReadFile(grp); err != nil || string(b) != "group readable" {
			t.Errorf("group member reading a 0640 file: %q, %v", b, err)
		}
		_, err := unix.Open(grp, unix.O_WRONLY, 0)
		wantErrno(t, "group member writing a 0640 file", err, syscall.EACCES)
	})
	asUser(t, 12345, 12345, func() {
		_, err := os.ReadFile(grp)
		wantErrno(t, "non-member reading a 0640 file", err, syscall.EACCES)
	})
	// A 0777 dir lets anyone create; the creator owns the file.
	open := mkdirs(t, m.dir, "open")
	mustOK(t, "chmod", os.Chmod(open, 0o777))
	asUser(t, nobody, nobody, func() {
		if err := os.WriteFile(filepath.Join(open, "by-nobody"), []byte("n"), 0o644); err != nil {
			t.Errorf("create in a 0777 dir: %v", err)
		}
	})
	if st := lstat(t, filepath.Join(open, "by-nobody")); st.Uid != nobody || st.Gid != nobody {
		t.Errorf("file created by uid %d: owner %d:%d", nobody, st.Uid, st.Gid)
	}

	// access(2) (as the thread's fsuid: AT_EACCESS), search permission,
	// open(O_CREAT) of an existing file, and times.
	shared := filepath.Join(open, "shared")
	writeFile(t, shared, []byte("anyone may write"))
	mustOK(t, "chmod", os.Chmod(shared, 0o666))
	closed := mkdirs(t, m.dir, "closed")
	mustOK(t, "chmod", os.Chmod(closed, 0o700))
	writeFile(t, filepath.Join(closed, "inside"), []byte("x"))
	asUser(t, nobody, nobody, func() {
		noErr := func(what string, err error) {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		wantErrno(t, "access(R_OK) of another's 0600 file", eaccess(private, unix.R_OK), syscall.EACCES)
		wantErrno(t, "access(W_OK) of another's 0644 file", eaccess(secret, unix.W_OK), syscall.EACCES)
		noErr("access(R_OK) of another's 0644 file", eaccess(secret, unix.R_OK))
		noErr("access(R_OK|W_OK) of a 0666 file", eaccess(shared, unix.R_OK|unix.W_OK))
		wantErrno(t, "access(X_OK) of a 0666 file", eaccess(shared, unix.X_OK), syscall.EACCES)
		wantErrno(t, "stat inside another's 0700 dir", unix.Stat(filepath.Join(closed, "inside"), new(unix.Stat_t)), syscall.EACCES)
		wantErrno(t, "chdir into another's 0700 dir", eaccess(closed, unix.X_OK), syscall.EACCES)
		_, err := unix.Open(private, unix.O_CREAT|unix.O_RDONLY, 0o644)
		wantErrno(t, "open(O_CREAT) of another's existing 0600 file", err, syscall.EACCES)
		// Creating grants the access asked for, whatever the new mode.
		fd, err := unix.Open(filepath.Join(open, "readonly-new"), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o444)
		if err != nil {
			t.Errorf("creating a 0444 file O_RDWR: %v", err)
		} else {
			if _, err := unix.Write(fd, []byte("w")); err != nil {
				t.Errorf("writing the new 0444 file: %v", err)
			}
			unix.Close(fd)
		}
		// Times: "now" needs write permission, explicit times ownership.
		now := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
		noErr("utimensat (now) of another's 0666 file", unix.UtimesNanoAt(unix.AT_FDCWD, shared, now, 0))
		ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
		wantErrno(t, "utimensat (explicit) of another's 0666 file", unix.UtimesNanoAt(unix.AT_FDCWD, shared, ts, 0), syscall.EPERM)
	})
	if st := lstat(t, shared); time.Since(time.Unix(st.Mtim.Unix())) > time.Minute {
		t.Errorf("mtime of the 0666 file after utimensat(now): %v", time.Unix(st.Mtim.Unix()))
	}
}

// ---- 3. two mounts of one cluster ----

func TestFUSETwoMounts(t *testing.T) {
	c, a := fuseCluster(t)
	b := mountAt(t, c.conf, "mnt-b")
	pa, pb := filepath.Join(a.dir, "shared.bin"), filepath.Join(b.dir, "shared.bin")

	// Written and closed on A, then opened on B.
	v1 := randomBytes(t, 3<<20)
	writeFile(t, pa, v1)
	wantContent(t, pb, v1)

	// Overwrites that change the size, while B has the old attributes
	// cached (it just read the file): every open on B after A's close
	// sees the new contents in full.
	for i, size := range []int{5<<20 + 123, 1<<20 + 7, 2 << 20, 7 << 20} {
		if _, err := os.Stat(pb); err != nil {
			t.Fatal(err)
		}
		v := randomBytes(t, size)
		writeFile(t, pa, v)
		got := readFile(t, pb)
		if !bytes.Equal(got, v) {
			t.Errorf("overwrite %d on A (%d bytes, was %d): B opened it after the close and read %d bytes (%s), want %d (%s): %s",
				i+1, size, len(v1), len(got), sum(got), len(v), sum(v), describeMismatch(got, v, v1))
		}
		v1 = v
	}

	// The same while B keeps an older descriptor of the file open: the
	// new open must not see less than a first open would.
	keep := openFD(t, pb, unix.O_RDONLY, 0)
	if n, err := pread(keep, make([]byte, 4096), 0); err != nil || n != 4096 {
		t.Fatalf("B reading through the kept descriptor: %d, %v", n, err)
	}
	for i, size := range []int{3<<20 + 1, 3<<20 + 1, 1 << 20} {
		v := randomBytes(t, size)
		writeFile(t, pa, v)
		got := readFile(t, pb)
		if !bytes.Equal(got, v) {
			t.Errorf("overwrite %d on A (%d bytes, was %d) while B holds another descriptor: B opened it after the close and read %d bytes (%s), want %d (%s): %s",
				i+1, size, len(v1), len(got), sum(got), len(v), sum(v), describeMismatch(got, v, v1))
		}
		v1 = v
	}
	unix.Close(keep)

	// Deleted on A while B has it open (a file B has not seen before).
	pa, pb = filepath.Join(a.dir, "doomed.bin"), filepath.Join(b.dir, "doomed.bin")
	v1 = randomBytes(t, 7<<20)
	writeFile(t, pa, v1)
	fd := openFD(t, pb, unix.O_RDONLY, 0)
	head := make([]byte, 4096)
	if n, err := pread(fd, head, 0); err != nil || !bytes.Equal(head[:n], v1[:4096]) {
		t.Fatalf("B reading before the delete: %d bytes (%s), %v", n, sum(head[:n]), err)
	}
	mustOK(t, "remove on A", os.Remove(pa))
	deleted := time.Now()
	// Other writes on A meanwhile, which could reuse the freed space.
	for i := range 4 {
		writeFile(t, filepath.Join(a.dir, fmt.Sprintf("other%d", i)), randomBytes(t, 2<<20))
	}
	eventually(t, 5*time.Second, 50*time.Millisecond, func() (bool, string) {
		_, err := os.Stat(pb)
		return errors.Is(err, syscall.ENOENT), fmt.Sprintf("stat on B after the delete on A: %v", err)
	})
	t.Logf("B sees the delete after %s", time.Since(deleted).Round(time.Millisecond))
	// Reads through B's descriptor: the old bytes or an error, never
	// other bytes.
	for _, r := range []struct{ off, n int }{{0, 4096}, {1 << 20, 64 << 10}, {3<<20 + 5, 100}, {len(v1) - 1000, 1000}, {6 << 20, 1 << 20}} {
		buf := make([]byte, r.n)
		n, err := pread(fd, buf, int64(r.off))
		switch {
		case err != nil:
			if en := errnoOf(err); en != syscall.ENOENT && en != syscall.ESTALE && en != syscall.EIO {
				t.Errorf("read at %d through B's fd after the delete: %v, want old data or ENOENT/ESTALE/EIO", r.off, err)
			}
			t.Logf("read at %d after the delete: %v", r.off, err)
		case n != r.n || !bytes.Equal(buf[:n], v1[r.off:r.off+r.n]):
			t.Errorf("read at %d through B's fd after the delete: %d bytes (%s), want the old %d bytes (%s) or an error",
				r.off, n, sum(buf[:n]), r.n, sum(v1[r.off:r.off+r.n]))
		}
	}
	unix.Close(fd)

	// Created on B, listed and read on A at once (no negative caching).
	writeFile(t, filepath.Join(b.dir, "from-b"), []byte("hello from B"))
	wantContent(t, filepath.Join(a.dir, "from-b"), []byte("hello from B"))
}

// describeMismatch says how got differs from want, and whether it is
// (partly) prev, the contents before.
func describeMismatch(got, want, prev []byte) string {
	var out []string
	if len(got) != len(want) {
		out = append(out, fmt.Sprintf("size %d, not %d", len(got), len(want)))
		if len(got) == len(prev) {
			out = append(out, "the previous size")
		}
	}
	n := min(len(got), len(want))
	for i := range n {
		if got[i] != want[i] {
			out = append(out, fmt.Sprintf("first wrong byte at %d", i))
			break
		}
	}
	if k := min(len(got), len(prev)); k > 0 && bytes.Equal(got[:k], prev[:k]) {
		out = append(out, fmt.Sprintf("its first %d bytes are the previous contents", k))
	} else if n > 0 && bytes.Equal(got[:n], want[:n]) {
		out = append(out, fmt.Sprintf("its first %d bytes are right", n))
	}
	if len(got) > len(want) {
		extra := got[len(want):]
		if bytes.Count(extra, []byte{0}) == len(extra) {
			out = append(out, fmt.Sprintf("%d zero bytes past the end", len(extra)))
		}
	}
	return strings.Join(out, "; ")
}

// ---- 4. write buffering ----

func TestFUSEBufferedSmallWrites(t *testing.T) {
	c, m := fuseCluster(t)
	const size = 32 << 20
	data := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	rng.Read(data)
	p := filepath.Join(m.dir, "small-writes.bin")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	mustOK(t, "create", err)
	start := time.Now()
	for off := 0; off < size; off += 4096 {
		if _, err := f.Write(data[off : off+4096]); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	mustOK(t, "close", f.Close())
	t.Logf("32 MiB in 4 KiB write(2) calls: %s", time.Since(start).Round(time.Millisecond))
	// Read back through the CLI (not the kernel's page cache).
	got := mustRun(t, c.conf, nil, "cat", "/small-writes.bin").stdout
	if !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes (%s), want %d (%s)", len(got), sum(got), size, sum(data))
	}
	// Each streaming write the mount sends advances the chunk's version
	// once: 8,192 writes sent one by one would leave it in the
	// thousands.
	mc := metaClient(t, c.conf)
	attr, chunks := layoutOf(t, mc, "/small-writes.bin")
	if attr.Size != size || len(chunks) != 1 {
		t.Fatalf("layout: size %d, %d chunks", attr.Size, len(chunks))
	}
	t.Logf("chunk version after 8192 write(2) calls: %d", chunks[0].Version)
	if chunks[0].Version > 16 {
		t.Errorf("chunk version %d after 32 MiB of 4 KiB writes: the mount sent about one write per system call, want buffered streaming writes", chunks[0].Version)
	}
}

// ---- 5. faults ----

// splitFUSECluster starts meta and three nodes as separate processes and
// mounts the cluster with extra mount flags.
func splitFUSECluster(t *testing.T, mountArgs ...string) (*splitCluster, *mounted) {
	t.Helper()
	requireFUSE(t)
	c := startMeta(t, baseDir(t))
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	return c, mountAt(t, c.conf, "mnt", mountArgs...)
}

func TestFUSENodeKilledDuringWrite(t *testing.T) {
	c, m := splitFUSECluster(t, "--op-timeout", "15s")
	const size = 96 << 20
	const killAt = 40 << 20
	p := filepath.Join(m.dir, "big.bin")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	mustOK(t, "create", err)
	victim := c.nodes[2]
	buf := make([]byte, 1<<20)
	var werr error
	written := int64(0)
	start := time.Now()
	var killedAt time.Time
	for written < size {
		if written == killAt {
			victim.proc.kill()
			killedAt = time.Now()
			t.Logf("killed node %v after %d MiB written (%s)", victim.id, written>>20, time.Since(start).Round(time.Millisecond))
		}
		pattern(buf, written)
		var n int
		n, werr = f.Write(buf)
		written += int64(n)
		if werr != nil {
			break
		}
	}
	serr := f.Sync()
	cerr := f.Close()
	t.Logf("write: %d MiB, err %v; fsync: %v; close: %v (%s after the kill)", written>>20, werr, serr, cerr, time.Since(killedAt).Round(time.Millisecond))
	for _, e := range []struct {
		what string
		err  error
	}{{"write", werr}, {"fsync", serr}, {"close", cerr}} {
		if e.err != nil {
			wantErrno(t, e.what+" after a node was killed", e.err, syscall.EIO)
		}
	}
	failed := werr != nil || serr != nil || cerr != nil
	// What is readable is the written bytes, whatever the outcome; a
	// successful close means all of them.
	rsize, bad, err := checkPattern(filepath.Join(m.dir, "big.bin"))
	t.Logf("read back: %d bytes, first wrong byte at %d, err %v", rsize, bad, err)
	if err != nil {
		t.Errorf("reading the file back: %v", err)
	}
	if bad >= 0 {
		t.Errorf("read back: wrong bytes at offset %d", bad)
	}
	if !failed && rsize != size {
		t.Errorf("write, fsync and close succeeded, but the file reads as %d bytes, want %d", rsize, size)
	}
	if failed && rsize > written {
		t.Errorf("file reads as %d bytes, more than the %d written", rsize, written)
	}
}

func TestFUSEMetaRestart(t *testing.T) {
	c, m := splitFUSECluster(t, "--op-timeout", "5s")
	writeFile(t, filepath.Join(m.dir, "before"), []byte("written before the crash"))
	// A file the mount has never looked up: its lookup needs meta.
	mustRun(t, c.conf, bytes.NewReader([]byte("unseen")), "put", "-", "/unseen")

	c.metaProc.kill()
	killed := time.Now()
	// While meta is down, an operation that needs it fails within about
	// the operation timeout, and not with ENOENT (the file exists).
	var lerr error
	within(t, 20*time.Second, "lookup while meta is down", func() { _, lerr = os.Stat(filepath.Join(m.dir, "unseen")) })
	took := time.Since(killed)
	t.Logf("lookup with meta down: %v after %s", lerr, took.Round(time.Millisecond))
	if lerr == nil {
		t.Errorf("lookup with meta down succeeded")
	} else {
		wantErrno(t, "lookup with meta down", lerr, syscall.ETIMEDOUT, syscall.EIO, syscall.ENOTCONN)
	}
	if took > 12*time.Second {
		t.Errorf("lookup with meta down took %s with --op-timeout 5s", took)
	}

	// An operation started while meta is down, finished after the
	// restart: it succeeds, or fails cleanly.
	during := make(chan error, 1)
	go func() {
		during <- os.WriteFile(filepath.Join(m.dir, "during"), []byte("created across the restart"), 0o644)
	}()
	time.Sleep(time.Second)
	args := []string{"meta", "--data", filepath.Join(c.dir, "meta"), "--listen", c.meta, "--node-timeout", "2s"}
	c.metaProc = startProc(t, c.dir, "meta-restarted", args...)
	c.metaProc.waitLine(t, reMetaListen, 20*time.Second)
	t.Logf("meta restarted %s after the kill", time.Since(killed).Round(time.Millisecond))
	duringOK := false
	select {
	case err := <-during:
		t.Logf("create across the restart: %v", err)
		if err != nil {
			wantErrno(t, "create across the restart", err, syscall.ETIMEDOUT, syscall.EIO, syscall.EEXIST)
		}
		duringOK = err == nil
	case <-time.After(20 * time.Second):
		t.Fatalf("create across the restart still blocked 20 s after it")
	}
	waitNodesUp(t, c.conf, 3, 20*time.Second)

	// The same mount works again: stat, read, create, write, list.
	var st unix.Stat_t
	mustOK(t, "stat after the restart", unix.Stat(filepath.Join(m.dir, "unseen"), &st))
	wantContent(t, filepath.Join(m.dir, "unseen"), []byte("unseen"))
	wantContent(t, filepath.Join(m.dir, "before"), []byte("written before the crash"))
	if duringOK {
		wantContent(t, filepath.Join(m.dir, "during"), []byte("created across the restart"))
	}
	data := randomBytes(t, 1<<20+3)
	writeFile(t, filepath.Join(m.dir, "after"), data)
	wantContent(t, filepath.Join(m.dir, "after"), data)
	if got := mustRun(t, c.conf, nil, "cat", "/after").stdout; !bytes.Equal(got, data) {
		t.Errorf("cat of a file written on the mount after the restart: %d bytes", len(got))
	}
	mustOK(t, "mkdir after the restart", os.Mkdir(filepath.Join(m.dir, "newdir"), 0o755))
	mustOK(t, "rename after the restart", os.Rename(filepath.Join(m.dir, "before"), filepath.Join(m.dir, "newdir", "before")))
	ents, err := os.ReadDir(m.dir)
	mustOK(t, "readdir after the restart", err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	for _, want := range []string{"after", "newdir", "unseen"} {
		if !slices.Contains(names, want) {
			t.Errorf("readdir after the restart: %v, missing %s", names, want)
		}
	}
}

func TestFUSEUnmountWithOpenFile(t *testing.T) {
	c, m := fuseCluster(t)
	p := filepath.Join(m.dir, "open.txt")
	writeFile(t, p, []byte("open during unmount"))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	mustOK(t, "open", err)
	defer f.Close()
	if _, err := f.WriteAt([]byte("buffered, not closed"), 100); err != nil {
		t.Fatal(err)
	}

	// `sluice umount` of a busy mount: it answers at once (busy), and
	// the mount keeps working.
	var r result
	if within(t, 15*time.Second, "sluice umount of a busy mount", func() { r = run(t, c.conf, nil, "umount", m.dir) }) {
		t.Logf("sluice umount with a file open: %s", r)
		if r.code == 0 {
			if mountedAt(m.dir) {
				t.Errorf("sluice umount exited 0 but %s is still mounted", m.dir)
			}
		} else if !strings.Contains(r.stderr, "busy") {
			t.Errorf("sluice umount of a busy mount: %s, want a 'busy' error", r)
		} else {
			buf := make([]byte, 19)
			if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "open during unmount" {
				t.Errorf("read after the refused umount: %q, %v", buf, err)
			}
		}
	}

	// SIGTERM: the mount process exits within 10 s though the file is
	// still open.
	start := time.Now()
	if code := m.proc.stop(t, 10*time.Second); code != 0 {
		t.Errorf("mount process exit code %d after SIGTERM, want 0", code)
	}
	t.Logf("mount process exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	if mountedAt(m.dir) {
		t.Errorf("%s still mounted after the mount process exited", m.dir)
	}
	// The open descriptor fails instead of hanging.
	within(t, 10*time.Second, "read through a descriptor of a dead mount", func() {
		buf := make([]byte, 10)
		_, err := f.ReadAt(buf, 0)
		t.Logf("read through the open fd after the mount exited: %v", err)
	})
	within(t, 10*time.Second, "close of a descriptor of a dead mount", func() { f.Close() })

	// A lazy unmount of a second, busy mount returns at once; the mount
	// process exits once the last file is closed.
	m2 := mountAt(t, c.conf, "mnt2")
	f2, err := os.Open(filepath.Join(m2.dir, "open.txt"))
	mustOK(t, "open on mnt2", err)
	if within(t, 15*time.Second, "sluice umount --lazy", func() { r = run(t, c.conf, nil, "umount", "--lazy", m2.dir) }) && r.code != 0 {
		t.Errorf("%s", r)
	}
	if mountedAt(m2.dir) {
		t.Errorf("%s still mounted after umount --lazy", m2.dir)
	}
	buf := make([]byte, 19)
	if _, err := f2.ReadAt(buf, 0); err != nil {
		t.Logf("read through a lazily unmounted file: %v", err)
	}
	f2.Close()
	select {
	case <-m2.proc.done:
		t.Logf("mount process exited after the lazy unmount and the last close")
	case <-time.After(10 * time.Second):
		t.Errorf("mount process still running 10 s after a lazy unmount and the last close")
	}
}

// eaccess is access(2) as the thread's file system identity (AT_EACCESS):
// plain access(2) checks the real uid, which asUser leaves at root.
func eaccess(path string, mode uint32) error {
	return unix.Faccessat2(unix.AT_FDCWD, path, mode, unix.AT_EACCESS)
}

// TestFUSEXattrs: extended attributes through a real mount — set, get,
// list, remove, the size query, flags, visibility on a second mount, the
// permission rules as another user, and what is refused.
func TestFUSEXattrs(t *testing.T) {
	c, a := fuseCluster(t)
	b := mountAt(t, c.conf, "mnt-b")
	letOthersReach(t, a.dir)
	dir := mkdirs(t, a.dir, "x")
	mustOK(t, "chmod", os.Chmod(dir, 0o755))
	f := filepath.Join(dir, "f")
	writeFile(t, f, []byte("data"))
	mustOK(t, "chmod", os.Chmod(f, 0o644))

	mustOK(t, "setxattr", unix.Setxattr(f, "user.color", []byte("blue"), 0))
	mustOK(t, "setxattr empty", unix.Setxattr(f, "user.empty", nil, 0))
	big := bytes.Repeat([]byte("v"), 60000)
	mustOK(t, "setxattr 60000 bytes", unix.Setxattr(f, "user.big", big, 0))
	wantErrno(t, "XATTR_CREATE of an existing name", unix.Setxattr(f, "user.color", []byte("red"), unix.XATTR_CREATE), syscall.EEXIST)
	wantErrno(t, "XATTR_REPLACE of a missing name", unix.Setxattr(f, "user.none", []byte("x"), unix.XATTR_REPLACE), syscall.ENODATA)
	wantErrno(t, "a value over 64 KiB", unix.Setxattr(f, "user.huge", make([]byte, 70000), 0), syscall.E2BIG)
	wantErrno(t, "a system. attribute (ACL)", unix.Setxattr(f, "system.posix_acl_access", []byte{2, 0, 0, 0}, 0), syscall.EOPNOTSUPP)
	// A well-formed capability set (revision 2: CAP_NET_RAW permitted),
	// or the kernel refuses it before asking.
	caps := []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	wantErrno(t, "file capabilities", unix.Setxattr(f, "security.capability", caps, 0), syscall.EOPNOTSUPP)
	mustOK(t, "trusted. as root", unix.Setxattr(f, "trusted.t", []byte("root only"), 0))

	// Read on the other mount: the size query, a short buffer, the value.
	pb := filepath.Join(b.dir, "x", "f")
	if n, err := unix.Getxattr(pb, "user.big", nil); err != nil || n != len(big) {
		t.Fatalf("size query: %d, %v", n, err)
	}
	if _, err := unix.Getxattr(pb, "user.big", make([]byte, 10)); err != syscall.ERANGE {
		t.Fatalf("short buffer: %v, want ERANGE", err)
	}
	buf := make([]byte, 70000)
	if n, err := unix.Getxattr(pb, "user.big", buf); err != nil || !bytes.Equal(buf[:n], big) {
		t.Fatalf("user.big on the other mount: %d bytes, %v", n, err)
	}
	if n, err := unix.Getxattr(pb, "user.empty", buf); err != nil || n != 0 {
		t.Fatalf("empty value: %d, %v", n, err)
	}
	_, err := unix.Getxattr(pb, "user.none", buf)
	wantErrno(t, "a missing attribute", err, syscall.ENODATA)
	n, err := unix.Listxattr(pb, buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00"); strings.Join(got, ",") != "trusted.t,user.big,user.color,user.empty" {
		t.Fatalf("listxattr as root: %q", got)
	}

	// Another user reads user. attributes of a file it may read, sets
	// none, and does not see trusted. ones.
	const nobody = 65534
	asUser(t, nobody, nobody, func() {
		if n, err := unix.Getxattr(f, "user.color", buf); err != nil || string(buf[:n]) != "blue" {
			t.Errorf("uid %d reading user.color: %q, %v", nobody, buf[:max(n, 0)], err)
		}
		wantErrno(t, "setxattr on another's 0644 file", unix.Setxattr(f, "user.color", []byte("red"), 0), syscall.EACCES)
		wantErrno(t, "removexattr on another's 0644 file", unix.Removexattr(f, "user.color"), syscall.EACCES)
		_, err := unix.Getxattr(f, "trusted.t", buf)
		wantErrno(t, "a trusted. attribute as another user", err, syscall.ENODATA)
		if n, err := unix.Listxattr(f, buf); err != nil || strings.Contains(string(buf[:n]), "trusted.") {
			t.Errorf("listxattr as uid %d: %q, %v", nobody, buf[:max(n, 0)], err)
		}
	})

	// Writes, truncation and chown still work (the kernel asks about file
	// capabilities before each: none).
	writeFile(t, f, []byte("new contents"))
	mustOK(t, "truncate", os.Truncate(f, 3))
	mustOK(t, "chown", os.Chown(f, nobody, nobody))
	mustOK(t, "removexattr", unix.Removexattr(f, "user.color"))
	wantErrno(t, "removexattr again", unix.Removexattr(f, "user.color"), syscall.ENODATA)
	if n, err := unix.Getxattr(f, "user.big", buf); err != nil || n != len(big) {
		t.Errorf("user.big after writes, truncate and chown: %d, %v", n, err)
	}
	// A removed file takes its attributes with it; a new one has none.
	mustOK(t, "remove", os.Remove(f))
	writeFile(t, f, []byte("again"))
	if n, err := unix.Listxattr(f, buf); err != nil || n != 0 {
		t.Errorf("a new file at the same path has attributes: %q, %v", buf[:max(n, 0)], err)
	}
}

// TestFUSETmpfile: open(2) with O_TMPFILE makes a nameless file that can
// be written, read and linked into place with linkat(2) (not with
// O_EXCL), and that meta frees when it is closed without a name.
func TestFUSETmpfile(t *testing.T) {
	c, a := fuseCluster(t)
	b := mountAt(t, c.conf, "mnt-b")
	dir := mkdirs(t, a.dir, "tmp")
	files := status(t, c.conf).Files

	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR, 0o640)
	mustOK(t, "open O_TMPFILE", err)
	data := randomBytes(t, 3<<20+17)
	if n, err := unix.Write(fd, data); err != nil || n != len(data) {
		t.Fatalf("write to the tmpfile: %d, %v", n, err)
	}
	var st unix.Stat_t
	mustOK(t, "fstat", unix.Fstat(fd, &st))
	if st.Nlink != 0 || st.Size != int64(len(data)) || st.Mode != unix.S_IFREG|0o640 {
		t.Errorf("tmpfile: nlink %d size %d mode %o", st.Nlink, st.Size, st.Mode)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the tmpfile is listed: %v", ents)
	}
	back := make([]byte, len(data))
	if n, err := unix.Pread(fd, back, 0); err != nil || n != len(data) || !bytes.Equal(back, data) {
		t.Errorf("reading the tmpfile back: %d, %v", n, err)
	}
	// Linked into place, closed: the other mount reads it in full.
	final := filepath.Join(dir, "final")
	mustOK(t, "linkat", unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, final, unix.AT_SYMLINK_FOLLOW))
	mustOK(t, "close", unix.Close(fd))
	wantContent(t, filepath.Join(b.dir, "tmp", "final"), data)
	if st := lstat(t, final); st.Nlink != 1 {
		t.Errorf("linked tmpfile has nlink %d", st.Nlink)
	}

	// O_EXCL: never linkable.
	fd, err = unix.Open(dir, unix.O_TMPFILE|unix.O_EXCL|unix.O_WRONLY, 0o600)
	mustOK(t, "open O_TMPFILE|O_EXCL", err)
	err = unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, filepath.Join(dir, "excl"), unix.AT_SYMLINK_FOLLOW)
	wantErrno(t, "linkat of an O_EXCL tmpfile", err, syscall.ENOENT)
	mustOK(t, "close", unix.Close(fd))

	// Closed without a name: gone at meta, not left for the lease.
	fd, err = unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR, 0o600)
	mustOK(t, "open O_TMPFILE", err)
	if _, err := unix.Write(fd, []byte("scratch")); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "close", unix.Close(fd))
	deadline := time.Now().Add(5 * time.Second)
	for status(t, c.conf).Files != files+1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // RELEASE is asynchronous to close(2)
	}
	if got := status(t, c.conf).Files; got != files+1 {
		t.Errorf("meta counts %d files, want %d (the linked one): nameless tmpfiles were not freed", got, files+1)
	}
}

package main

// POSIX behaviour pjdfstest found wrong on the mount, each checked on a
// real mount of a real cluster: device nodes and sockets (kept as
// inodes with their type, mode and device number, inert on the nodev
// mount), set-user-ID and set-group-ID bits dropped by unprivileged
// writes, truncations and chowns, a mode of 0, and files written through
// the descriptor that created them read-only.

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const nobody = 65534

// mknodAt makes a node, failing the test on error.
func mknodAt(t *testing.T, path string, mode uint32, dev uint64) {
	t.Helper()
	mustOK(t, "mknod "+path, unix.Mknod(path, mode, int(dev)))
}

// bindAt binds a Unix socket to path and closes it: the socket file
// stays, as after a server that exits without unlinking it.
func bindAt(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrUnix{Name: path})
}

// wantNode checks a path's type and permission bits, owner and device
// number.
func wantNode(t *testing.T, path string, mode uint32, uid uint32, rdev uint64) {
	t.Helper()
	st := lstat(t, path)
	if st.Mode != mode || st.Uid != uid || st.Rdev != rdev {
		t.Errorf("%s: mode %#o uid %d device %d:%d, want mode %#o uid %d device %d:%d", path,
			st.Mode, st.Uid, unix.Major(st.Rdev), unix.Minor(st.Rdev), mode, uid, unix.Major(rdev), unix.Minor(rdev))
	}
}

func TestFUSESpecialFiles(t *testing.T) {
	c, m := fuseCluster(t)
	letOthersReach(t, m.dir)
	root := m.dir

	t.Run("MountIsNodevNosuid", func(t *testing.T) {
		f, err := os.Open("/proc/self/mounts")
		mustOK(t, "open /proc/self/mounts", err)
		defer f.Close()
		found := false
		for sc := bufio.NewScanner(f); sc.Scan(); {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[1] != root {
				continue
			}
			found = true
			opts := "," + fields[3] + ","
			if !strings.Contains(opts, ",nodev,") || !strings.Contains(opts, ",nosuid,") {
				t.Errorf("mount options %s: want nodev and nosuid", fields[3])
			}
		}
		if !found {
			t.Fatalf("%s is not in /proc/self/mounts", root)
		}
	})

	t.Run("Devices", func(t *testing.T) {
		d := mkdirs(t, root, "dev")
		chr, blk, big := filepath.Join(d, "null"), filepath.Join(d, "loop0"), filepath.Join(d, "big")
		mknodAt(t, chr, unix.S_IFCHR|0o640, unix.Mkdev(1, 3))
		mknodAt(t, blk, unix.S_IFBLK|0o600, unix.Mkdev(7, 0))
		mknodAt(t, big, unix.S_IFCHR|0o600, unix.Mkdev(4095, 1<<20-1)) // Linux's largest number
		wantNode(t, chr, unix.S_IFCHR|0o640, 0, unix.Mkdev(1, 3))
		wantNode(t, blk, unix.S_IFBLK|0o600, 0, unix.Mkdev(7, 0))
		wantNode(t, big, unix.S_IFCHR|0o600, 0, unix.Mkdev(4095, 1<<20-1))
		if fi, err := os.Lstat(chr); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			t.Errorf("os.Lstat: %v, %v", fi, err)
		}
		// Inert: the mount is nodev, so this is no /dev/null.
		_, err := os.ReadFile(chr)
		wantErrno(t, "reading a char device on the nodev mount", err, syscall.EACCES)
		err = os.WriteFile(blk, []byte("x"), 0)
		wantErrno(t, "writing a block device on the nodev mount", err, syscall.EACCES)
		// Only root makes devices, but anyone a whiteout (char 0:0).
		pub := mkdirs(t, root, "dev-pub")
		mustOK(t, "chmod", os.Chmod(pub, 0o777))
		asUser(t, nobody, nobody, func() {
			err := unix.Mknod(filepath.Join(pub, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
			wantErrno(t, "mknod of a char device as nobody", err, syscall.EPERM)
			err = unix.Mknod(filepath.Join(pub, "blk"), unix.S_IFBLK|0o666, int(unix.Mkdev(7, 0)))
			wantErrno(t, "mknod of a block device as nobody", err, syscall.EPERM)
			if err := unix.Mknod(filepath.Join(pub, "whiteout"), unix.S_IFCHR, 0); err != nil {
				t.Errorf("mknod of a whiteout as nobody: %v", err)
			}
		})
		wantNode(t, filepath.Join(pub, "whiteout"), unix.S_IFCHR, nobody, 0)
		for _, n := range []string{"null", "blk"} {
			if _, err := os.Lstat(filepath.Join(pub, n)); !errors.Is(err, syscall.ENOENT) {
				t.Errorf("refused device %s: %v", n, err)
			}
		}
	})

	t.Run("UnixSocket", func(t *testing.T) {
		d := mkdirs(t, root, "sock")
		p := filepath.Join(d, "s")
		ln, err := net.Listen("unix", p)
		mustOK(t, "bind a Unix socket on the mount", err)
		defer ln.Close()
		if st := lstat(t, p); st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			t.Errorf("socket: mode %#o", st.Mode)
		}
		done := make(chan error, 1)
		go func() {
			cn, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			defer cn.Close()
			buf := make([]byte, 4)
			if _, err := io.ReadFull(cn, buf); err != nil {
				done <- err
				return
			}
			_, err = cn.Write(append(buf, "-pong"...))
			done <- err
		}()
		cn, err := net.Dial("unix", p)
		mustOK(t, "connect through the mount", err)
		defer cn.Close()
		cn.SetDeadline(time.Now().Add(time.Minute))
		_, err = cn.Write([]byte("ping"))
		mustOK(t, "send", err)
		got := make([]byte, 9)
		if _, err := io.ReadFull(cn, got); err != nil || string(got) != "ping-pong" {
			t.Errorf("through the socket: %q, %v", got, err)
		}
		mustOK(t, "server", <-done)
		// A socket is not opened as a file (open/24.t), and its name is
		// taken.
		_, err = unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		wantErrno(t, "open of a socket", err, syscall.ENXIO)
		wantErrno(t, "bind to a taken name", bindAt(p), syscall.EADDRINUSE)
		// Anyone may bind where they may create.
		pub := mkdirs(t, root, "sock-pub")
		mustOK(t, "chmod", os.Chmod(pub, 0o777))
		asUser(t, nobody, nobody, func() {
			if err := bindAt(filepath.Join(pub, "mine")); err != nil {
				t.Errorf("bind as nobody: %v", err)
			}
		})
		if st := lstat(t, filepath.Join(pub, "mine")); st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Uid != nobody {
			t.Errorf("nobody's socket: mode %#o uid %d", st.Mode, st.Uid)
		}
		mustOK(t, "unlink a socket", os.Remove(filepath.Join(pub, "mine")))
	})

	t.Run("SurviveRemount", func(t *testing.T) {
		d := mkdirs(t, root, "kept")
		mknodAt(t, filepath.Join(d, "c"), unix.S_IFCHR|0o640, unix.Mkdev(10, 200))
		mknodAt(t, filepath.Join(d, "b"), unix.S_IFBLK|0o604, unix.Mkdev(259, 65536))
		mustOK(t, "mkfifo", unix.Mkfifo(filepath.Join(d, "p"), 0o600))
		mustOK(t, "bind", bindAt(filepath.Join(d, "s")))
		mustOK(t, "chmod", os.Chmod(filepath.Join(d, "s"), 0o711))
		mustOK(t, "chown", os.Lchown(filepath.Join(d, "b"), 1234, 5678))
		// Another mount process: what it shows comes from meta.
		m2 := mountAt(t, c.conf, "mnt-remount")
		d2 := filepath.Join(m2.dir, "kept")
		wantNode(t, filepath.Join(d2, "c"), unix.S_IFCHR|0o640, 0, unix.Mkdev(10, 200))
		wantNode(t, filepath.Join(d2, "b"), unix.S_IFBLK|0o604, 1234, unix.Mkdev(259, 65536))
		wantNode(t, filepath.Join(d2, "p"), unix.S_IFIFO|0o600, 0, 0)
		wantNode(t, filepath.Join(d2, "s"), unix.S_IFSOCK|0o711, 0, 0)
		ents, err := os.ReadDir(d2)
		mustOK(t, "readdir", err)
		types := map[string]os.FileMode{}
		for _, e := range ents {
			types[e.Name()] = e.Type()
		}
		want := map[string]os.FileMode{"c": os.ModeDevice | os.ModeCharDevice, "b": os.ModeDevice, "p": os.ModeNamedPipe, "s": os.ModeSocket}
		for n, ty := range want {
			if types[n] != ty {
				t.Errorf("readdir: %s has type %v, want %v", n, types[n], ty)
			}
		}
	})

	t.Run("Times", func(t *testing.T) { // utimensat/00.t
		d := mkdirs(t, root, "times")
		mknodAt(t, filepath.Join(d, "b"), unix.S_IFBLK|0o644, unix.Mkdev(1, 2))
		mknodAt(t, filepath.Join(d, "c"), unix.S_IFCHR|0o644, unix.Mkdev(1, 2))
		mustOK(t, "mkfifo", unix.Mkfifo(filepath.Join(d, "p"), 0o644))
		mustOK(t, "bind", bindAt(filepath.Join(d, "s")))
		for _, n := range []string{"b", "c", "p", "s"} {
			p := filepath.Join(d, n)
			ts := []unix.Timespec{{Sec: 1900000000, Nsec: 123}, {Sec: 1950000000, Nsec: 456}}
			mustOK(t, "utimensat "+n, unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW))
			if st := lstat(t, p); st.Atim != ts[0] || st.Mtim != ts[1] {
				t.Errorf("%s: atime %v mtime %v, want %v %v", n, st.Atim, st.Mtim, ts[0], ts[1])
			}
		}
	})

	t.Run("RenameLinkSymlinkUnlink", func(t *testing.T) {
		d := mkdirs(t, root, "names")
		// rename/20.t: a directory over one that holds only a device
		// or a socket, which is not empty.
		for _, kind := range []string{"dev", "sock"} {
			src, dst := mkdirs(t, d, "src-"+kind), mkdirs(t, d, "dst-"+kind)
			if kind == "dev" {
				mknodAt(t, filepath.Join(dst, "x"), unix.S_IFBLK|0o644, unix.Mkdev(1, 2))
			} else {
				mustOK(t, "bind", bindAt(filepath.Join(dst, "x")))
			}
			err := os.Rename(src, dst)
			wantErrno(t, "rename over a directory holding a "+kind, err, syscall.EEXIST, syscall.ENOTEMPTY)
		}
		// rename/23.t: over a device with another name, which keeps it.
		x, y, z := filepath.Join(d, "x"), filepath.Join(d, "y"), filepath.Join(d, "z")
		mknodAt(t, x, unix.S_IFCHR|0o644, unix.Mkdev(1, 2))
		mknodAt(t, y, unix.S_IFCHR|0o644, unix.Mkdev(3, 4))
		mustOK(t, "link a device", os.Link(y, z))
		if st := lstat(t, z); st.Nlink != 2 {
			t.Errorf("linked device: nlink %d", st.Nlink)
		}
		mustOK(t, "rename over a linked device", os.Rename(x, y))
		if st := lstat(t, z); st.Nlink != 1 || st.Rdev != unix.Mkdev(3, 4) {
			t.Errorf("the other name after the rename: nlink %d device %d:%d", st.Nlink, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		wantNode(t, y, unix.S_IFCHR|0o644, 0, unix.Mkdev(1, 2))
		// symlink/08.t: a name a device or socket holds is taken.
		mustOK(t, "bind", bindAt(filepath.Join(d, "s")))
		for _, n := range []string{"y", "s"} {
			wantErrno(t, "symlink over "+n, os.Symlink("test", filepath.Join(d, n)), syscall.EEXIST)
		}
		// unlink/11.t: in a sticky directory only the owner of the
		// entry or the directory removes it.
		sticky := mkdirs(t, d, "sticky")
		mustOK(t, "chmod", unix.Chmod(sticky, 0o1777))
		for _, n := range []string{"b", "s", "p"} {
			p := filepath.Join(sticky, n)
			switch n {
			case "b":
				mknodAt(t, p, unix.S_IFBLK|0o644, unix.Mkdev(1, 2))
			case "s":
				mustOK(t, "bind", bindAt(p))
			case "p":
				mustOK(t, "mkfifo", unix.Mkfifo(p, 0o644))
			}
			mustOK(t, "chown", os.Lchown(p, nobody, nobody))
			asUser(t, nobody-1, nobody-1, func() {
				wantErrno(t, "unlink of another's "+n+" in a sticky directory", unix.Unlink(p), syscall.EPERM)
			})
			asUser(t, nobody, nobody, func() {
				if err := unix.Unlink(p); err != nil {
					t.Errorf("unlink of one's own %s in a sticky directory: %v", n, err)
				}
			})
		}
	})

	t.Run("ArchiveRoundTrip", func(t *testing.T) {
		specialArchiveRoundTrip(t, root)
	})
	checkClean(t, c.conf, 30*time.Second)
}

// specialArchiveRoundTrip extracts an archive of a tree with devices,
// FIFOs, links and unusual owners and modes onto the mount with tar,
// archives it again from the mount and extracts that elsewhere: both
// copies are the original. tar leaves sockets out ("socket ignored"), so
// a tree with sockets goes through `cp -a` the same way.
func specialArchiveRoundTrip(t *testing.T, root string) {
	stage := filepath.Join(baseDir(t), "stage")
	src := filepath.Join(stage, "src")
	must := func(what string, err error) {
		t.Helper()
		mustOK(t, what, err)
	}
	must("mkdir", os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	must("write", os.WriteFile(filepath.Join(src, "file"), []byte("data\n"), 0o644))
	must("write", os.WriteFile(filepath.Join(src, "sub", "setuid"), []byte("#!/bin/sh\n"), 0o600))
	must("chmod", unix.Chmod(filepath.Join(src, "sub", "setuid"), 0o4755))
	must("link", os.Link(filepath.Join(src, "file"), filepath.Join(src, "hard")))
	must("symlink", os.Symlink("sub/setuid", filepath.Join(src, "link")))
	mknodAt(t, filepath.Join(src, "null"), unix.S_IFCHR|0o666, unix.Mkdev(1, 3))
	must("chmod", os.Chmod(filepath.Join(src, "null"), 0o666))
	mknodAt(t, filepath.Join(src, "sub", "sda1"), unix.S_IFBLK|0o660, unix.Mkdev(8, 1))
	must("chown", os.Lchown(filepath.Join(src, "sub", "sda1"), 0, 6))
	mknodAt(t, filepath.Join(src, "whiteout"), unix.S_IFCHR, 0) // an overlay layer's deletion
	must("mkfifo", unix.Mkfifo(filepath.Join(src, "sub", "fifo"), 0o620))
	must("chown", os.Lchown(filepath.Join(src, "sub", "fifo"), 1234, 5678))
	stamp(t, src)
	orig, err := progScan(src)
	must("scan", err)
	tree := &progTree{root: src, entries: orig}
	for _, e := range orig {
		if e.typ() == syscall.S_IFREG {
			tree.files++
		}
	}

	// tar: onto the mount, then from it to local disk.
	a := filepath.Join(stage, "a.tar")
	progMust(t, stage, nil, nil, "tar", "--format=posix", "-cf", a, "src")
	on := mkdirs(t, root, "untar")
	progMust(t, on, nil, nil, "tar", "--format=posix", "-xpf", a)
	progCompareTrees(t, tree, filepath.Join(on, "src"))
	b := filepath.Join(stage, "b.tar")
	progMust(t, on, nil, nil, "tar", "--format=posix", "-cf", b, "src")
	back := filepath.Join(stage, "back")
	must("mkdir", os.Mkdir(back, 0o755))
	progMust(t, back, nil, nil, "tar", "--format=posix", "-xpf", b)
	progCompareTrees(t, tree, filepath.Join(back, "src"))

	// cp -a, with sockets: onto the mount and back.
	withSock := filepath.Join(stage, "sock")
	must("mkdir", os.Mkdir(withSock, 0o755))
	must("bind", bindAt(filepath.Join(withSock, "socket")))
	must("chmod", os.Chmod(filepath.Join(withSock, "socket"), 0o750))
	must("chown", os.Lchown(filepath.Join(withSock, "socket"), 1234, 5678))
	mknodAt(t, filepath.Join(withSock, "tty"), unix.S_IFCHR|0o620, unix.Mkdev(4, 1))
	stamp(t, withSock)
	sockOrig, err := progScan(withSock)
	must("scan", err)
	sockTree := &progTree{root: withSock, entries: sockOrig}
	progMust(t, stage, nil, nil, "cp", "-a", withSock, filepath.Join(root, "cp-a"))
	progCompareTrees(t, sockTree, filepath.Join(root, "cp-a"))
	progMust(t, stage, nil, nil, "cp", "-a", filepath.Join(root, "cp-a"), filepath.Join(stage, "cp-back"))
	progCompareTrees(t, sockTree, filepath.Join(stage, "cp-back"))
}

// stamp gives every path under dir its own time, to the nanosecond,
// children before parents.
func stamp(t *testing.T, dir string) {
	t.Helper()
	var paths []string
	mustOK(t, "walk", filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		paths = append(paths, p)
		return err
	}))
	for i := len(paths) - 1; i >= 0; i-- {
		ts := unix.NsecToTimespec(int64(1500000000+i*86413)*1e9 + int64(i)*1234567 + 89)
		mustOK(t, "utimensat", unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// TestFUSESetuidDropped: a write, truncation or chown by an unprivileged
// process drops a file's set-user-ID bit, and its set-group-ID bit when
// group-executable, as on Linux's own file systems (chmod/12.t); root
// (CAP_FSETID) writes keep them. The write itself succeeds: the mount
// used to refuse it with EPERM (the kernel asked, in the writer's name,
// for a chmod only the owner may make).
func TestFUSESetuidDropped(t *testing.T) {
	c, m := fuseCluster(t)
	letOthersReach(t, m.dir)
	d := mkdirs(t, m.dir, "suid")
	mk := func(name string, mode uint32) string {
		t.Helper()
		p := filepath.Join(d, name)
		writeFile(t, p, nil)
		mustOK(t, "chmod", unix.Chmod(p, mode))
		if st := lstat(t, p); st.Mode&0o7777 != mode {
			t.Fatalf("%s: mode %#o after chmod %#o", name, st.Mode&0o7777, mode)
		}
		return p
	}
	wantMode := func(p string, want uint32) {
		t.Helper()
		if st := lstat(t, p); st.Mode&0o7777 != want {
			t.Errorf("%s: mode %#o, want %#o", filepath.Base(p), st.Mode&0o7777, want)
		}
	}

	// By a thread acting as nobody: the descriptor's fstat right after
	// the write already shows it.
	for _, tc := range []struct {
		name       string
		mode, want uint32
	}{
		{"suid", 0o4777, 0o777},
		{"sgid", 0o2777, 0o777},
		{"suid-sgid", 0o6777, 0o777},
		{"sgid-no-group-exec", 0o2767, 0o2767}, // not "run as the group": kept
	} {
		p := mk(tc.name, tc.mode)
		asUser(t, nobody, nobody, func() {
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Errorf("%s: open as nobody: %v", tc.name, err)
				return
			}
			defer unix.Close(fd)
			if n, err := unix.Write(fd, []byte("x")); n != 1 || err != nil {
				t.Errorf("%s: write as nobody: %d, %v", tc.name, n, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil || st.Mode&0o7777 != tc.want {
				t.Errorf("%s: fstat after the write: mode %#o (%v), want %#o", tc.name, st.Mode&0o7777, err, tc.want)
			}
		})
		wantMode(p, tc.want)
		wantContent(t, p, []byte("x"))
	}

	// By another user's process (a shell appending).
	p := mk("sh", 0o6777)
	if _, stderr, err := asUserCmd(nobody, nobody, "/bin/sh", "-c", "printf hello >> "+p); err != nil {
		t.Fatalf("appending as nobody: %v: %s", err, stderr)
	}
	wantMode(p, 0o777)
	wantContent(t, p, []byte("hello"))

	// Root writes (CAP_FSETID): kept.
	p = mk("root", 0o6777)
	fd := openFD(t, p, unix.O_WRONLY|unix.O_APPEND, 0)
	pwrite(t, fd, []byte("root"), 0)
	mustOK(t, "close", unix.Close(fd))
	wantMode(p, 0o6777)

	// A truncation by nobody drops them.
	p = mk("trunc", 0o6777)
	asUser(t, nobody, nobody, func() {
		if err := unix.Truncate(p, 3); err != nil {
			t.Errorf("truncate as nobody: %v", err)
		}
	})
	wantMode(p, 0o777)

	// A chown by root drops them from a file, not from a directory.
	p = mk("chown", 0o6555)
	mustOK(t, "chown", os.Chown(p, nobody, nobody))
	wantMode(p, 0o555)
	sub := mkdirs(t, d, "dir")
	mustOK(t, "chmod", unix.Chmod(sub, 0o6755))
	mustOK(t, "chown", os.Chown(sub, nobody, nobody))
	wantMode(sub, 0o6755)
	checkClean(t, c.conf, 30*time.Second)
}

// TestFUSECreateModes: open(O_CREAT) makes a file of mode 0 (open/26.t),
// and a file created read-only is written and truncated through the
// descriptor that created it (ftruncate/00.t), as tar and cp do; the
// data used to be lost at close (EACCES).
func TestFUSECreateModes(t *testing.T) {
	c, m := fuseCluster(t)
	letOthersReach(t, m.dir)
	d := mkdirs(t, m.dir, "modes")
	mustOK(t, "chmod", os.Chmod(d, 0o777))

	for _, flags := range []int{unix.O_WRONLY, unix.O_RDWR, unix.O_RDONLY} {
		p := filepath.Join(d, "zero")
		fd := openFD(t, p, unix.O_CREAT|unix.O_EXCL|flags, 0)
		if st := fstat(t, fd); st.Mode != unix.S_IFREG {
			t.Errorf("fstat of a file created with mode 0: %#o", st.Mode)
		}
		unix.Close(fd)
		wantNode(t, p, unix.S_IFREG, 0, 0)
		mustOK(t, "unlink", os.Remove(p))
	}

	ro, zero := filepath.Join(d, "ro"), filepath.Join(d, "zero-rw")
	asUser(t, nobody, nobody, func() {
		fd, err := unix.Open(ro, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o444)
		if err != nil {
			t.Errorf("create read-only as nobody: %v", err)
			return
		}
		if _, err := unix.Write(fd, []byte("read-only data")); err != nil {
			t.Errorf("write: %v", err)
		}
		if err := unix.Ftruncate(fd, 9); err != nil {
			t.Errorf("ftruncate: %v", err)
		}
		if _, err := unix.Pwrite(fd, []byte("!"), 9); err != nil {
			t.Errorf("pwrite: %v", err)
		}
		if err := unix.Close(fd); err != nil {
			t.Errorf("close: %v (the writes did not reach the cluster)", err)
		}
		fd, err = unix.Open(zero, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Errorf("create mode 0 as nobody: %v", err)
			return
		}
		if err := unix.Ftruncate(fd, 0); err != nil {
			t.Errorf("ftruncate of a mode 0 file: %v", err)
		}
		if err := unix.Close(fd); err != nil {
			t.Errorf("close: %v", err)
		}
		// The mode holds for a new open, the owner's included.
		_, err = unix.Open(ro, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		wantErrno(t, "reopening one's read-only file for writing", err, syscall.EACCES)
		err = unix.Truncate(ro, 0)
		wantErrno(t, "truncate(2) of one's read-only file", err, syscall.EACCES)
	})
	wantContent(t, ro, []byte("read-only!"))
	wantNode(t, ro, unix.S_IFREG|0o444, nobody, 0)
	wantNode(t, zero, unix.S_IFREG, nobody, 0)
	// Another user is held to the mode.
	asUser(t, nobody-1, nobody-1, func() {
		_, err := unix.Open(ro, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		wantErrno(t, "another user opening it for writing", err, syscall.EACCES)
	})
	checkClean(t, c.conf, 30*time.Second)
}

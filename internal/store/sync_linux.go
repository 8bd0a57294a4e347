package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// fdatasync flushes f's data and the metadata needed to read it back (its
// size), skipping timestamps: cheaper than fsync and all a chunk needs.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// fsSpace returns the total size of the file system holding dir and the
// bytes free on it for this (unprivileged) account.
func fsSpace(dir string) (total, avail int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), nil
}

// allocate gives f size bytes of real storage (not a hole).
func allocate(f *os.File, size int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return writeZeros(f, 0, size)
	}
	return err
}

// fsIdentity returns the device number and the statfs id of the file
// system holding dir.
func fsIdentity(dir string) (dev, fsid string, ok bool) {
	var st syscall.Stat_t
	var sfs syscall.Statfs_t
	if syscall.Stat(dir, &st) != nil || syscall.Statfs(dir, &sfs) != nil {
		return "", "", false
	}
	return fmt.Sprintf("%x", st.Dev), fmt.Sprintf("%x:%x:%x", sfs.Fsid.X__val[0], sfs.Fsid.X__val[1], sfs.Type), true
}

// allocatedBytes is what a file takes on disk (st_blocks).
func allocatedBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}

// deviceOf is the device number of the file system holding a file.
func deviceOf(fi fs.FileInfo) (uint64, bool) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), true
	}
	return 0, false
}

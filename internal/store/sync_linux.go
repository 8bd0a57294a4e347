package store

import (
	"fmt"
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

// fsCapacity returns the total size of the filesystem holding dir.
func fsCapacity(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Blocks) * int64(st.Bsize), nil
}

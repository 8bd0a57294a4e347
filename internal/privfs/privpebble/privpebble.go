// Package privpebble makes what pebble creates private, the way privfs
// does for the rest of a server's files. It is apart from privfs so that
// privfs's users that hold no index (the SDK, through pki) do not link
// pebble.
package privpebble

import (
	"fmt"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/sluicefs/sluice/internal/privfs"
	"golang.org/x/sys/unix"
)

// FS wraps the OS's file system as pebble sees it (vfs.Default, or
// a wrapper of it) so that what pebble creates is private: pebble's own
// creates files 0666 and directories as asked (0755), less the umask.
// Files are made FileMode as they are created (on their descriptor: one
// fchmod per new WAL, table or manifest), directories DirMode.
func FS(inner vfs.FS) vfs.FS { return pebbleFS{inner} }

type pebbleFS struct{ vfs.FS }

func (p pebbleFS) Unwrap() vfs.FS { return p.FS }

func (p pebbleFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	return private(p.FS.Create(name, cat))
}

func (p pebbleFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return private(p.FS.OpenReadWrite(name, cat, opts...))
}

func (p pebbleFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	return private(p.FS.ReuseForWrite(oldname, newname, cat))
}

func (p pebbleFS) MkdirAll(dir string, _ os.FileMode) error {
	if err := p.FS.MkdirAll(dir, privfs.DirMode); err != nil {
		return err
	}
	return privfs.Tighten(dir)
}

func (p pebbleFS) Lock(name string) (io.Closer, error) {
	c, err := p.FS.Lock(name)
	if err != nil {
		return nil, err
	}
	if err := privfs.Tighten(name); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// private makes a file pebble just opened FileMode.
func private(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	if fd := f.Fd(); fd != vfs.InvalidFd {
		if err := unix.Fchmod(int(fd), uint32(privfs.FileMode)); err != nil {
			f.Close()
			return nil, fmt.Errorf("making a new index file private: %w", err)
		}
	}
	return f, nil
}

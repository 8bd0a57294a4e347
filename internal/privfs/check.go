package privfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// UnsafeDirError is a data directory other accounts could write into, or
// move aside and replace: they could plant chunk files, an identity or a
// database, or read what the server writes next.
type UnsafeDirError struct {
	Dir  string // the data directory
	Path string // the directory at fault: Dir or one of its parents
	Why  string
}

func (e *UnsafeDirError) Error() string {
	if e.Path == e.Dir {
		return fmt.Sprintf("data directory %s %s: other users could change its contents; refusing to use it (make it yours and private: chmod 700, or choose another)", e.Dir, e.Why)
	}
	return fmt.Sprintf("data directory %s: its parent %s %s, so other users could replace it; refusing to use it (choose a directory under parents only root or you can write)", e.Dir, e.Path, e.Why)
}

// CheckDir refuses a data directory other accounts can write: dir, if it
// exists, must be a directory owned by this process's user and not
// writable by group or others; each existing parent must be owned by
// root or this user and not writable by group or others unless sticky
// (as /tmp is: others cannot rename what is ours there). Symbolic links
// are resolved first. Servers call it before creating anything under dir.
func CheckDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("data directory %s: %w", dir, err)
	}
	// The nearest existing path, with its links resolved: what is
	// missing below it will be created private.
	path, missing := abs, false
	for {
		real, err := filepath.EvalSymlinks(path)
		if err == nil {
			path = real
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("data directory %s: %w", dir, err)
		}
		parent := filepath.Dir(path)
		if parent == path {
			return fmt.Errorf("data directory %s: %w", dir, err)
		}
		path, missing = parent, true
	}
	uid := uint32(os.Geteuid())
	for p, self := path, !missing; ; p, self = filepath.Dir(p), false {
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("data directory %s: %w", dir, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil // no owners to check on this system
		}
		mode := fi.Mode()
		unsafe := func(why string, args ...any) error {
			return &UnsafeDirError{Dir: abs, Path: p, Why: fmt.Sprintf(why, args...)}
		}
		switch {
		case !fi.IsDir():
			return unsafe("is not a directory")
		case self && st.Uid != uid:
			return unsafe("is owned by uid %d, not this process's %d", st.Uid, uid)
		case self && mode.Perm()&0o022 != 0:
			return unsafe("is writable by group or others (mode %v)", mode)
		case !self && st.Uid != uid && st.Uid != 0:
			return unsafe("is owned by uid %d", st.Uid)
		case !self && mode.Perm()&0o022 != 0 && mode&fs.ModeSticky == 0:
			return unsafe("is writable by group or others (mode %v)", mode)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// Package privfs keeps what Sluice's servers write to disk private to the
// account that runs them: directories 0700, files 0600, whatever the
// process's umask (which can only take bits away from those), and the
// modes an older version left repaired at start-up. Chunk files, the
// index, node and meta identities, the cluster secret and client
// credentials are nobody else's business on the host.
package privfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

const (
	// DirMode is the mode of every directory a server creates.
	DirMode fs.FileMode = 0o700
	// FileMode is the mode of every file a server creates.
	FileMode fs.FileMode = 0o600
)

// MkdirAll creates dir, and any missing parent, with DirMode, and makes
// dir itself DirMode if it already existed with more. Existing parents
// are left alone: they are the operator's (/var/lib, say).
func MkdirAll(dir string) error {
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return err
	}
	return Tighten(dir)
}

// Mkdir creates one directory with DirMode; it is not an error if it
// exists (its mode is then made private too). made reports whether it
// was created.
func Mkdir(dir string) (made bool, err error) {
	err = os.Mkdir(dir, DirMode)
	if errors.Is(err, fs.ErrExist) {
		return false, Tighten(dir)
	}
	return err == nil, err
}

// Tighten clears the group and other bits of path's mode.
func Tighten(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		if err := os.Chmod(path, m&0o700); err != nil {
			return fmt.Errorf("making %s private: %w", path, err)
		}
	}
	return nil
}

// Secure makes everything under dir (dir included) private: it clears
// the group and other bits of every directory and regular file, so data
// an older version wrote readable by everyone is no longer. dir is made
// private first, which alone already shuts others out of the tree.
// Symbolic links are not followed (their own mode means nothing).
func Secure(dir string) error {
	if err := Tighten(dir); err != nil {
		return err
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		if path == dir || !(d.IsDir() || d.Type().IsRegular()) {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			if err := os.Chmod(path, m&0o700); err != nil {
				return fmt.Errorf("making %s private: %w", path, err)
			}
		}
		return nil
	})
}

// WriteFile writes data to path atomically (a temporary file renamed
// over it, synced first) with FileMode: a crash leaves the old content
// or the new, never a part, and nobody else can read it at any point.
func WriteFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if err := tmp.Chmod(FileMode); err != nil {
		tmp.Close()
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}

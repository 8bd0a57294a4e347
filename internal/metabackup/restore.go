package metabackup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sluicefs/sluice/internal/pki"
)

// RestoreOptions say what a restore needs.
type RestoreOptions struct {
	// Required are files the backup must hold (meta's key files; a name
	// ending in "/", a directory with at least one file): one without
	// them is no meta backup.
	Required []string
	// Lock is a file under the data directory that a running meta holds
	// locked (meta.db's LOCK): a restore over a running meta is refused.
	Lock string
	// Force lets a restore replace a data directory of the same cluster.
	Force bool
	// Marker, if set, is a file the restore leaves in the directory (the
	// header, as JSON): meta's first start after a restore sees it.
	Marker string
}

// Restore writes the backup at file into the data directory dir, which
// must be empty (but for lost+found) or missing (or, with Force, hold a
// meta of the backup's own cluster that is not running). A symbolic
// link is followed: the backup goes where it points, and it stays a
// link. Nothing under dir changes unless the whole backup verified and
// was written out: a missing dir is unpacked beside where it goes and
// renamed into place; an existing one (perhaps a mount point, which
// cannot be renamed) has it unpacked into a hidden directory inside it
// and its entries renamed into place, those renamed undone if one
// fails. It returns the backup's header.
func Restore(file, dir string, opts RestoreOptions) (Header, error) {
	f, err := os.Open(file)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Header{}, err
	}
	a, err := Open(f, st.Size())
	if err != nil {
		return Header{}, fmt.Errorf("%s: %w", file, err)
	}
	if err := a.hasAll(opts.Required); err != nil {
		return a.Header, fmt.Errorf("%s: %w", file, err)
	}
	target, err := resolve(dir)
	if err != nil {
		return a.Header, err
	}
	exists, err := checkTarget(target, dir, a.Header.Cluster, opts)
	if err != nil {
		return a.Header, err
	}
	parent := filepath.Dir(target)
	var tmp string
	if exists {
		tmp, err = os.MkdirTemp(target, ".restore-*")
	} else if err = os.MkdirAll(parent, 0o700); err == nil {
		tmp, err = os.MkdirTemp(parent, "."+filepath.Base(target)+".restore-*")
	}
	if err != nil {
		return a.Header, fmt.Errorf("making a directory to restore into: %w", err)
	}
	defer os.RemoveAll(tmp) // gone once its entries are in place
	if err := a.Walk(func(name string, size int64, r io.Reader) error {
		return writeFile(filepath.Join(tmp, filepath.FromSlash(name)), size, r)
	}); err != nil {
		return a.Header, fmt.Errorf("restoring %s: %w", file, err)
	}
	if err := caMatches(filepath.Join(tmp, pki.CACertFile), a.Header.Cluster); err != nil {
		return a.Header, fmt.Errorf("restoring %s: %w", file, err)
	}
	if opts.Marker != "" {
		hb, _ := json.Marshal(a.Header)
		if err := writeFile(filepath.Join(tmp, opts.Marker), int64(len(hb)), bytes.NewReader(hb)); err != nil {
			return a.Header, err
		}
	}
	if err := syncDir(tmp); err != nil {
		return a.Header, err
	}
	if exists {
		return a.Header, moveInto(target, tmp)
	}
	if err := os.Rename(tmp, target); err != nil {
		return a.Header, err
	}
	return a.Header, syncDir(parent)
}

// lostFound is the directory mkfs makes at a file system's root: a
// freshly made volume mounted as the data directory holds it, and is
// empty for a restore.
const lostFound = "lost+found"

// resolve is dir made absolute with symbolic links followed, even to
// where nothing is yet (the restore makes it there).
func resolve(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	for range 40 { // a dangling link: follow it by hand
		st, err := os.Lstat(abs)
		if err != nil || st.Mode()&os.ModeSymlink == 0 {
			return abs, nil
		}
		to, err := os.Readlink(abs)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(to) {
			to = filepath.Join(filepath.Dir(abs), to)
		}
		abs = filepath.Clean(to)
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", dir)
}

// moveInto replaces what dir holds (but lost+found and tmp) with the
// entries of tmp, a directory inside it: dir itself is never renamed,
// so it may be a mount point. What dir held is moved aside into another
// directory inside it first, and removed once the new entries are in
// place; if a rename fails, those done are undone.
func moveInto(dir, tmp string) (err error) {
	old, err := os.MkdirTemp(dir, ".replaced-*")
	if err != nil {
		return err
	}
	skip := map[string]bool{lostFound: true, filepath.Base(tmp): true, filepath.Base(old): true}
	var aside, in []string
	defer func() {
		if err == nil {
			return
		}
		var undo []error
		for _, n := range slices.Backward(in) {
			undo = append(undo, os.Rename(filepath.Join(dir, n), filepath.Join(tmp, n)))
		}
		for _, n := range slices.Backward(aside) {
			undo = append(undo, os.Rename(filepath.Join(old, n), filepath.Join(dir, n)))
		}
		if uerr := errors.Join(undo...); uerr != nil {
			// dir must be as it was: what it held stays in old.
			err = fmt.Errorf("%w; putting %s back as it was failed too (what it held is in %s): %v", err, dir, old, uerr)
			return
		}
		os.Remove(old)
	}()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if skip[e.Name()] {
			continue
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(old, e.Name())); err != nil {
			return err
		}
		aside = append(aside, e.Name())
	}
	if ents, err = os.ReadDir(tmp); err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Rename(filepath.Join(tmp, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return err
		}
		in = append(in, e.Name())
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	return errors.Join(os.RemoveAll(old), os.Remove(tmp))
}

// hasAll checks that the backup holds every name in names.
func (a *Archive) hasAll(names []string) error {
	seen := map[string]bool{}
	if err := a.Walk(func(name string, _ int64, _ io.Reader) error {
		seen[name] = true
		return nil
	}); err != nil {
		return err
	}
	for _, n := range names {
		if !seen[n] && !(strings.HasSuffix(n, "/") && hasPrefix(seen, n)) {
			return fmt.Errorf("%w: it lacks %s", ErrNotBackup, n)
		}
	}
	return nil
}

func hasPrefix(seen map[string]bool, prefix string) bool {
	for n := range seen {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// checkTarget decides whether target (dir resolved) may be restored
// into: whether it exists, or why not.
func checkTarget(target, dir, cluster string, opts RestoreOptions) (exists bool, err error) {
	ents, err := os.ReadDir(target)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ents = slices.DeleteFunc(ents, func(e os.DirEntry) bool { return e.Name() == lostFound && e.IsDir() })
	if len(ents) == 0 {
		return true, nil
	}
	caPEM, err := os.ReadFile(filepath.Join(target, pki.CACertFile))
	if err != nil {
		return true, fmt.Errorf("%s is not empty and holds no meta (no readable %s): restore into an empty or new directory", dir, pki.CACertFile)
	}
	ca, err := pki.ParseCert(caPEM)
	if err != nil {
		return true, fmt.Errorf("%s holds an unreadable %s (%v): restore into an empty or new directory", dir, pki.CACertFile, err)
	}
	have := pki.Fingerprint(ca)
	if have != cluster {
		return true, fmt.Errorf("%s holds the meta of another cluster (CA %s; the backup is of cluster %s): refusing to replace it", dir, have, cluster)
	}
	if !opts.Force {
		return true, fmt.Errorf("%s already holds this cluster's meta: --force replaces it with the backup", dir)
	}
	if opts.Lock != "" {
		lock := filepath.Join(target, opts.Lock)
		if _, err := os.Stat(lock); err == nil {
			l, err := vfs.Default.Lock(lock)
			if err != nil {
				return true, fmt.Errorf("%s is in use (a meta is running on it? %v): stop it first", dir, err)
			}
			l.Close()
		}
	}
	return true, nil
}

// caMatches checks that the CA certificate a backup carries (if any) is
// of the cluster its header names: the refusal of another cluster's
// directory goes by the header, which only a checksum protects.
func caMatches(caFile, cluster string) error {
	caPEM, err := os.ReadFile(caFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil // Required says whether it must be there
	}
	if err != nil {
		return err
	}
	ca, err := pki.ParseCert(caPEM)
	if err != nil {
		return fmt.Errorf("%w: its %s: %v", ErrNotBackup, pki.CACertFile, err)
	}
	if fp := pki.Fingerprint(ca); fp != cluster {
		return fmt.Errorf("%w: its header names cluster %s but its %s is of cluster %s", ErrNotBackup, cluster, pki.CACertFile, fp)
	}
	return nil
}

// writeFile writes exactly size bytes of r to a new private file.
func writeFile(path string, size int64, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: %d bytes of %d", path, n, size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

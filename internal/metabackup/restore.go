package metabackup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
// must be empty or missing (or, with Force, hold a meta of the backup's
// own cluster that is not running). Nothing under dir changes unless
// the whole backup verified and was written out: it is unpacked beside
// dir and renamed into place. It returns the backup's header.
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
	exists, err := checkTarget(dir, a.Header.Cluster, opts)
	if err != nil {
		return a.Header, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return a.Header, err
	}
	parent := filepath.Dir(abs)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return a.Header, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(abs)+".restore-*")
	if err != nil {
		return a.Header, fmt.Errorf("making a directory to restore into: %w", err)
	}
	defer os.RemoveAll(tmp) // gone once renamed
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
		// Empty, or (Force) this cluster's: moved aside, then removed.
		old, err := os.MkdirTemp(parent, "."+filepath.Base(abs)+".replaced-*")
		if err != nil {
			return a.Header, err
		}
		if err := os.Rename(abs, filepath.Join(old, "d")); err != nil {
			os.Remove(old)
			return a.Header, err
		}
		if err := os.Rename(tmp, abs); err != nil {
			// dir must be as it was: put it back, never remove it.
			if berr := os.Rename(filepath.Join(old, "d"), abs); berr != nil {
				return a.Header, fmt.Errorf("%w; moving %s back from %s failed too: %v", err, dir, old, berr)
			}
			os.Remove(old)
			return a.Header, err
		}
		defer os.RemoveAll(old)
	} else if err := os.Rename(tmp, abs); err != nil {
		return a.Header, err
	}
	return a.Header, syncDir(parent)
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

// checkTarget decides whether dir may be restored into: whether it
// exists, or why not.
func checkTarget(dir, cluster string, opts RestoreOptions) (exists bool, err error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if len(ents) == 0 {
		return true, nil
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
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
		lock := filepath.Join(dir, opts.Lock)
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

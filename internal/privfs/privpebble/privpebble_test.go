package privpebble

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// withUmask runs the test under umask 022, the usual one, which leaves
// what is created with 0755/0644 readable by everyone. (Tests in this
// package do not run in parallel: the umask is the process's.)
func withUmask(t *testing.T) {
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
}

// open lists every entry under dir (dir included) whose mode lets group
// or others in.
func open(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Type()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o077 != 0 {
			out = append(out, p+" "+fi.Mode().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFS: a pebble database opened through FS creates nothing
// others can read, whatever pebble asks for.
func TestFS(t *testing.T) {
	withUmask(t)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "db")
	db, err := pebble.Open(dir, &pebble.Options{FS: FS(vfs.Default)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if err := db.Set([]byte{byte(i), byte(i >> 8)}, make([]byte, 1000), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil { // an sstable too
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) < 4 {
		t.Fatalf("pebble made only %d files", len(ents))
	}
	if got := open(t, dir); len(got) != 0 {
		t.Errorf("pebble's files are open to others: %v", got)
	}
}

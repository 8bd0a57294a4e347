//go:build linux

package metabackup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size (e.g. "1m") on a new directory under
// tmp, unmounted when the test ends; it skips unless root may mount.
func mountTmpfs(t *testing.T, tmp, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a file system needs root")
	}
	dir := filepath.Join(tmp, "mnt-"+size)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("mounting a tmpfs: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	if err := os.Mkdir(filepath.Join(dir, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRestoreIntoMountPoint: a freshly mounted volume (holding only
// lost+found) is restored into, though it cannot be renamed; --force
// replaces a restored meta there too. A restore that fails midway (the
// volume fills) leaves it as it was.
func TestRestoreIntoMountPoint(t *testing.T) {
	tmp, file, opts := restoreFixture(t, nil)
	dir := mountTmpfs(t, tmp, "1m")
	if err := os.Remove(filepath.Join(dir, "lost+found")); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(file, dir, opts); err != nil {
		t.Fatalf("restore into a mount point: %v", err)
	}
	restored(t, dir, false)
	os.Mkdir(filepath.Join(dir, "lost+found"), 0o700)
	opts.Force = true
	if _, err := Restore(file, dir, opts); err != nil {
		t.Fatalf("forced restore into a mount point: %v", err)
	}
	restored(t, dir, true)

	_, big, bopts := restoreFixture(t, map[string]string{"meta.db/000001.sst": strings.Repeat("s", 256<<10)})
	small := mountTmpfs(t, tmp, "64k")
	before := tree(t, small)
	if _, err := Restore(big, small, bopts); err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("restore of 256 KiB into 64 KiB: %v, want no space", err)
	}
	if after := tree(t, small); after != before {
		t.Errorf("a failed restore changed %s:\n%s\nwas\n%s", small, after, before)
	}
	if ents, _ := filepath.Glob(filepath.Join(small, ".*")); len(ents) != 0 {
		t.Errorf("a failed restore left %v behind", ents)
	}
}

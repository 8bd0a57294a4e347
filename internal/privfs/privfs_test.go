package privfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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

func TestMkdirAllAndMkdir(t *testing.T) {
	withUmask(t)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "a", "b")
	if err := MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	if got := open(t, filepath.Join(base, "a")); len(got) != 0 {
		t.Errorf("MkdirAll left open: %v", got)
	}
	// An existing directory is made private too.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	made, err := Mkdir(filepath.Join(dir, "c"))
	if err != nil || !made {
		t.Fatalf("Mkdir: made %v, %v", made, err)
	}
	os.Chmod(filepath.Join(dir, "c"), 0o777)
	if made, err := Mkdir(filepath.Join(dir, "c")); err != nil || made {
		t.Fatalf("Mkdir of an existing directory: made %v, %v", made, err)
	}
	if got := open(t, filepath.Join(base, "a")); len(got) != 0 {
		t.Errorf("left open: %v", got)
	}
	// The operator's parent is not ours to change.
	if fi, _ := os.Stat(base); fi.Mode().Perm() != 0o755 {
		t.Errorf("parent made %v", fi.Mode())
	}
}

func TestSecure(t *testing.T) {
	withUmask(t)
	dir := filepath.Join(t.TempDir(), "data")
	for _, d := range []string{"x/y", "z"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"f", "x/g", "x/y/h"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("secret"), 0o664); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "x/g"), 0o640)
	os.Chmod(filepath.Join(dir, "x/y/h"), 0o400)
	if err := os.Symlink("f", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if got := open(t, dir); len(got) == 0 {
		t.Fatal("nothing open before Secure: the test shows nothing")
	}
	if err := Secure(dir); err != nil {
		t.Fatal(err)
	}
	if got := open(t, dir); len(got) != 0 {
		t.Errorf("Secure left open: %v", got)
	}
	// The owner's bits are kept as they were.
	for f, want := range map[string]fs.FileMode{"f": 0o600, "x/g": 0o600, "x/y/h": 0o400, "x": 0o700} {
		if fi, _ := os.Stat(filepath.Join(dir, f)); fi.Mode().Perm() != want {
			t.Errorf("%s: %v, want %v", f, fi.Mode().Perm(), want)
		}
	}
}

// TestCheckDir: a data directory others can write, or whose parent they
// can write (unless sticky), or owned by another user, is refused with an
// error naming the directory at fault; a private one, or one yet to be
// made under a safe parent, is accepted.
func TestCheckDir(t *testing.T) {
	base := t.TempDir() // 0700, ours
	mk := func(name string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := func(dir string) {
		t.Helper()
		if err := CheckDir(dir); err != nil {
			t.Errorf("CheckDir(%s): %v", dir, err)
		}
	}
	refused := func(dir, at, why string) {
		t.Helper()
		err := CheckDir(dir)
		var ue *UnsafeDirError
		if !errors.As(err, &ue) || ue.Path != at || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("CheckDir(%s): %v; want it refused for %s (%s)", dir, err, at, why)
		}
	}
	ok(mk("private", 0o700))
	ok(mk("readable", 0o755)) // an older version's: made private after the check
	ok(filepath.Join(base, "private", "not-yet", "made"))
	refused(mk("open", 0o777), filepath.Join(base, "open"), "writable by group or others")
	refused(mk("group", 0o770), filepath.Join(base, "group"), "writable by group or others")
	refused(mk("sticky", 0o777|os.ModeSticky), filepath.Join(base, "sticky"), "writable by group or others")
	refused(filepath.Join(base, "open", "sub"), filepath.Join(base, "open"), "could replace it")
	ok(filepath.Join(base, "sticky", "sub")) // as under /tmp
	// Through a symbolic link: the target is checked.
	if err := os.Symlink(filepath.Join(base, "open"), filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	refused(filepath.Join(base, "link"), filepath.Join(base, "open"), "writable")
	f := filepath.Join(base, "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	refused(f, f, "not a directory")
	if os.Geteuid() == 0 {
		other := mk("other", 0o700)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused(other, other, "owned by uid 65534")
		if err := os.Mkdir(filepath.Join(other, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		refused(filepath.Join(other, "sub"), other, "owned by uid 65534")
	}
}

package metabackup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/pki"
)

// restoreFixture writes a backup of a cluster into tmp and returns its
// path, options, and a cluster directory of its own (for --force).
func restoreFixture(t *testing.T, extra map[string]string) (tmp, file string, opts RestoreOptions) {
	t.Helper()
	tmp = t.TempDir()
	os.Mkdir(filepath.Join(tmp, "ca"), 0o700)
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"ca.crt": string(ca.CertPEM), "meta.db/LOG": "x"}
	order := []string{"ca.crt", "meta.db/LOG"}
	for n, c := range extra {
		files[n] = c
		order = append(order, n)
	}
	file = filepath.Join(tmp, "b")
	if err := os.WriteFile(file, backupOf(t, pki.Fingerprint(ca.Cert), files, order...), 0o600); err != nil {
		t.Fatal(err)
	}
	return tmp, file, RestoreOptions{Required: []string{"ca.crt", "meta.db/"}, Marker: "restored"}
}

// restored checks that dir holds the restored backup and lost+found
// (if it had one), and nothing the restore used on the way.
func restored(t *testing.T, dir string, lostFound bool) {
	t.Helper()
	if got, err := os.ReadFile(filepath.Join(dir, "meta.db", "LOG")); string(got) != "x" {
		t.Errorf("%s: meta.db/LOG = %q (%v)", dir, got, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := "ca.crt meta.db restored"
	if lostFound {
		want = "ca.crt lost+found meta.db restored"
	}
	if got := strings.Join(names, " "); got != want {
		t.Errorf("%s holds %s, want %s", dir, got, want)
	}
	if lostFound {
		if st, err := os.Stat(filepath.Join(dir, "lost+found")); err != nil || !st.IsDir() {
			t.Errorf("lost+found: %v", err)
		}
	}
}

// TestRestoreIntoLostFound: a directory holding only lost+found (a
// freshly made file system) is empty to a restore, and keeps it.
func TestRestoreIntoLostFound(t *testing.T) {
	tmp, file, opts := restoreFixture(t, nil)
	dir := filepath.Join(tmp, "vol")
	os.MkdirAll(filepath.Join(dir, "lost+found"), 0o700)
	if _, err := Restore(file, dir, opts); err != nil {
		t.Fatalf("restore into a directory holding only lost+found: %v", err)
	}
	restored(t, dir, true)
	// A lost+found that is a file is not what mkfs makes: not empty.
	other := filepath.Join(tmp, "other")
	os.MkdirAll(other, 0o700)
	os.WriteFile(filepath.Join(other, "lost+found"), []byte("mine"), 0o600)
	if _, err := Restore(file, other, opts); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("restore into a directory with a file lost+found: %v", err)
	}
	// --force over it replaces the restored meta and keeps lost+found.
	os.WriteFile(filepath.Join(dir, "extra"), []byte("old"), 0o600)
	opts.Force = true
	if _, err := Restore(file, dir, opts); err != nil {
		t.Fatalf("forced restore: %v", err)
	}
	restored(t, dir, true)
}

// TestRestoreThroughSymlink: a data directory that is a symbolic link
// (to an empty directory, or to where none is yet) stays a link; the
// backup is restored where it points.
func TestRestoreThroughSymlink(t *testing.T) {
	tmp, file, opts := restoreFixture(t, nil)
	for _, c := range []struct {
		name  string
		exist bool
	}{{"to-empty", true}, {"to-missing", false}} {
		real := filepath.Join(tmp, "real-"+c.name)
		if c.exist {
			os.Mkdir(real, 0o700)
		}
		link := filepath.Join(tmp, c.name)
		if err := os.Symlink("real-"+c.name, link); err != nil {
			t.Fatal(err)
		}
		if _, err := Restore(file, link, opts); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s: no longer a symbolic link (%v, %v)", c.name, st.Mode(), err)
		}
		restored(t, real, false)
	}
	if ents, _ := filepath.Glob(filepath.Join(tmp, ".*")); len(ents) != 0 {
		t.Errorf("restores left %v behind", ents)
	}
}

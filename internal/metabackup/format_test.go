package metabackup

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/pki"
)

// backupOf writes a backup of files (name: contents) for cluster.
func backupOf(t testing.TB, cluster string, files map[string]string, order ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Header{Cluster: cluster, Created: time.Unix(1700000000, 0).UTC(), Meta: "127.0.0.1:7700"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range order {
		if err := w.Add(n, int64(len(files[n])), strings.NewReader(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func contents(t *testing.T, a *Archive) map[string]string {
	t.Helper()
	got := map[string]string{}
	if err := a.Walk(func(name string, _ int64, r io.Reader) error {
		b, err := io.ReadAll(r)
		got[name] = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

var sample = map[string]string{"ca.crt": "CERT", "meta.db/000002.log": strings.Repeat("log", 5000), "meta.db/MANIFEST-000001": "", "cluster.secret": "s"}
var sampleOrder = []string{"ca.crt", "cluster.secret", "meta.db/000002.log", "meta.db/MANIFEST-000001"}

func TestRoundTrip(t *testing.T) {
	b := backupOf(t, "sha256:aa", sample, sampleOrder...)
	a, err := Open(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Header.Cluster != "sha256:aa" || a.Header.Meta != "127.0.0.1:7700" || !a.Header.Created.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("header %+v", a.Header)
	}
	got := contents(t, a)
	if len(got) != len(sample) {
		t.Errorf("%d files back, want %d", len(got), len(sample))
	}
	for n, c := range sample {
		if got[n] != c {
			t.Errorf("%s: %d bytes back, want %d", n, len(got[n]), len(c))
		}
	}
}

// Every truncation and every flipped byte is detected.
func TestTruncatedOrCorrupted(t *testing.T) {
	b := backupOf(t, "sha256:aa", sample, sampleOrder...)
	for n := 0; n < len(b); n += 1 + n/50 {
		_, err := Open(bytes.NewReader(b[:n]), int64(n))
		if n < len(Magic)+2 {
			if !errors.Is(err, ErrNotBackup) {
				t.Fatalf("first %d bytes: %v, want ErrNotBackup", n, err)
			}
			continue
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("first %d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
		}
	}
	for i := len(Magic) + 2; i < len(b); i += 1 + i/50 {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		if _, err := Open(bytes.NewReader(c), int64(len(c))); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
		}
	}
}

func TestNotABackup(t *testing.T) {
	for _, s := range []string{"", "hello world\n", "sluice-meta-backup vX\n", strings.Repeat("x", 5000)} {
		if _, err := Open(strings.NewReader(s), int64(len(s))); !errors.Is(err, ErrNotBackup) {
			t.Errorf("%q: %v, want ErrNotBackup", s, err)
		}
	}
	b := backupOf(t, "sha256:aa", sample, sampleOrder...)
	b = append([]byte("sluice-meta-backup v2\n"), b[len(Magic)+2:]...)
	if _, err := Open(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "format 2") {
		t.Errorf("format 2: %v, want ErrVersion naming it", err)
	}
}

func TestBadNames(t *testing.T) {
	w, _ := NewWriter(io.Discard, Header{Cluster: "c"})
	for _, n := range []string{"../x", "/etc/passwd", "a/../../b", "", ".", "a//b"} {
		if err := w.Add(n, 0, strings.NewReader("")); err == nil {
			t.Errorf("name %q accepted", n)
		}
	}
}

// A restore refuses, changing nothing: a bad file, a directory of
// another cluster, one of this cluster without --force, one with other
// files; it restores into an empty or missing one.
func TestRestoreTargets(t *testing.T) {
	tmp := t.TempDir()
	os.Mkdir(filepath.Join(tmp, "ours"), 0o700)
	os.Mkdir(filepath.Join(tmp, "theirs"), 0o700)
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "ours"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateCA(filepath.Join(tmp, "theirs")); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"ca.crt": string(ca.CertPEM), "meta.db/LOG": "x"}
	b := backupOf(t, pki.Fingerprint(ca.Cert), files, "ca.crt", "meta.db/LOG")
	file := filepath.Join(tmp, "b")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := RestoreOptions{Required: []string{"ca.crt", "meta.db/"}}
	refused := func(dir, want string, opts RestoreOptions) {
		t.Helper()
		before := tree(t, dir)
		if _, err := Restore(file, dir, opts); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("restore into %s: %v, want %q", dir, err, want)
		}
		if after := tree(t, dir); after != before {
			t.Errorf("refused restore changed %s:\n%s\nwas\n%s", dir, after, before)
		}
	}
	refused(filepath.Join(tmp, "theirs"), "another cluster", RestoreOptions{Force: true})
	refused(filepath.Join(tmp, "ours"), "--force", opts)
	os.MkdirAll(filepath.Join(tmp, "junk"), 0o700)
	os.WriteFile(filepath.Join(tmp, "junk", "f"), []byte("mine"), 0o600)
	refused(filepath.Join(tmp, "junk"), "holds no meta", opts)
	refused(filepath.Join(tmp, "new"), "lacks cluster.secret", RestoreOptions{Required: []string{"cluster.secret"}})

	for _, dir := range []string{filepath.Join(tmp, "new"), filepath.Join(tmp, "empty")} {
		os.MkdirAll(filepath.Join(tmp, "empty"), 0o700)
		if _, err := Restore(file, dir, opts); err != nil {
			t.Fatalf("restore into %s: %v", dir, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "meta.db", "LOG")); string(got) != "x" {
			t.Errorf("%s: meta.db/LOG = %q", dir, got)
		}
	}
	opts.Force = true
	if _, err := Restore(file, filepath.Join(tmp, "ours"), opts); err != nil {
		t.Fatalf("forced restore over the same cluster: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "ours", "ca.key")); !os.IsNotExist(err) {
		t.Errorf("forced restore kept a file the backup does not hold (%v)", err)
	}
	if ents, _ := filepath.Glob(filepath.Join(tmp, ".*")); len(ents) != 0 {
		t.Errorf("restores left %v behind", ents)
	}
}

// tree lists dir's files and contents.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var sb strings.Builder
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			b, _ := os.ReadFile(p)
			sb.WriteString(p + " " + string(b) + "\n")
		}
		return nil
	})
	return sb.String()
}

// FuzzOpen feeds Open and Walk any file: no panic, and a file they
// accept yields only clean relative names.
func FuzzOpen(f *testing.F) {
	f.Add(backupOf(f, "sha256:aa", sample, sampleOrder...))
	f.Add([]byte("sluice-meta-backup v1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Open(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		a.Walk(func(name string, size int64, r io.Reader) error {
			if checkName(name) != nil {
				t.Fatalf("walked a bad name %q", name)
			}
			_, err := io.Copy(io.Discard, io.LimitReader(r, size))
			return err
		})
	})
}

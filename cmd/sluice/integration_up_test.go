package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUpCommandsAndRestart runs `sluice up`, exercises every file command
// and checks its output, stops the cluster with SIGTERM and starts it
// again on the same data directory.
func TestUpCommandsAndRestart(t *testing.T) {
	base := baseDir(t)
	dir := filepath.Join(base, "data")
	c := startUp(t, dir, 3)
	if len(c.nodes) != 3 {
		t.Fatalf("up printed %d nodes", len(c.nodes))
	}
	conf := c.conf

	// The root is empty.
	if out := mustRun(t, conf, nil, "ls").stdout; len(out) != 0 {
		t.Errorf("ls of a new cluster: %q", out)
	}

	// mkdir -p creates parents and tolerates an existing directory.
	mustRun(t, conf, nil, "mkdir", "-p", "/a/b/c")
	mustRun(t, conf, nil, "mkdir", "-p", "/a/b")
	mustRun(t, conf, nil, "mkdir", "/a/empty")

	// put LOCAL DIR/ keeps the local name; put - reads stdin.
	blob := randomBytes(t, 3<<20+12345) // not a multiple of any block size
	blobSize := strconv.Itoa(len(blob))
	local := filepath.Join(base, "blob.bin")
	if err := os.WriteFile(local, blob, 0o640); err != nil {
		t.Fatal(err)
	}
	mustRun(t, conf, nil, "put", local, "/a/b/c/")
	hello := []byte("hello, sluice\n")
	mustRun(t, conf, bytes.NewReader(hello), "put", "-", "/a/hello.txt")
	// put into an existing directory without the trailing slash.
	mustRun(t, conf, nil, "put", local, "/a/b")
	// An empty file.
	mustRun(t, conf, bytes.NewReader(nil), "put", "-", "/a/empty.txt")

	// ls lists names, directories with a slash, sorted.
	if out := string(mustRun(t, conf, nil, "ls", "/a").stdout); out != "b/\nempty/\nempty.txt\nhello.txt\n" {
		t.Errorf("ls /a = %q", out)
	}
	if out := string(mustRun(t, conf, nil, "ls", "/a/b").stdout); out != "blob.bin\nc/\n" {
		t.Errorf("ls /a/b = %q", out)
	}
	if out := string(mustRun(t, conf, nil, "ls", "/a/b/c").stdout); out != "blob.bin\n" {
		t.Errorf("ls /a/b/c = %q", out)
	}
	// ls of a file lists the file.
	if out := string(mustRun(t, conf, nil, "ls", "/a/hello.txt").stdout); out != "hello.txt\n" {
		t.Errorf("ls /a/hello.txt = %q", out)
	}
	long := string(mustRun(t, conf, nil, "ls", "-l", "/a/b/c").stdout)
	if !regexp.MustCompile(`^\s*-rw-r----- +\d+ +\d+ +` + blobSize + ` \d{4}-\d\d-\d\d \d\d:\d\d +blob\.bin\n$`).MatchString(long) {
		t.Errorf("ls -l /a/b/c = %q (want mode from the local file 0640 and size %s)", long, blobSize)
	}

	// stat shows the size, type and policy.
	st := string(mustRun(t, conf, nil, "stat", "/a/hello.txt").stdout)
	for _, re := range []string{`(?m)^\s*File: /a/hello.txt$`, `(?m)^\s*Type: file$`, `(?m)^\s*Size: 14$`, `(?m)^Policy: replicas=3 strategy=ring$`} {
		if !regexp.MustCompile(re).MatchString(st) {
			t.Errorf("stat /a/hello.txt: no match for %q in\n%s", re, st)
		}
	}
	if st := string(mustRun(t, conf, nil, "stat", "/a/b/c/blob.bin").stdout); !regexp.MustCompile(`(?m)^\s*Size: ` + blobSize + `$`).MatchString(st) {
		t.Errorf("stat blob:\n%s", st)
	}
	if st := string(mustRun(t, conf, nil, "stat", "/a/empty.txt").stdout); !regexp.MustCompile(`(?m)^\s*Size: 0$`).MatchString(st) {
		t.Errorf("stat empty:\n%s", st)
	}
	if st := string(mustRun(t, conf, nil, "stat", "/a/b").stdout); !regexp.MustCompile(`(?m)^\s*Type: dir$`).MatchString(st) {
		t.Errorf("stat dir:\n%s", st)
	}

	// cat prints content, several files in order.
	if out := mustRun(t, conf, nil, "cat", "/a/hello.txt").stdout; !bytes.Equal(out, hello) {
		t.Errorf("cat /a/hello.txt = %q", out)
	}
	if out := mustRun(t, conf, nil, "cat", "/a/hello.txt", "/a/empty.txt", "/a/hello.txt").stdout; string(out) != string(hello)+string(hello) {
		t.Errorf("cat of three files = %q", out)
	}
	if out := mustRun(t, conf, nil, "cat", "/a/b/c/blob.bin").stdout; !bytes.Equal(out, blob) {
		t.Errorf("cat blob: %d bytes %s, want %d bytes %s", len(out), sum(out), len(blob), sum(blob))
	}
	// get to stdout, to a file, into a local directory.
	if out := mustRun(t, conf, nil, "get", "/a/b/blob.bin", "-").stdout; !bytes.Equal(out, blob) {
		t.Errorf("get - : %d bytes %s, want %s", len(out), sum(out), sum(blob))
	}
	got := filepath.Join(base, "got.bin")
	mustRun(t, conf, nil, "get", "/a/b/c/blob.bin", got)
	checkLocal(t, got, blob)
	gdir := filepath.Join(base, "getdir")
	os.Mkdir(gdir, 0o755)
	mustRun(t, conf, nil, "get", "/a/hello.txt", gdir)
	checkLocal(t, filepath.Join(gdir, "hello.txt"), hello)
	if ents, _ := os.ReadDir(gdir); len(ents) != 1 {
		t.Errorf("get left %d entries in %s, want just hello.txt", len(ents), gdir)
	}
	mustRun(t, conf, nil, "get", "/a/empty.txt", filepath.Join(base, "empty"))
	checkLocal(t, filepath.Join(base, "empty"), nil)

	// Overwrite with put: the new content replaces the old.
	hello2 := []byte("replaced\n")
	mustRun(t, conf, bytes.NewReader(hello2), "put", "-", "/a/hello.txt")
	if out := mustRun(t, conf, nil, "cat", "/a/hello.txt").stdout; !bytes.Equal(out, hello2) {
		t.Errorf("cat after overwrite = %q", out)
	}

	// mv renames, and moves into a directory.
	mustRun(t, conf, nil, "mv", "/a/hello.txt", "/a/greeting.txt")
	mustFail(t, conf, []string{`ENOENT`}, "stat", "/a/hello.txt")
	if out := mustRun(t, conf, nil, "cat", "/a/greeting.txt").stdout; !bytes.Equal(out, hello2) {
		t.Errorf("cat after mv = %q", out)
	}
	mustRun(t, conf, nil, "mv", "/a/greeting.txt", "/a/empty")
	if out := string(mustRun(t, conf, nil, "ls", "/a/empty").stdout); out != "greeting.txt\n" {
		t.Errorf("ls /a/empty after mv into it = %q", out)
	}
	mustRun(t, conf, nil, "mv", "/a/empty", "/a/full")

	// rm removes a file; rm -r a tree.
	mustRun(t, conf, nil, "rm", "/a/empty.txt")
	mustRun(t, conf, nil, "rm", "-r", "/a/b")
	mustFail(t, conf, []string{`ENOENT`}, "stat", "/a/b/c/blob.bin")
	if out := string(mustRun(t, conf, nil, "ls", "/a").stdout); out != "full/\n" {
		t.Errorf("ls /a after rm = %q", out)
	}

	// Keep some files for the restart; SLUICE_CONF works as --conf does.
	mustRun(t, conf, nil, "mkdir", "/keep")
	mustRun(t, conf, nil, "put", local, "/keep/blob.bin")
	mustRun(t, conf, bytes.NewReader(nil), "put", "-", "/keep/empty")
	envPut := exec.Command(sluiceBin, "put", "-", "/keep/env.txt")
	envPut.Env = append(os.Environ(), "SLUICE_CONF="+conf)
	envPut.Dir = base // no sluice-data/client.conf here
	envPut.Stdin = bytes.NewReader(hello)
	if out, err := envPut.CombinedOutput(); err != nil {
		t.Errorf("put with SLUICE_CONF: %v: %s", err, out)
	}

	// An erasure-coded directory (2+1 fits the three nodes).
	mustRun(t, conf, nil, "mkdir", "/ec")
	mustRun(t, conf, nil, "policy", "set", "/ec", "--ec", "2+1", "--cell", "4096")
	mustRun(t, conf, nil, "put", local, "/ec/blob.bin")
	if st := string(mustRun(t, conf, nil, "stat", "/ec/blob.bin").stdout); !strings.Contains(st, "ec=2+1 cell=4096") {
		t.Errorf("stat of an erasure-coded file:\n%s", st)
	}

	// A file crossing the 64 MiB chunk boundary (two chunks), unless -short.
	var huge []byte
	if !testing.Short() {
		huge = randomBytes(t, 64<<20+4097)
		hugePath := filepath.Join(base, "huge.bin")
		if err := os.WriteFile(hugePath, huge, 0o600); err != nil {
			t.Fatal(err)
		}
		mustRun(t, conf, nil, "put", hugePath, "/keep/huge.bin")
		os.Remove(hugePath)
		if out := mustRun(t, conf, nil, "get", "/keep/huge.bin", "-").stdout; !bytes.Equal(out, huge) {
			t.Errorf("two-chunk file: %d bytes %s, want %d bytes %s", len(out), sum(out), len(huge), sum(huge))
		}
		checkReplicas(t, metaClient(t, conf), nodeDirs(t, filepath.Join(dir, "node1"), filepath.Join(dir, "node2"), filepath.Join(dir, "node3")), "/keep/huge.bin", huge)
	}

	// SIGTERM: a clean shutdown with exit status 0.
	if code := c.proc.stop(t, 15*time.Second); code != 0 {
		t.Errorf("sluice up exited %d after SIGTERM, want 0; stderr:\n%s", code, tail(c.proc.stderrText(), 20))
	}
	if !strings.Contains(strings.Join(c.proc.out.snapshot(), "\n"), "sluice: shutting down") {
		t.Errorf("up did not say it was shutting down")
	}
	// Its ports are closed (a CLI call would retry for 15 s, so dial).
	for _, a := range append([]string{c.meta}, values(c.nodes)...) {
		if nc, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			nc.Close()
			t.Errorf("%s still accepts connections after up exited", a)
		}
	}

	// Start again on the same directory: everything is still there.
	c2 := startUp(t, dir, 3)
	if c2.conf != c.conf {
		t.Errorf("restart wrote client config to %s, first start to %s", c2.conf, c.conf)
	}
	wantKeep := "blob.bin\nempty\nenv.txt\n"
	if huge != nil {
		wantKeep = "blob.bin\nempty\nenv.txt\nhuge.bin\n"
	}
	if out := string(mustRun(t, conf, nil, "ls", "/keep").stdout); out != wantKeep {
		t.Errorf("ls /keep after restart = %q", out)
	}
	if out := string(mustRun(t, conf, nil, "ls", "/a/full").stdout); out != "greeting.txt\n" {
		t.Errorf("ls /a/full after restart = %q", out)
	}
	if out := mustRun(t, conf, nil, "get", "/keep/blob.bin", "-").stdout; !bytes.Equal(out, blob) {
		t.Errorf("blob after restart: %d bytes %s, want %s", len(out), sum(out), sum(blob))
	}
	if out := mustRun(t, conf, nil, "cat", "/keep/env.txt", "/keep/empty", "/a/full/greeting.txt").stdout; string(out) != string(hello)+string(hello2) {
		t.Errorf("cat after restart = %q", out)
	}
	if st := string(mustRun(t, conf, nil, "stat", "/keep/blob.bin").stdout); !regexp.MustCompile(`(?m)^\s*Size: ` + blobSize + `$`).MatchString(st) {
		t.Errorf("stat after restart:\n%s", st)
	}
	// The restarted cluster takes writes too, and the data dir holds the
	// files three times over.
	mustRun(t, conf, bytes.NewReader(hello2), "put", "-", "/keep/after.txt")
	if out := mustRun(t, conf, nil, "cat", "/keep/after.txt").stdout; !bytes.Equal(out, hello2) {
		t.Errorf("cat of a file written after restart = %q", out)
	}
	if huge != nil {
		if out := mustRun(t, conf, nil, "get", "/keep/huge.bin", "-").stdout; !bytes.Equal(out, huge) {
			t.Errorf("two-chunk file after restart: %d bytes %s", len(out), sum(out))
		}
	}
	// The erasure-coded file survives the restart and its directory takes
	// new files.
	if out := mustRun(t, conf, nil, "cat", "/ec/blob.bin").stdout; !bytes.Equal(out, blob) {
		t.Errorf("erasure-coded blob after restart: %d bytes %s, want %s", len(out), sum(out), sum(blob))
	}
	mustRun(t, conf, bytes.NewReader(hello2), "put", "-", "/ec/after.txt")
	if out := mustRun(t, conf, nil, "cat", "/ec/after.txt").stdout; !bytes.Equal(out, hello2) {
		t.Errorf("cat of an erasure-coded file written after restart = %q", out)
	}
	if st, want := status(t, conf), int64(strings.Count(wantKeep, "\n")+4); st.Files != want {
		t.Errorf("status after restart: %d files, want %d (/keep, after, greeting, two in /ec)", st.Files, want)
	}
	if code := c2.proc.stop(t, 15*time.Second); code != 0 {
		t.Errorf("second sluice up exited %d after SIGTERM", code)
	}
}

func checkLocal(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: %d bytes %s, want %d bytes %s", path, len(got), sum(got), len(want), sum(want))
	}
}

func values[K comparable, V any](m map[K]V) []V {
	var out []V
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

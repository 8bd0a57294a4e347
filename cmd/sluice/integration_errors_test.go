package main

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
)

// TestCLIErrors checks that failures exit non-zero with one clear line on
// stderr that names the problem.
func TestCLIErrors(t *testing.T) {
	base := baseDir(t)
	c := startUp(t, filepath.Join(base, "data"), 3)
	conf := c.conf
	mustRun(t, conf, nil, "mkdir", "/dir")
	mustRun(t, conf, bytes.NewReader([]byte("x")), "put", "-", "/dir/file")

	t.Run("missing path", func(t *testing.T) {
		ldir := filepath.Join(base, "getdir")
		os.Mkdir(ldir, 0o755)
		mustFail(t, conf, []string{`ENOENT`, `/missing`}, "get", "/missing", filepath.Join(ldir, "out"))
		if ents, _ := os.ReadDir(ldir); len(ents) != 0 {
			t.Errorf("failed get left %d local files (%v)", len(ents), ents[0].Name())
		}
		r := mustFail(t, conf, []string{`ENOENT`, `/missing`}, "get", "/missing", "-")
		if len(r.stdout) != 0 {
			t.Errorf("failed get - wrote %q to stdout", r.stdout)
		}
		mustFail(t, conf, []string{`ENOENT`, `/missing`}, "cat", "/missing")
		mustFail(t, conf, []string{`ENOENT`, `/dir/missing`}, "stat", "/dir/missing")
		mustFail(t, conf, []string{`ENOENT`, `/missing`}, "ls", "/missing")
		mustFail(t, conf, []string{`ENOENT`, `/missing`}, "rm", "/missing")
		mustFail(t, conf, []string{`ENOENT`, `/missing`}, "mv", "/missing", "/elsewhere")
		mustFail(t, conf, []string{`ENOENT`}, "mkdir", "/no/such/parent")
		mustFail(t, conf, []string{`ENOENT`}, "policy", "get", "/missing")
		r = run(t, conf, bytes.NewReader([]byte("data")), "put", "-", "/nodir/x")
		if r.code == 0 || !strings.Contains(r.stderr, "ENOENT") {
			t.Errorf("put into a missing directory: %s", r)
		}
		mustFail(t, conf, []string{`no such file`}, "put", filepath.Join(base, "no-such-local-file"), "/x")
		// A missing cat argument stops the command but what came before
		// was printed.
		r = mustFail(t, conf, []string{`ENOENT`, `/missing`}, "cat", "/dir/file", "/missing")
		if string(r.stdout) != "x" {
			t.Errorf("cat /dir/file /missing printed %q, want the first file", r.stdout)
		}
	})

	t.Run("directories", func(t *testing.T) {
		mustFail(t, conf, []string{`EEXIST`, `/dir`}, "mkdir", "/dir")
		mustRun(t, conf, nil, "mkdir", "-p", "/dir")
		mustFail(t, conf, []string{`ENOTDIR`, `/dir/file`}, "mkdir", "-p", "/dir/file")
		mustFail(t, conf, []string{`ENOTEMPTY`, `/dir`}, "rm", "/dir")
		if out := string(mustRun(t, conf, nil, "ls", "/dir").stdout); out != "file\n" {
			t.Errorf("after refused rm, ls /dir = %q", out)
		}
		mustFail(t, conf, []string{`EISDIR|is a directory`}, "cat", "/dir")
		mustFail(t, conf, []string{`EISDIR|is a directory`}, "get", "/dir", "-")
		r := run(t, conf, bytes.NewReader([]byte("data")), "put", "-", "/dir")
		if r.code == 0 || !strings.Contains(r.stderr, "is a directory") {
			t.Errorf("put - onto a directory: %s", r)
		}
		mustFail(t, conf, []string{`EINVAL|ENOTDIR|ENOTEMPTY|EISDIR`}, "mv", "/dir", "/dir/file")
	})

	t.Run("name too long", func(t *testing.T) {
		long := "/" + strings.Repeat("a", 256)
		mustFail(t, conf, []string{`ENAMETOOLONG`, `256`}, "mkdir", long)
		r := run(t, conf, bytes.NewReader([]byte("data")), "put", "-", "/"+strings.Repeat("b", 256))
		if r.code == 0 || !strings.Contains(r.stderr, "ENAMETOOLONG") || !strings.Contains(r.stderr, "put /bbbb") {
			t.Errorf("put to a 256-byte name: %s", r)
		}
		if r.code != 0 && strings.Contains(r.stderr, ".sluice-put-") {
			t.Logf("rough edge: the put error names the hidden temporary file: %q", r.stderr)
		}
		// No temporary file is left behind in the root.
		if out := string(mustRun(t, conf, nil, "ls", "/").stdout); strings.Contains(out, "sluice-put") {
			t.Errorf("failed put left a temporary file: ls / = %q", out)
		}
		// 255 bytes is fine.
		ok := "/" + strings.Repeat("c", 255)
		mustRun(t, conf, bytes.NewReader([]byte("fits")), "put", "-", ok)
		if out := string(mustRun(t, conf, nil, "cat", ok).stdout); out != "fits" {
			t.Errorf("cat of a 255-byte name = %q", out)
		}
		mustRun(t, conf, nil, "rm", ok)
		// A path longer than 4096 bytes.
		deep := strings.Repeat("/"+strings.Repeat("d", 200), 21)
		mustFail(t, conf, []string{`ENAMETOOLONG`}, "stat", deep)
	})

	t.Run("policy larger than the cluster", func(t *testing.T) {
		mustRun(t, conf, nil, "policy", "set", "/dir", "--replicas", "2")
		r := mustFail(t, conf, []string{`\b5\b`, `\b3\b`, `--replicas|replicas`}, "policy", "set", "/dir", "--replicas", "5")
		t.Logf("policy set --replicas 5: %s", strings.TrimSpace(r.stderr))
		if out := string(mustRun(t, conf, nil, "policy", "get", "/dir").stdout); !strings.Contains(out, "replicas=2") {
			t.Errorf("refused policy set changed the policy: %q", out)
		}
		mustFail(t, conf, []string{`EINVAL`, `17`}, "policy", "set", "/dir", "--replicas", "17")
		mustFail(t, conf, []string{`EINVAL`, `\b0\b`}, "policy", "set", "/dir", "--replicas", "0")
		mustFail(t, conf, []string{`--replicas is required`}, "policy", "set", "/dir")
		mustFail(t, conf, []string{`strategy`, `"pbt"`, `ring, tree, flat, host-ring, host-tree`}, "policy", "set", "/dir", "--replicas", "2", "--strategy", "pbt")
		// Every known strategy is accepted and reported back.
		for _, s := range []string{"tree", "flat", "host-ring", "host-tree", "ring"} {
			mustRun(t, conf, nil, "policy", "set", "/dir", "--replicas", "2", "--strategy", s)
			if out := string(mustRun(t, conf, nil, "policy", "get", "/dir").stdout); !strings.Contains(out, "strategy="+s+" ") {
				t.Errorf("policy get after setting %s: %q", s, out)
			}
		}
	})

	t.Run("link emulation out of range", func(t *testing.T) {
		dir := t.TempDir()
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{[]string{"up", "--data", dir, "--listen", "127.0.0.1:0", "--link-rate", "1bit"}, []string{`link rate`, `1 Mbit/s`}},
			{[]string{"up", "--data", dir, "--listen", "127.0.0.1:0", "--link-rate", "10furlongs"}, []string{`furlongs`}},
			{[]string{"up", "--data", dir, "--listen", "127.0.0.1:0", "--link-delay", "3s"}, []string{`link delay`, `3s`}},
			{[]string{"node", "--data", dir, "--meta", "127.0.0.1:1", "--join", "x", "--link-rate", "2Tbit"}, []string{`link rate`}},
		} {
			mustFail(t, conf, tc.want, tc.args...)
		}
	})

	t.Run("wrong credential", func(t *testing.T) {
		cc, err := config.Load(conf)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := hex.DecodeString(cc.Credential)
		b[0] ^= 1
		cc.Credential = hex.EncodeToString(b)
		bad := filepath.Join(base, "bad.conf")
		if err := config.Save(bad, cc); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"ls", "/"}, {"cat", "/dir/file"}, {"status"}, {"mkdir", "/intruder"}} {
			mustFail(t, bad, []string{`EAUTH`, `client config`}, args...)
		}
		mustFail(t, bad, []string{`EAUTH`}, "put", filepath.Join(base, "bad.conf"), "/intruder.conf")
		if out := string(mustRun(t, conf, nil, "ls", "/").stdout); strings.Contains(out, "intruder") {
			t.Errorf("a client with a wrong credential changed the namespace: %q", out)
		}
		// Another id with the right credential of id 1 is refused too.
		cc2, _ := config.Load(conf)
		cc2.ClientID++
		if err := config.Save(bad, cc2); err != nil {
			t.Fatal(err)
		}
		mustFail(t, bad, []string{`EAUTH`}, "ls", "/")
	})

	t.Run("bad client config", func(t *testing.T) {
		mustFail(t, filepath.Join(base, "missing.conf"), []string{`reading client config`, `SLUICE_CONF`}, "ls", "/")
		garbage := filepath.Join(base, "garbage.conf")
		os.WriteFile(garbage, []byte("{not json"), 0o600)
		mustFail(t, garbage, []string{`parsing client config`}, "ls", "/")
		empty := filepath.Join(base, "empty.conf")
		os.WriteFile(empty, []byte("{}"), 0o600)
		mustFail(t, empty, []string{`missing meta address or credential`}, "ls", "/")
	})

	// The cluster is unharmed by all of the above.
	if out := string(mustRun(t, conf, nil, "cat", "/dir/file").stdout); out != "x" {
		t.Errorf("cat /dir/file = %q", out)
	}
	st := status(t, conf)
	if len(st.Nodes) != 3 {
		t.Errorf("status: %d nodes", len(st.Nodes))
	}

	// Last, as it may destroy the namespace: rm -r / must either refuse
	// and leave everything alone, or succeed and empty the root. It must
	// not delete everything and then report a failure.
	t.Run("rm -r of the root", func(t *testing.T) {
		mustRun(t, conf, nil, "mkdir", "-p", "/precious/deep")
		before := string(mustRun(t, conf, nil, "ls", "/").stdout)
		r := run(t, conf, nil, "rm", "-r", "/")
		after := string(mustRun(t, conf, nil, "ls", "/").stdout)
		t.Logf("rm -r /: exit %d, stderr %q; ls / before %q, after %q", r.code, strings.TrimSpace(r.stderr), before, after)
		// Like GNU rm, removing the root is refused before anything goes.
		if r.code == 0 || !strings.Contains(r.stderr, "refusing to remove the root") {
			t.Errorf("rm -r /: exit %d, stderr %q; want a refusal", r.code, r.stderr)
		}
		if after != before {
			t.Errorf("rm -r / removed the root's contents: ls / was %q, is %q", before, after)
		}
	})
}

// TestCLIDeadMeta checks the command TestMain started against a meta
// address nobody listens on. It is parallel so that it runs after the
// sequential tests, by when the command's ~15 s of retries are over.
func TestCLIDeadMeta(t *testing.T) {
	t.Parallel()
	// Started by TestMain so its retries overlap the other tests.
	select {
	case <-deadMeta.done:
	case <-time.After(45 * time.Second):
		t.Fatalf("a command against a dead meta had not given up after 45 s (hung?)")
	}
	msg := deadMeta.stderr.String()
	if deadMeta.exitCode == 0 {
		t.Errorf("command against a dead meta exited 0")
	}
	for _, want := range []string{"connection refused", "sluice up"} {
		if !strings.Contains(msg, want) {
			t.Errorf("dead meta: stderr %q does not mention %q", msg, want)
		}
	}
	t.Logf("dead meta: gave up after %s with %q", deadMeta.elapsed.Round(100*time.Millisecond), strings.TrimSpace(msg))
	// Meta never answered this client, so it must not ride out the long
	// restart window: a wrong address fails in seconds (the bound is loose
	// for a loaded machine; the client gives up after about 2 s).
	if deadMeta.elapsed > 10*time.Second {
		t.Errorf("dead meta: took %s to give up", deadMeta.elapsed)
	}
}

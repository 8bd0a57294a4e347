package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeConfig writes a daemon config file (private, as one holding a
// join token must be).
func writeConfig(t *testing.T, path string, lines ...string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDaemonConfigFile runs meta and a node from config files (issue 17,
// item 2): file values are used, a flag on the command line overrides
// the file's value for it, and a key that names no flag is refused.
func TestDaemonConfigFile(t *testing.T) {
	dir := baseDir(t)
	// The files name an address that is taken: were the command line's
	// --listen not to win, the daemons could not start.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	metaConf := writeConfig(t, filepath.Join(dir, "meta.toml"),
		"# sluice meta",
		fmt.Sprintf("data = %q", filepath.Join(dir, "meta")),
		fmt.Sprintf("listen = %q", taken.Addr()),
		`node-timeout = "2s"`,
		"default-replicas = 1",
		`tls-san = ["meta.example"]`)
	p := startProc(t, dir, "meta", "meta", "--config", metaConf, "--listen", "127.0.0.1:0")
	metaAddr := p.waitLine(t, reMetaListen, 20*time.Second)[1]
	m := p.waitLine(t, reMetaConf, 5*time.Second)
	if want := filepath.Join(dir, "meta", "cluster.secret"); m[1] != want {
		t.Errorf("meta's data directory: secret at %s, want %s (from the file)", m[1], want)
	}
	if metaAddr == taken.Addr().String() {
		t.Fatalf("meta listens on the file's address %s, not the command line's", metaAddr)
	}
	conf := m[2]

	token := strings.TrimSpace(string(mustRun(t, conf, nil, "join-token", "--ttl", "5m").stdout))
	nodeConf := writeConfig(t, filepath.Join(dir, "node.toml"),
		fmt.Sprintf("data = %q", filepath.Join(dir, "n1")),
		fmt.Sprintf("meta = %q", metaAddr),
		fmt.Sprintf("join = %q", token),
		fmt.Sprintf("listen = %q", taken.Addr()),
		`domain = "rack-from-file"`,
		`scrub-interval = "1h"`)
	np := startProc(t, dir, "n1", "node", "--config", nodeConf, "--listen", "127.0.0.1:0", "--domain", "rack-a")
	nm := np.waitLine(t, reNodeListen, 20*time.Second)
	if strings.Contains(np.stderrText(), "visible to other users") {
		t.Errorf("a join token from the config file was warned about as if on the command line")
	}
	st := waitNodesUp(t, conf, 1, 15*time.Second)
	n := st.Nodes[0]
	if n.ID != nodeID(t, nm[1]) || n.Addr == taken.Addr().String() || n.Domain != "rack-a" {
		t.Errorf("node %v at %s in domain %q: want the command line's listen address and domain rack-a", n.ID, n.Addr, n.Domain)
	}
	mustRun(t, conf, strings.NewReader("hello"), "put", "-", "/f")
	if got := string(mustRun(t, conf, nil, "cat", "/f").stdout); got != "hello" {
		t.Errorf("cat /f = %q", got)
	}

	// A typo is an error naming the key, the file and the line, for
	// every daemon, before it does anything.
	bad := writeConfig(t, filepath.Join(dir, "bad.toml"),
		`log-level = "debug"`,
		`lisen = "0.0.0.0:7700"`)
	for _, args := range [][]string{{"meta"}, {"node"}, {"mount", dir}, {"nfs"}, {"up"}} {
		mustFail(t, conf, []string{`bad\.toml:2: unknown key "lisen"`}, append(args, "--config", bad)...)
	}
	// A wrong type names the key.
	mustFail(t, conf, []string{`key "node-timeout" must be a duration string`},
		"meta", "--config", writeConfig(t, filepath.Join(dir, "type.toml"), "node-timeout = 30"))
	// A file's values meet the checks the command line's do.
	mustFail(t, conf, []string{`--id 0: node ids go from 1`},
		"node", "--data", filepath.Join(dir, "n9"), "--meta", "127.0.0.1:1", "--config", writeConfig(t, filepath.Join(dir, "id.toml"), "id = 0"))
	mustFail(t, conf, []string{`--op-timeout -1s: must be positive`},
		"nfs", "--config", writeConfig(t, filepath.Join(dir, "op.toml"), `op-timeout = "-1s"`))
}

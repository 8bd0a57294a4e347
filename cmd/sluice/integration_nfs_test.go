package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

var (
	reNFSListen       = regexp.MustCompile(`^sluice: NFSv3 gateway listening on (\S+) `)
	reNFSFabricListen = regexp.MustCompile(`^sluice: NFSv3 over the fabric listening on (\S+)`)
)

// nfsGateway starts `sluice nfs` for a cluster, with extra arguments
// (exports), and returns its TCP address and its fabric transport's.
func nfsGateway(t *testing.T, conf string, extra ...string) (string, string) {
	t.Helper()
	base := filepath.Dir(filepath.Dir(conf))
	args := append([]string{"nfs", "--listen", "127.0.0.1:0", "--fabric-listen", "127.0.0.1:0", "--conf", conf}, extra...)
	p := startDaemon(t, base, "nfs-"+fmt.Sprint(time.Now().UnixNano()), args...)
	r := p.waitReady(t, 20*time.Second)
	if got := p.waitLine(t, reNFSListen, 5*time.Second)[1]; got != r.NFS {
		t.Errorf("the gateway printed %s, its ready file %s", got, r.NFS)
	}
	if got := p.waitLine(t, reNFSFabricListen, 5*time.Second)[1]; got != r.NFSFabric {
		t.Errorf("the gateway printed fabric address %s, its ready file %s", got, r.NFSFabric)
	}
	return r.NFS, r.NFSFabric
}

// requireLibnfs skips when the libnfs command-line client is missing
// (scripts/test installs libnfs-utils).
func requireLibnfs(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"nfs-ls", "nfs-cp", "nfs-cat"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (apt-get install libnfs-utils)", tool)
		}
	}
}

// nfsURL is a libnfs URL for path on the gateway at addr, NFS and MOUNT
// on the one port, as root. Run as root, libnfs binds a reserved source
// port (it tries 512-1023 whenever it may), so a secure export takes its
// calls; a root_squash export makes them nobody's.
func nfsURL(addr, path string) string {
	host, port, _ := strings.Cut(addr, ":")
	return fmt.Sprintf("nfs://%s%s?version=3&nfsport=%s&mountport=%s&uid=0&gid=0", host, path, port, port)
}

func libnfs(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, tail(out.String(), 20), tail(errb.String(), 20))
		}
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("%s: timed out", strings.Join(args, " "))
	}
	return out.Bytes()
}

// chmodPath sets the mode of path, straight at meta (the CLI has no
// chmod).
func chmodPath(t *testing.T, conf, path string, mode uint32) {
	t.Helper()
	mc := metaClient(t, conf)
	var r metaapi.AttrResp
	if err := mc.Call(context.Background(), metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(path)}, &r); err != nil {
		t.Fatal(err)
	}
	if err := mc.Call(context.Background(), metaapi.OpSetAttr, metaapi.SetAttrReq{Ino: r.Attr.Ino, Mode: &mode}, nil); err != nil {
		t.Fatalf("chmod %o %s: %v", mode, path, err)
	}
}

// TestNFSWithLibnfs drives the gateway with a real NFS client (libnfs's
// nfs-cp, nfs-cat, nfs-ls): files of 0 bytes to 256 MiB copied in and
// out, compared with what the Sluice CLI reads, and a large directory
// listed whole. The gateway has the default export (root squashed,
// secure): the clients run as root, from reserved ports, and write as
// nobody into a directory anyone may write.
func TestNFSWithLibnfs(t *testing.T) {
	requireLibnfs(t)
	c := startUp(t, filepath.Join(baseDir(t), "data"), 3)
	addr, faddr := nfsGateway(t, c.conf)
	local := filepath.Join(baseDir(t), "local")
	if err := os.MkdirAll(local, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c.conf, nil, "mkdir", "-p", "/nfs/in", "/nfs/out", "/nfs/big")
	chmodPath(t, c.conf, "/nfs/in", 0o777)
	sizes := []int{0, 1, 4095, 4096, 1<<20 + 17, 8 << 20}
	if !testing.Short() {
		sizes = append(sizes, 256<<20)
	}
	for _, n := range sizes {
		data := randomBytes(t, n)
		// In through NFS, out through the CLI.
		src := filepath.Join(local, fmt.Sprintf("src-%d", n))
		if err := os.WriteFile(src, data, 0o644); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		libnfs(t, "nfs-cp", src, nfsURL(addr, fmt.Sprintf("/nfs/in/f%d", n)))
		in := time.Since(start)
		if got := mustRun(t, c.conf, nil, "cat", fmt.Sprintf("/nfs/in/f%d", n)).stdout; !bytes.Equal(got, data) {
			t.Fatalf("%d bytes copied in over NFS: the CLI reads %d bytes that differ", n, len(got))
		}
		// In through the CLI, out through NFS (nfs-cp to a file and nfs-cat).
		mustRun(t, c.conf, bytes.NewReader(data), "put", "-", fmt.Sprintf("/nfs/out/f%d", n))
		dst := filepath.Join(local, fmt.Sprintf("dst-%d", n))
		start = time.Now()
		libnfs(t, "nfs-cp", nfsURL(addr, fmt.Sprintf("/nfs/out/f%d", n)), dst)
		out := time.Since(start)
		if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes copied out over NFS differ (%d bytes, %v)", n, len(got), err)
		}
		if n <= 8<<20 {
			if got := libnfs(t, "nfs-cat", nfsURL(addr, fmt.Sprintf("/nfs/out/f%d", n))); !bytes.Equal(got, data) {
				t.Fatalf("nfs-cat of %d bytes differs (%d bytes)", n, len(got))
			}
		}
		// Sluice's own NFS client, both ways, with small reads and deep
		// read-ahead: what libnfs wrote it reads, what it writes the CLI
		// reads.
		if got := mustRun(t, c.conf, nil, "nfs-get", "--server", addr, "--rsize", "65536", "--readahead", "8", fmt.Sprintf("/nfs/in/f%d", n), "-").stdout; !bytes.Equal(got, data) {
			t.Fatalf("sluice nfs-get of %d bytes differs (%d bytes)", n, len(got))
		}
		mustRun(t, c.conf, nil, "nfs-put", "--server", addr, "--wsize", "262144", src, fmt.Sprintf("/nfs/in/g%d", n))
		if got := mustRun(t, c.conf, nil, "cat", fmt.Sprintf("/nfs/in/g%d", n)).stdout; !bytes.Equal(got, data) {
			t.Fatalf("sluice nfs-put of %d bytes: the CLI reads %d bytes that differ", n, len(got))
		}
		// The same over the fabric transport (RPC with chunks pulled by
		// one-sided READs): deep read-ahead beyond the credits, and
		// WRITEs whose data the gateway pulls.
		stats := filepath.Join(local, "stats.json")
		if got := mustRun(t, c.conf, nil, "nfs-get", "--transport", "fabric", "--server", faddr, "--rsize", "65536", "--readahead", "40",
			"--stats-json", stats, fmt.Sprintf("/nfs/in/f%d", n), "-").stdout; !bytes.Equal(got, data) {
			t.Fatalf("sluice nfs-get over the fabric of %d bytes differs (%d bytes)", n, len(got))
		}
		checkFabricStats(t, stats, n)
		mustRun(t, c.conf, nil, "nfs-put", "--transport", "fabric", "--server", faddr, src, fmt.Sprintf("/nfs/in/h%d", n))
		if got := mustRun(t, c.conf, nil, "cat", fmt.Sprintf("/nfs/in/h%d", n)).stdout; !bytes.Equal(got, data) {
			t.Fatalf("sluice nfs-put over the fabric of %d bytes: the CLI reads %d bytes that differ", n, len(got))
		}
		t.Logf("%d bytes: in %s, out %s", n, in.Round(time.Millisecond), out.Round(time.Millisecond))
	}
	// A large directory, listed whole (several READDIRPLUS replies).
	const files = 1500
	var want []string
	for i := range files {
		want = append(want, fmt.Sprintf("entry-with-a-longish-name-%05d", i))
	}
	mkMany(t, c.conf, "/nfs/big", want)
	out := string(libnfs(t, "nfs-ls", nfsURL(addr, "/nfs/big")))
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			got = append(got, f[len(f)-1])
		}
	}
	got = slices.DeleteFunc(got, func(s string) bool { return s == "." || s == ".." })
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("nfs-ls listed %d entries, want %d (first lines: %q)", len(got), len(want), tail(out, 5))
	}
}

// checkFabricStats checks that a read of n bytes over the fabric moved
// its data by one-sided pulls into the client's buffers, not inline.
func checkFabricStats(t *testing.T, file string, n int) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Bytes        int64
		ClientFabric struct{ PulledBytes, Copied int64 } `json:"client_fabric"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.Bytes != int64(n) {
		t.Fatalf("fabric read: %d bytes reported, want %d", st.Bytes, n)
	}
	// READs of whole 64 KiB pieces are pulled; a tail under 1 KiB (the
	// chunk threshold) comes inline.
	want := int64(n - n%65536)
	if n%65536 >= 1024 {
		want = int64(n)
	}
	if st.ClientFabric.PulledBytes != want {
		t.Fatalf("fabric read of %d bytes pulled %d, want %d", n, st.ClientFabric.PulledBytes, want)
	}
	if n >= 1<<20 && st.ClientFabric.Copied > int64(n)/50 {
		t.Fatalf("fabric read of %d bytes copied %d bytes in the client", n, st.ClientFabric.Copied)
	}
}

// mkMany creates empty files named names in directory dir, straight at
// meta (a process per file would take minutes).
func mkMany(t *testing.T, conf, dir string, names []string) {
	t.Helper()
	mc := metaClient(t, conf)
	ctx := context.Background()
	var d metaapi.AttrResp
	if err := mc.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(dir)}, &d); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		req := metaapi.CreateReq{Parent: d.Attr.Ino, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Mode: 0o644, Exclusive: true}
		if err := mc.Call(ctx, metaapi.OpCreate, req, nil); err != nil {
			t.Fatalf("creating %s/%s: %v", dir, name, err)
		}
	}
}

// TestNFSFabricTuning: the fabric transport with tiny receive buffers
// and a high chunk threshold, so READ replies under the threshold come
// as long messages (the whole reply pulled from offset 0) and larger
// ones as chunks; files read and written through it are intact.
func TestNFSFabricTuning(t *testing.T) {
	c := startUp(t, filepath.Join(baseDir(t), "data"), 1)
	base := filepath.Dir(filepath.Dir(c.conf))
	p := startProc(t, base, "nfs-tuned", "nfs", "--listen", "127.0.0.1:0", "--fabric-listen", "127.0.0.1:0",
		"--rpc-buffer-size", "1024", "--rpc-buffers", "4", "--chunk-min", "65536", "--conf", c.conf)
	p.waitLine(t, reNFSListen, 20*time.Second)
	faddr := p.waitLine(t, reNFSFabricListen, 20*time.Second)[1]
	local := filepath.Join(baseDir(t), "local")
	if err := os.MkdirAll(local, 0o755); err != nil {
		t.Fatal(err)
	}
	data := randomBytes(t, 3<<20+5)
	src := filepath.Join(local, "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	client := []string{"--transport", "fabric", "--server", faddr, "--rpc-buffer-size", "1024", "--rpc-buffers", "8", "--chunk-min", "2048"}
	// Root is squashed (the default export): it writes as nobody, here.
	mustRun(t, c.conf, nil, "mkdir", "/t")
	chmodPath(t, c.conf, "/t", 0o777)
	mustRun(t, c.conf, nil, append(append([]string{"nfs-put"}, client...), "--wsize", "16384", src, "/t/f")...)
	if got := mustRun(t, c.conf, nil, "cat", "/t/f").stdout; !bytes.Equal(got, data) {
		t.Fatal("written over the tuned fabric transport: the CLI reads other bytes")
	}
	for _, rsize := range []string{"16384", "65536"} {
		stats := filepath.Join(local, "stats-"+rsize)
		got := mustRun(t, c.conf, nil, append(append([]string{"nfs-get"}, client...), "--rsize", rsize, "--readahead", "6", "--stats-json", stats, "/t/f", "-")...).stdout
		if !bytes.Equal(got, data) {
			t.Fatalf("read with %s-byte READs over the tuned fabric transport: other bytes", rsize)
		}
		b, err := os.ReadFile(stats)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			ClientFabric struct{ PulledBytes, LongMessages int64 } `json:"client_fabric"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		// 16 KiB READs are under the threshold: their replies exceed the
		// 1 KiB buffers and come as long messages. 64 KiB ones are chunks.
		if rsize == "16384" && st.ClientFabric.LongMessages < int64(len(data)/16384) {
			t.Fatalf("16 KiB READs: %d long messages", st.ClientFabric.LongMessages)
		}
		if rsize == "65536" && st.ClientFabric.PulledBytes < int64(len(data)-len(data)%65536) {
			t.Fatalf("64 KiB READs: %d bytes pulled", st.ClientFabric.PulledBytes)
		}
	}
	if r := run(t, c.conf, nil, "nfs-get", "--transport", "fabric", "--server", faddr, "--chunk-min", "0", "/t/f", "-"); r.code == 0 || !strings.Contains(r.stderr, "chunk-min") {
		t.Fatalf("--chunk-min 0 accepted: %d %q", r.code, r.stderr)
	}
}

// TestNFSClientErrorsNamed: nfs-get says what went wrong in words — a
// missing file, a directory not exported, an address that is no NFS
// gateway — not a bare status number or "EOF".
func TestNFSClientErrorsNamed(t *testing.T) {
	c := startMeta(t, baseDir(t))
	c.startNode(t, "n1")
	waitNodesUp(t, c.conf, 1, 15*time.Second)
	addr, _ := nfsGateway(t, c.conf)
	mustFail(t, c.conf, []string{`no such file or directory`}, "nfs-get", "--server", addr, "/missing", "-")
	mustFail(t, c.conf, []string{`no such directory under the export`}, "nfs-get", "--server", addr, "--mount", "/nope", "/f", "-")
	mustFail(t, c.conf, []string{`is this the address of an NFS gateway`}, "nfs-get", "--server", c.meta, "/f", "-")
}

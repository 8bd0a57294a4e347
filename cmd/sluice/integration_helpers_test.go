package main

// Helpers for the integration tests in this directory: they build the
// sluice binary once, start real meta, storage node and `sluice up`
// processes on loopback, and run CLI commands against them.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/launch"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
	"github.com/sluicefs/sluice/internal/readyfile"
)

// sluiceBin is the binary built by TestMain.
var sluiceBin string

// deadMeta is a CLI command pointed at a meta address nobody listens on.
// The meta client retries unreachable meta for about 15 s, so TestMain
// starts it at once and TestCLIErrors only collects the result: the wait
// overlaps the other tests instead of adding to the run time.
var deadMeta struct {
	conf     string
	done     chan struct{}
	stderr   bytes.Buffer
	exitCode int
	elapsed  time.Duration
	err      error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := testMain(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration tests:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func testMain(m *testing.M) (int, error) {
	tmp, err := os.MkdirTemp("", "sluice-bin-*")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	sluiceBin = filepath.Join(tmp, "sluice")
	args := []string{"build", "-o", sluiceBin}
	if raceEnabled {
		// Child processes are race-checked too; childCheck fails the test
		// on any report in their stderr.
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return 0, fmt.Errorf("building sluice: %w", err)
	}
	kill, err := startDeadMetaProbe(tmp)
	if err != nil {
		return 0, err
	}
	defer kill()
	return m.Run(), nil
}

func startDeadMetaProbe(tmp string) (kill func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more: connections are refused
	deadMeta.conf = filepath.Join(tmp, "dead-client.conf")
	ca, err := pki.LoadOrCreateCA(tmp) // any CA: nothing answers to check it
	if err != nil {
		return nil, err
	}
	if err := config.Save(deadMeta.conf, config.ClientConf{Meta: addr, ClientID: 1, Credential: strings.Repeat("ab", 32), CA: string(ca.CertPEM)}); err != nil {
		return nil, err
	}
	deadMeta.done = make(chan struct{})
	cmd := exec.Command(sluiceBin, "--conf", deadMeta.conf, "ls", "/")
	cmd.Stderr = &deadMeta.stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		deadMeta.err = cmd.Wait()
		deadMeta.elapsed = time.Since(start)
		deadMeta.exitCode = cmd.ProcessState.ExitCode()
		close(deadMeta.done)
	}()
	return func() {
		cmd.Process.Kill()
		<-deadMeta.done
	}, nil
}

// ---- directories ----

// baseDir returns a fresh directory for a test's cluster, in memory when
// /dev/shm exists.
func baseDir(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "sluice-it-*")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// ---- child processes ----

// lineBuffer collects a child's stdout line by line.
type lineBuffer struct {
	mu     sync.Mutex
	buf    []byte
	lines  []string
	notify chan struct{}
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.buf = append(b.buf, p...)
	for {
		i := bytes.IndexByte(b.buf, '\n')
		if i < 0 {
			break
		}
		b.lines = append(b.lines, string(b.buf[:i]))
		b.buf = b.buf[i+1:]
	}
	b.mu.Unlock()
	select {
	case b.notify <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (b *lineBuffer) snapshot() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines...)
}

// proc is a long-running sluice process (meta, node or up).
type proc struct {
	name       string
	lp         *launch.Proc
	cmd        *exec.Cmd // lp's
	out        *lineBuffer
	stderrPath string
	done       chan struct{}
	waitErr    error
}

// startProc starts sluice with args; its stderr goes to logDir/name.stderr.
// The process is killed when the test ends.
func startProc(t *testing.T, logDir, name string, args ...string) *proc {
	t.Helper()
	return startProcWith(t, logDir, name, nil, args...)
}

// startProcWith is startProc with the child's stdin (nil: /dev/null).
func startProcWith(t *testing.T, logDir, name string, stdin *os.File, args ...string) *proc {
	t.Helper()
	return startCmd(t, logDir, name, stdin, sluiceBin, args...)
}

// startCmd is startProcWith for any program (sluice under `ip netns
// exec`, say).
func startCmd(t *testing.T, logDir, name string, stdin *os.File, bin string, args ...string) *proc {
	t.Helper()
	return startSpec(t, logDir, name, launch.Spec{Path: bin, Args: args, Stdin: stdin})
}

// startDaemon is startProc for a daemon (meta, node, up, nfs, mount):
// it is given --ready-file, which waitReady waits for.
func startDaemon(t *testing.T, logDir, name string, args ...string) *proc {
	t.Helper()
	return startSpec(t, logDir, name, launch.Spec{Path: sluiceBin, Args: args, ReadyFile: filepath.Join(logDir, name+".ready")})
}

// startSpec starts spec with stdout into p.out and stderr into
// logDir/name.stderr.
func startSpec(t *testing.T, logDir, name string, spec launch.Spec) *proc {
	t.Helper()
	p := &proc{name: name, out: &lineBuffer{notify: make(chan struct{}, 1)}, done: make(chan struct{})}
	p.stderrPath = filepath.Join(logDir, name+".stderr")
	ef, err := os.OpenFile(p.stderrPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	spec.Name, spec.Stdout, spec.Stderr = name, p.out, ef
	if p.lp, err = launch.Start(spec); err != nil {
		ef.Close()
		t.Fatal(err)
	}
	p.cmd = p.lp.Cmd()
	go func() {
		p.waitErr = p.lp.Err()
		ef.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		childCheck(t, p)
		if t.Failed() {
			t.Logf("---- %s stdout ----\n%s", name, strings.Join(p.out.snapshot(), "\n"))
			t.Logf("---- %s stderr (tail) ----\n%s", name, tail(p.stderrText(), 40))
		}
	})
	return p
}

// waitReady waits for a daemon's ready file (see startDaemon).
func (p *proc) waitReady(t *testing.T, timeout time.Duration) readyfile.Info {
	t.Helper()
	info, err := p.lp.WaitReady(context.Background(), timeout)
	if err != nil {
		t.Fatalf("%v\nstdout so far:\n%s", err, strings.Join(p.out.snapshot(), "\n"))
	}
	return info
}

// childCheck fails t if a child reported a data race or a panic.
func childCheck(t *testing.T, p *proc) {
	t.Helper()
	text := p.stderrText()
	for _, bad := range []string{"WARNING: DATA RACE", "panic: ", "fatal error: "} {
		if strings.Contains(text, bad) {
			t.Errorf("%s: stderr contains %q:\n%s", p.name, bad, tail(text, 60))
		}
	}
}

func (p *proc) stderrText() string {
	b, _ := os.ReadFile(p.stderrPath)
	return string(b)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL (if still running) and waits for the exit.
func (p *proc) kill() {
	if !p.exited() {
		p.cmd.Process.Kill()
	}
	<-p.done
}

// stop sends SIGTERM and waits up to timeout for the exit; it returns the
// exit code (-1 if the process had to be killed).
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("%s: SIGTERM: %v", p.name, err)
	}
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Errorf("%s did not exit within %s of SIGTERM", p.name, timeout)
		p.kill()
		return -1
	}
}

// waitLine waits for a stdout line matching re and returns its submatches.
func (p *proc) waitLine(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	seen := 0
	for {
		lines := p.out.snapshot()
		for _, l := range lines[seen:] {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		seen = len(lines)
		select {
		case <-p.out.notify:
		case <-p.done:
			// Drain anything written just before the exit.
			for _, l := range p.out.snapshot()[seen:] {
				if m := re.FindStringSubmatch(l); m != nil {
					return m
				}
			}
			t.Fatalf("%s exited (%v) before printing a line matching %q; stderr:\n%s", p.name, p.waitErr, re, tail(p.stderrText(), 30))
		case <-deadline:
			t.Fatalf("%s printed no line matching %q within %s; stdout so far:\n%s\nstderr:\n%s",
				p.name, re, timeout, strings.Join(p.out.snapshot(), "\n"), tail(p.stderrText(), 30))
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---- CLI commands ----

// result is a finished CLI command.
type result struct {
	args   []string
	stdout []byte
	stderr string
	code   int
}

func (r result) String() string {
	return fmt.Sprintf("sluice %s: exit %d, stderr %q", strings.Join(r.args, " "), r.code, r.stderr)
}

// cliTimeout bounds every CLI command; none should come near it.
const cliTimeout = 60 * time.Second

// run runs `sluice --conf conf args...` with stdin (may be nil).
func run(t *testing.T, conf string, stdin io.Reader, args ...string) result {
	t.Helper()
	all := append([]string{"--conf", conf}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBin, all...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, stdin
	err := cmd.Run()
	r := result{args: args, stdout: out.Bytes(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		t.Fatalf("sluice %s: still running after %s (hung?); stderr so far: %s", strings.Join(args, " "), cliTimeout, errb.String())
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("sluice %s: %v", strings.Join(args, " "), err)
	}
	if strings.Contains(r.stderr, "WARNING: DATA RACE") || strings.Contains(r.stderr, "panic: ") {
		t.Errorf("%s", r)
	}
	return r
}

// mustRun is run that fails the test unless the command exits 0.
func mustRun(t *testing.T, conf string, stdin io.Reader, args ...string) result {
	t.Helper()
	r := run(t, conf, stdin, args...)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	return r
}

// mustFail runs a command that must exit non-zero with stderr matching
// every pattern in want (regular expressions).
func mustFail(t *testing.T, conf string, want []string, args ...string) result {
	t.Helper()
	r := run(t, conf, nil, args...)
	if r.code == 0 {
		t.Errorf("sluice %s: exit 0, want failure (stdout %q)", strings.Join(args, " "), r.stdout)
		return r
	}
	for _, w := range want {
		if !regexp.MustCompile(w).MatchString(r.stderr) {
			t.Errorf("sluice %s: stderr %q does not match %q", strings.Join(args, " "), r.stderr, w)
		}
	}
	if !strings.HasPrefix(r.stderr, "sluice: ") || strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") != 0 {
		t.Errorf("sluice %s: want one line starting with \"sluice: \" on stderr, got %q", strings.Join(args, " "), r.stderr)
	}
	return r
}

func status(t *testing.T, conf string) metaapi.StatusResp {
	t.Helper()
	r := mustRun(t, conf, nil, "status", "--json")
	var st metaapi.StatusResp
	if err := json.Unmarshal(r.stdout, &st); err != nil {
		t.Fatalf("status --json: %v in %q", err, r.stdout)
	}
	return st
}

// nodeStates maps node id to state.
func nodeStates(st metaapi.StatusResp) map[ids.NodeID]metaapi.NodeState {
	m := map[ids.NodeID]metaapi.NodeState{}
	for _, n := range st.Nodes {
		m[n.ID] = n.State
	}
	return m
}

// eventually polls cond every interval until it returns true or timeout
// passes; then it fails with cond's last explanation.
func eventually(t *testing.T, timeout, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true after %s: %s", timeout, why)
		}
		time.Sleep(interval)
	}
}

// waitNodesUp waits until status lists exactly n nodes, all up.
func waitNodesUp(t *testing.T, conf string, n int, timeout time.Duration) metaapi.StatusResp {
	t.Helper()
	var st metaapi.StatusResp
	eventually(t, timeout, 50*time.Millisecond, func() (bool, string) {
		st = status(t, conf)
		up := 0
		for _, nd := range st.Nodes {
			if nd.State == metaapi.NodeUp {
				up++
			}
		}
		return len(st.Nodes) == n && up == n, fmt.Sprintf("nodes %v", nodeStates(st))
	})
	return st
}

// ---- clusters ----

var (
	reMetaListen = regexp.MustCompile(`^sluice: meta listening on (\S+)$`)
	reMetaConf   = regexp.MustCompile(`^sluice: cluster secret (\S+), client config (\S+)$`)
	reNodeListen = regexp.MustCompile(`^sluice: storage node (n\d+) listening on (\S+)`)
	reUpConf     = regexp.MustCompile(`^sluice: client config written to (\S+)$`)
)

// upCluster is a running `sluice up`.
type upCluster struct {
	dir   string // --data
	conf  string
	meta  string
	nodes map[ids.NodeID]string // fabric address by node id
	proc  *proc
}

// startUp runs `sluice up --nodes n --data dir --listen 127.0.0.1:0` and
// waits until it has printed its addresses and every node is up.
func startUp(t *testing.T, dir string, n int, extra ...string) *upCluster {
	t.Helper()
	args := append([]string{"up", "--nodes", strconv.Itoa(n), "--data", dir, "--listen", "127.0.0.1:0"}, extra...)
	p := startDaemon(t, filepath.Dir(dir), "up-"+filepath.Base(dir)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), args...)
	c := &upCluster{dir: dir, proc: p, nodes: map[ids.NodeID]string{}}
	r := p.waitReady(t, 20*time.Second)
	c.meta, c.conf = r.Meta, r.Conf
	for _, nd := range r.Nodes {
		c.nodes[nodeID(t, nd.ID)] = nd.Addr
	}
	if len(c.nodes) != n {
		t.Fatalf("up's ready file names nodes %v, want %d", r.Nodes, n)
	}
	// What up prints for people says the same (printed before the file
	// is written).
	if got := p.waitLine(t, reMetaListen, 5*time.Second)[1]; got != c.meta {
		t.Errorf("up printed meta %s, its ready file %s", got, c.meta)
	}
	for i := 0; i < n; i++ {
		m := p.waitLine(t, regexp.MustCompile(`^sluice: storage node (n`+strconv.Itoa(i+1)+`) listening on (\S+) \(data `), 5*time.Second)
		if c.nodes[nodeID(t, m[1])] != m[2] {
			t.Errorf("up printed %s at %s, its ready file %v", m[1], m[2], r.Nodes)
		}
	}
	if got := p.waitLine(t, reUpConf, 5*time.Second)[1]; got != c.conf {
		t.Errorf("up printed client config %s, its ready file %s", got, c.conf)
	}
	if want, _ := filepath.Abs(filepath.Join(dir, "client.conf")); c.conf != want {
		t.Errorf("up wrote client config to %s, want %s", c.conf, want)
	}
	cc, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	if cc.Meta != c.meta {
		t.Errorf("client.conf names meta %s, up printed %s", cc.Meta, c.meta)
	}
	waitNodesUp(t, c.conf, n, 20*time.Second)
	return c
}

func nodeID(t *testing.T, s string) ids.NodeID {
	t.Helper()
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "n"), 10, 32)
	if err != nil || !strings.HasPrefix(s, "n") {
		t.Fatalf("bad node id %q", s)
	}
	return ids.NodeID(v)
}

// nodeDirs maps node id to data directory, reading each node.json among
// the candidates.
func nodeDirs(t *testing.T, candidates ...string) map[ids.NodeID]string {
	t.Helper()
	out := map[ids.NodeID]string{}
	for _, d := range candidates {
		raw, err := os.ReadFile(filepath.Join(d, "node.json"))
		if err != nil {
			t.Fatalf("node identity: %v", err)
		}
		var v struct {
			ID ids.NodeID `json:"id"`
		}
		if err := json.Unmarshal(raw, &v); err != nil || v.ID == 0 {
			t.Fatalf("%s/node.json: %q %v", d, raw, err)
		}
		out[v.ID] = d
	}
	return out
}

// ---- data ----

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

func fileSum(t *testing.T, path string) (string, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), n
}

// chunkFiles returns the *.chunk files under dir by base name.
func chunkFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted while walking (chunk garbage collection)
			}
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".chunk") {
			out[d.Name()] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// chunkFileName is the store's file name for a chunk.
func chunkFileName(c ids.ChunkID) string { return fmt.Sprintf("%016x.chunk", uint64(c)) }

// snapshotDir returns path -> sha of every regular file under dir.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			s, n := fileSum(t, p)
			out[p] = fmt.Sprintf("%s/%d", s, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ---- the control plane, for checks the CLI does not expose ----

// metaClient talks to meta with a client.conf's credential.
func metaClient(t *testing.T, conf string) *metaapi.Client {
	t.Helper()
	cc, err := config.Load(conf)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := pki.ClientConfig([]byte(cc.CA))
	if err != nil {
		t.Fatal(err)
	}
	mc := metaapi.NewClient(cc.Meta, metaapi.ClientAuth(cc.ClientID, cc.Credential), tc)
	mc.RetryFor = 5 * time.Second
	t.Cleanup(mc.Close)
	return mc
}

// layoutOf returns a file's attributes and chunk layouts (read-only).
func layoutOf(t *testing.T, mc *metaapi.Client, path string) (metaapi.Attr, []metaapi.ChunkLayout) {
	t.Helper()
	ctx := context.Background()
	var ar metaapi.AttrResp
	if err := mc.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(path), Follow: true}, &ar); err != nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	var lr metaapi.LayoutResp
	req := metaapi.LayoutReq{Ino: ar.Attr.Ino, Off: 0, Len: max(ar.Attr.Size, 1), Who: metaapi.Who{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}}
	if err := mc.Call(ctx, metaapi.OpLayout, req, &lr); err != nil {
		t.Fatalf("layout %s: %v", path, err)
	}
	if lr.More {
		t.Fatalf("layout %s: more chunks than one reply holds; test files are meant to be small", path)
	}
	return ar.Attr, lr.Chunks
}

// checkReplicas checks that every chunk of the file at path has a chunk
// file on each of its replicas, that the copies are byte-identical, and
// that each holds the file's bytes for that chunk (want).
func checkReplicas(t *testing.T, mc *metaapi.Client, dirs map[ids.NodeID]string, path string, want []byte) {
	t.Helper()
	attr, chunks := layoutOf(t, mc, path)
	if attr.Size != int64(len(want)) {
		t.Errorf("%s: size %d, want %d", path, attr.Size, len(want))
	}
	if wantN := (int64(len(want)) + attr.ChunkSize - 1) / attr.ChunkSize; int64(len(chunks)) != wantN {
		t.Errorf("%s: %d chunks in layout, want %d", path, len(chunks), wantN)
	}
	for _, l := range chunks {
		if len(l.Replicas) != 3 {
			t.Errorf("%s chunk %d: %d replicas, want 3", path, l.Index, len(l.Replicas))
		}
		lo := min(int64(len(want)), l.Index*attr.ChunkSize)
		hi := min(int64(len(want)), lo+attr.ChunkSize)
		part := want[lo:hi]
		var first []byte
		for i, r := range l.Replicas {
			d, ok := dirs[r.Node]
			if !ok {
				t.Fatalf("%s chunk %d: replica on unknown node %v", path, l.Index, r.Node)
			}
			p := filepath.Join(d, "store", "chunks", fmt.Sprintf("%02x", uint64(l.Chunk)&0xff), chunkFileName(l.Chunk))
			b, err := os.ReadFile(p)
			if err != nil {
				t.Errorf("%s chunk %d (%v) on %v: %v", path, l.Index, l.Chunk, r.Node, err)
				continue
			}
			// Only the committed bytes are the chunk: a chunk file may be
			// longer (recycled files keep stale bytes past the committed
			// length, which the store never reads).
			if len(b) < len(part) {
				t.Errorf("%s chunk %d (%v) on %v: file of %d bytes, shorter than the chunk's %d", path, l.Index, l.Chunk, r.Node, len(b), len(part))
				continue
			}
			b = b[:len(part)]
			if i == 0 {
				first = b
			} else if !bytes.Equal(b, first) {
				t.Errorf("%s chunk %d (%v): replica on %v (%d bytes, %s) differs from replica on %v (%d bytes, %s)",
					path, l.Index, l.Chunk, r.Node, len(b), sum(b), l.Replicas[0].Node, len(first), sum(first))
			}
			if !bytes.Equal(b, part) {
				t.Errorf("%s chunk %d (%v) on %v: %d bytes (%s), want the file's %d bytes (%s)",
					path, l.Index, l.Chunk, r.Node, len(b), sum(b), len(part), sum(part))
			}
		}
	}
}

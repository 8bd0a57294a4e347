package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"

	"github.com/sluicefs/sluice/internal/ids"
)

// throttle is a TCP proxy in front of a storage node that passes the
// bytes sent to the node at a fixed rate (replies flow freely). Nodes
// advertise the proxy, so clients and upstream replicas go through it:
// a write message then takes long enough to kill its sender mid-message.
//
// A proxy can also hold each connection after a number of bytes (hold)
// and later cut the held connections: the node then sees its peer vanish
// at a known byte of a message, whatever the kernel's socket buffers let
// the sender write ahead.
type throttle struct {
	ln        net.Listener
	rate      int64 // bytes per second toward the node
	target    chan string
	forwarded atomic.Int64
	hold      atomic.Int64 // bytes after which a connection waits; 0: none
	cut       atomic.Bool  // held connections are closed

	mu    sync.Mutex
	conns []net.Conn
}

func startThrottle(t *testing.T, rate int64) *throttle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &throttle{ln: ln, rate: rate, target: make(chan string, 1)}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *throttle) addr() string { return p.ln.Addr().String() }

func (p *throttle) setTarget(addr string) { p.target <- addr }

func (p *throttle) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *throttle) serve() {
	target := ""
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		if target == "" {
			target = <-p.target
		}
		go p.pipe(c, target)
	}
}

func (p *throttle) pipe(c net.Conn, target string) {
	n, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	p.track(n)
	closeBoth := sync.OnceFunc(func() { c.Close(); n.Close() })
	go func() {
		io.Copy(c, n)
		closeBoth()
	}()
	buf := make([]byte, 32<<10)
	start := time.Now()
	var sent int64
	for {
		chunk := buf
		if h := p.hold.Load(); h > 0 {
			if sent >= h {
				if p.cut.Load() {
					break
				}
				time.Sleep(5 * time.Millisecond)
				continue
			}
			chunk = buf[:min(int64(len(buf)), h-sent)]
		}
		k, err := c.Read(chunk)
		if k > 0 {
			if _, werr := n.Write(buf[:k]); werr != nil {
				break
			}
			sent += int64(k)
			p.forwarded.Add(int64(k))
			if ahead := time.Duration(sent*int64(time.Second)/p.rate) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		if err != nil {
			break
		}
	}
	closeBoth()
}

// TestClientKilledMidPut kills `sluice put - /x` while it streams a large
// input: /x must not appear, the cluster must clean up and keep working.
func TestClientKilledMidPut(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	var proxies []*throttle
	for i := 1; i <= 3; i++ {
		p := startThrottle(t, 16<<20)
		n := c.startNode(t, fmt.Sprintf("n%d", i), "--advertise", p.addr())
		p.setTarget(n.addr)
		proxies = append(proxies, p)
	}
	conf := c.conf
	st := waitNodesUp(t, conf, 3, 15*time.Second)
	for _, n := range st.Nodes {
		if !strings.HasPrefix(n.Addr, "127.0.0.1:") || n.Addr == c.nodes[n.ID].addr {
			t.Errorf("node %v registered at %s, want its --advertise address", n.ID, n.Addr)
		}
	}
	mc := metaClient(t, conf)
	dirs := map[ids.NodeID]string{}
	for id, n := range c.nodes {
		dirs[id] = n.dir
	}
	forwarded := func() int64 {
		var s int64
		for _, p := range proxies {
			s += p.forwarded.Load()
		}
		return s
	}

	// A file written before, which must survive.
	keep := randomBytes(t, 100<<10)
	mustRun(t, conf, bytes.NewReader(keep), "put", "-", "/keep")

	// 200 MiB piped into put, killed in the middle of a write message
	// (22 MiB is inside one whether they are 4 or 16 MiB): every proxy
	// holds each connection there until the head is known, the head's
	// proxy then keeps holding the client's connection, and once every
	// replica has what the head was given, the client is killed and its
	// connection cut at that byte.
	const total = 200 << 20
	const hold = 22 << 20
	for _, p := range proxies {
		p.hold.Store(hold)
	}
	block := randomBytes(t, 1<<20)
	put := startProcStdin(t, dir, "put-x", "--conf", conf, "put", "-", "/x")
	fed := make(chan int64, 1)
	go func() {
		var n int64
		defer func() { fed <- n }()
		for n < total {
			k, err := put.stdin.Write(block)
			n += int64(k)
			if err != nil {
				return
			}
		}
		put.stdin.Close()
	}()
	before := forwarded()
	waitForwarded := func(what string, done func() bool) {
		t.Helper()
		eventually(t, 30*time.Second, 2*time.Millisecond, func() (bool, string) {
			if put.exited() {
				t.Fatalf("put exited early: %v\n%s", put.waitErr, put.stderrText())
			}
			return done(), fmt.Sprintf("%s: %d bytes forwarded to nodes", what, forwarded()-before)
		})
	}
	// Once data flows, the file being written is a hidden temporary.
	waitForwarded("data flows", func() bool { return forwarded()-before >= 1<<20 })
	ls := string(mustRun(t, conf, nil, "ls", "/").stdout)
	tmpRe := regexp.MustCompile(`(?m)^\.x\.sluice-put-[0-9a-f]+$`)
	if !tmpRe.MatchString(ls) || strings.Contains(ls, "\nx\n") || strings.HasPrefix(ls, "x\n") {
		t.Errorf("during the put, ls / = %q: want a hidden temporary and no x", ls)
	}
	var head *throttle
	if tmp := tmpRe.FindString(ls); tmp != "" {
		_, layout := layoutOf(t, mc, "/"+tmp)
		if len(layout) > 0 && len(layout[0].Replicas) > 0 {
			for _, p := range proxies {
				if p.addr() == layout[0].Replicas[0].Addr {
					head = p
				}
			}
		}
	}
	if head == nil {
		t.Fatalf("cannot tell which proxy the put's head is behind (ls / = %q)", ls)
	}
	for _, p := range proxies {
		if p != head {
			p.hold.Store(0)
		}
	}
	// Every replica has what the head was given, up to a packet.
	waitForwarded("held at 22 MiB", func() bool { return forwarded()-before >= 3*hold-(1<<20) })
	put.cmd.Process.Kill()
	<-put.done
	head.cut.Store(true)
	n := <-fed
	t.Logf("killed put after feeding %d MiB; %.1f MiB had reached the nodes", n>>20, float64(forwarded()-before)/(1<<20))
	if put.cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("put finished before it was killed")
	}

	// /x does not exist and reading it fails cleanly.
	mustFail(t, conf, []string{`ENOENT`, `/x`}, "get", "/x", filepath.Join(dir, "x.out"))
	if _, err := os.Stat(filepath.Join(dir, "x.out")); err == nil {
		t.Errorf("failed get created the local file")
	}
	mustFail(t, conf, []string{`ENOENT`}, "stat", "/x")
	ls = string(mustRun(t, conf, nil, "ls", "/").stdout)
	for _, name := range strings.Fields(ls) {
		if name != "keep" && !tmpRe.MatchString(name) {
			t.Errorf("after the killed put, ls / has %q", name)
		}
	}
	tmp := tmpRe.FindString(ls)
	t.Logf("after the kill, ls / = %q", ls)

	// The nodes abort the cut-off request.
	eventually(t, 15*time.Second, 100*time.Millisecond, func() (bool, string) {
		for _, n := range c.nodes {
			if strings.Contains(n.proc.stderrText(), "request aborted") {
				return true, ""
			}
		}
		return false, "no node logged \"request aborted\""
	})
	// The temporary's chunk is rolled back on every replica to what was
	// committed (nothing, or whole write messages): the copies agree and
	// hold a prefix of the input.
	if tmp == "" {
		t.Errorf("the killed put's temporary file is gone; the chunk checks below are skipped")
	} else {
		_, layout := layoutOf(t, mc, "/"+tmp)
		if len(layout) != 1 {
			t.Errorf("temporary has %d chunks, want 1", len(layout))
		}
		var keys *capability.Keyring
		for _, n := range c.nodes {
			keys = nodeKeyring(t, n.dir)
			break
		}
		for _, l := range layout {
			var length uint64
			eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
				var states []string
				for _, r := range l.Replicas {
					// Ask the node (at its own address, not the proxy)
					// what it has committed: a chunk file may be longer.
					ver, n := committed(t, c.nodes[r.Node].addr, r.Node, l.Chunk, keys)
					states = append(states, fmt.Sprintf("v%d:%d", ver, n))
					p := filepath.Join(dirs[r.Node], "store", "chunks", fmt.Sprintf("%02x", uint64(l.Chunk)&0xff), chunkFileName(l.Chunk))
					b, err := os.ReadFile(p)
					if err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
					if uint64(len(b)) < n {
						return false, fmt.Sprintf("replica on %v: file of %d bytes for %d committed", r.Node, len(b), n)
					}
					for off := 0; off < int(n); off += len(block) {
						end := min(off+len(block), int(n))
						if !bytes.Equal(b[off:end], block[:end-off]) {
							return false, fmt.Sprintf("replica on %v: committed bytes are not a prefix of the input at %d", r.Node, off)
						}
					}
					length = n
				}
				for _, s := range states[1:] {
					if s != states[0] {
						return false, fmt.Sprintf("replicas of %v differ: %v", l.Chunk, states)
					}
				}
				return true, ""
			})
			// Whole messages committed; the one cut off was rolled back.
			t.Logf("temporary's chunk %v: %d bytes committed on every replica", l.Chunk, length)
			if length < 1<<20 || length%(1<<20) != 0 {
				t.Errorf("temporary's chunk %v holds %d bytes after the abort, want the committed first write message", l.Chunk, length)
			}
		}
	}

	// Everything else keeps working; a new put of the same path succeeds.
	if got := mustRun(t, conf, nil, "cat", "/keep").stdout; !bytes.Equal(got, keep) {
		t.Errorf("/keep changed")
	}
	x := randomBytes(t, 300<<10)
	mustRun(t, conf, bytes.NewReader(x), "put", "-", "/x")
	if got := mustRun(t, conf, nil, "get", "/x", "-").stdout; !bytes.Equal(got, x) {
		t.Errorf("/x after the new put: %d bytes %s, want %d bytes %s", len(got), sum(got), len(x), sum(x))
	}
	checkReplicas(t, mc, dirs, "/x", x)

	// The leftover temporary can be removed, and its chunks are then
	// deleted from the nodes.
	if tmp != "" {
		_, layout := layoutOf(t, mc, "/"+tmp)
		mustRun(t, conf, nil, "rm", "/"+tmp)
		eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
			for _, l := range layout {
				for id, d := range dirs {
					if _, ok := chunkFiles(t, d)[chunkFileName(l.Chunk)]; ok {
						return false, fmt.Sprintf("chunk %v of the removed temporary still on %v", l.Chunk, id)
					}
				}
			}
			return true, ""
		})
		if out := string(mustRun(t, conf, nil, "ls", "/").stdout); out != "keep\nx\n" {
			t.Errorf("ls / after removing the temporary = %q", out)
		}
	}
}

// procStdin is a proc whose stdin the test writes.
type procStdin struct {
	*proc
	stdin io.WriteCloser
}

func startProcStdin(t *testing.T, logDir, name string, args ...string) *procStdin {
	t.Helper()
	// An *os.File, so the child reads the pipe itself and a kill makes
	// our writes fail at once.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	ps := &procStdin{stdin: w, proc: startProcWith(t, logDir, name, r, args...)}
	r.Close() // the child has its copy
	return ps
}

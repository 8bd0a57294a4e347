package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/connlimit"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// attacker is the one host a flood comes from: everything else in the
// tests uses 127.0.0.1, and loopback answers all of 127/8.
var attacker = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}

// raiseNoFile lifts the test process's descriptor limit to its hard limit
// and skips the test if that is below need.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	if lim.Cur < lim.Max {
		old := lim
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Skip(err)
		}
		t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	}
	if lim.Cur < need {
		t.Skipf("RLIMIT_NOFILE %d: the flood needs %d descriptors", lim.Cur, need)
	}
}

// flood opens n connections to addr from the attacker's address, 64
// dials at a time, each sending first (nil: nothing). Once all are made
// and the server has had settle to act, it sorts them: held are those the
// server keeps open, refused those it closed. All are closed at the end of
// the test.
func flood(t *testing.T, addr string, n int, first []byte, settle time.Duration) (held, refused []net.Conn) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var conns []net.Conn
	var dialErr error
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			d := net.Dialer{LocalAddr: attacker, Timeout: 10 * time.Second}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				mu.Lock()
				dialErr = err
				mu.Unlock()
				return
			}
			if first != nil {
				c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				c.Write(first)
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	if len(conns) < n/2 {
		t.Fatalf("flood: only %d of %d connections made: %v", len(conns), n, dialErr)
	}
	time.Sleep(settle)
	held = conns
	// A loaded server may still be accepting (and refusing) what waits in
	// its backlog: look again until a pass finds none closed.
	for pass := 0; pass < 10; pass++ {
		var still []net.Conn
		for _, c := range held {
			if open(c) {
				still = append(still, c)
			} else {
				refused = append(refused, c)
			}
		}
		stable := len(still) == len(held)
		held = still
		if stable && pass > 0 {
			break
		}
		time.Sleep(settle)
	}
	return held, refused
}

// open reports whether the server has not closed c, reading (and
// dropping) whatever it sent, such as a hello.
func open(c net.Conn) bool {
	buf := make([]byte, 4096)
	for range 64 {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		_, err := c.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return true
		}
		if err != nil {
			return false
		}
	}
	return true // still talking
}

// stillOpen reports how many of cs the server has not closed.
func stillOpen(cs []net.Conn) int {
	n := 0
	for _, c := range cs {
		if open(c) {
			n++
		}
	}
	return n
}

// TestFloodFromOneHost (issue 16, item 5) attacks as one host would: 5,000
// connections that pass the fabric hello and then idle, from one address,
// to one storage node of three, and garbage on others. A put whose three
// replicas include the attacked node must still succeed, the node stay up
// in meta's status, and the garbage connections be closed. Then 5,000
// idle connections to meta from the same address leave a normal client's
// calls served. Without the per-host bound (--max-conns-per-host -1) the
// idle connections take all 4,096 of the node's slots and the put fails.
func TestFloodFromOneHost(t *testing.T) {
	raiseNoFile(t, 12000)
	c := threeNodes(t, nil, nil)
	var target *nodeProc
	for _, n := range c.nodes {
		target = n
		break
	}
	dir := c.dir
	data := randomBytes(t, 3<<20)
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")

	// Garbage first, while the host has slots: a bad hello, and a good
	// hello followed by a packet header no node accepts. Both are closed
	// as soon as read, well before the 5-second hello timeout.
	var hello [16]byte
	copy(hello[:], "SLF\x01")
	binary.LittleEndian.PutUint32(hello[4:], 64<<10)
	binary.LittleEndian.PutUint32(hello[8:], 16)
	badHeader := bytes.Repeat([]byte{0xff}, 16)
	start := time.Now()
	h1, r1 := flood(t, target.addr, 50, bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 2), 0)
	h2, r2 := flood(t, target.addr, 50, append(hello[:], badHeader...), 0)
	garbage := slices.Concat(h1, r1, h2, r2)
	eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		n := stillOpen(garbage)
		return n == 0, fmt.Sprintf("%d of 100 connections that sent garbage are still open", n)
	})
	t.Logf("garbage connections closed within %s", time.Since(start).Round(time.Millisecond))

	// The idle flood: 5,000 connections that pass the hello and say
	// nothing more.
	held, refused := flood(t, target.addr, 5000, hello[:], time.Second)
	t.Logf("idle flood on the node: %d held, %d refused", len(held), len(refused))
	if len(held) > connlimit.DefaultPerHost {
		t.Errorf("the node holds %d connections from one host, more than the %d allowed", len(held), connlimit.DefaultPerHost)
	}
	if len(held) < connlimit.DefaultPerHost/2 {
		t.Errorf("the node holds only %d connections from the attacker: the flood did not happen", len(held))
	}
	// Refusals are logged at most once a second: the flood does not
	// flood the node's log too.
	if n := strings.Count(target.proc.stderrText(), "refusing connections"); n == 0 || n > 20 {
		t.Errorf("the node logged %d refusals of %d refused connections", n, len(refused))
	}

	// While the flood holds: a put all three nodes must take, read back;
	// the attacked node is still up.
	mustRun(t, c.conf, nil, "put", src, "/flooded")
	if got := mustRun(t, c.conf, nil, "cat", "/flooded").stdout; !bytes.Equal(got, data) {
		t.Fatalf("cat /flooded: %d bytes, not the %d put", len(got), len(data))
	}
	mc := metaClient(t, c.conf)
	checkReplicas(t, mc, nodeDirs(t, dirsOf(c)...), "/flooded", data)
	_, chunks := layoutOf(t, mc, "/flooded")
	for _, l := range chunks {
		if !slices.ContainsFunc(l.Replicas, func(r metaapi.Replica) bool { return r.Node == target.id }) {
			t.Fatalf("chunk %v has no replica on the attacked node %v: the put did not have to reach it", l.Chunk, target.id)
		}
	}
	st := status(t, c.conf)
	if s, ok := nodeStates(st)[target.id]; !ok || s != metaapi.NodeUp {
		t.Fatalf("attacked node %v is %q in meta's status", target.id, s)
	}
	if n := stillOpen(held); n < len(held)/2 {
		t.Fatalf("only %d of the %d held connections are still open: the test did not hold the flood", n, len(held))
	}

	// Meta: 5,000 idle connections (no request; meta would close each
	// after 10 s) from the attacker. Those past the bound are closed at
	// once; a normal client's calls go on.
	metaHeld, metaRefused := flood(t, c.meta, 5000, nil, 500*time.Millisecond)
	t.Logf("idle flood on meta: %d held, %d refused", len(metaHeld), len(metaRefused))
	if len(metaHeld) > connlimit.DefaultPerHost {
		t.Errorf("meta holds %d connections from one host, more than the %d allowed", len(metaHeld), connlimit.DefaultPerHost)
	}
	mustRun(t, c.conf, nil, "put", src, "/meta-flooded")
	if st := status(t, c.conf); len(st.Nodes) != 3 {
		t.Fatalf("status under meta's flood: %d nodes", len(st.Nodes))
	}
	for _, n := range c.nodes {
		if s := nodeStates(status(t, c.conf))[n.id]; s != metaapi.NodeUp {
			t.Fatalf("node %v is %q while meta is flooded", n.id, s)
		}
	}
}

// TestFloodNFSGateway: the NFS gateway, over TCP and over the fabric
// transport, holds at most 64 connections from one host (its default),
// so 5,000 from the attacker leave a normal client's reads served.
func TestFloodNFSGateway(t *testing.T) {
	raiseNoFile(t, 12000)
	c := startMeta(t, baseDir(t))
	c.startNode(t, "n1")
	waitNodesUp(t, c.conf, 1, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "1")
	data := randomBytes(t, 1<<20)
	// Readable by all: the gateway squashes root (its default export).
	src := filepath.Join(c.dir, "src.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c.conf, nil, "put", src, "/f")
	addr, faddr := nfsGateway(t, c.conf)

	held, refused := flood(t, addr, 5000, nil, 500*time.Millisecond)
	t.Logf("idle flood on the gateway's TCP port: %d held, %d refused", len(held), len(refused))
	if len(held) > 64 || len(held) < 32 {
		t.Errorf("the gateway holds %d connections from one host, want at most (and near) 64", len(held))
	}
	if got := mustRun(t, c.conf, nil, "nfs-get", "--server", addr, "/f", "-").stdout; !bytes.Equal(got, data) {
		t.Fatalf("nfs-get under the flood: %d bytes, not the %d put", len(got), len(data))
	}

	var hello [16]byte
	copy(hello[:], "SLF\x01")
	binary.LittleEndian.PutUint32(hello[4:], 64<<10)
	binary.LittleEndian.PutUint32(hello[8:], 16)
	held, refused = flood(t, faddr, 5000, hello[:], 500*time.Millisecond)
	t.Logf("idle flood on the gateway's fabric port: %d held, %d refused", len(held), len(refused))
	if len(held) > 64 || len(held) < 32 {
		t.Errorf("the gateway's fabric transport holds %d connections from one host, want at most (and near) 64", len(held))
	}
	if got := mustRun(t, c.conf, nil, "nfs-get", "--transport", "fabric", "--server", faddr, "/f", "-").stdout; !bytes.Equal(got, data) {
		t.Fatalf("nfs-get over the fabric under the flood: %d bytes, not the %d put", len(got), len(data))
	}
}

func dirsOf(c *splitCluster) []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.dir)
	}
	return out
}

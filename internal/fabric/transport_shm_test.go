package fabric

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// regBuf is memory for a test region: shared memory (Alloc) on the shm
// backend, so its one-sided operations are copies by the initiator;
// heap memory on the others, as before.
func regBuf(t *testing.T, tr transport, ep *Endpoint, n int) []byte {
	t.Helper()
	if _, ok := tr.(shmTransport); !ok {
		return make([]byte, n)
	}
	b, err := ep.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// shmEndOf is the shared-memory side of a connection, nil if it has none.
func shmEndOf(c *Conn) *shmEnd {
	s, _ := c.direct.(*shmEnd)
	return s
}

// wantDirect checks, on the shm backend, that pc mapped at least n of
// its peer's regions (its one-sided operations did not go as packets).
func wantDirect(t *testing.T, tr transport, pc *PeerConn, n int) {
	t.Helper()
	if _, ok := tr.(shmTransport); !ok {
		return
	}
	s := shmEndOf(pc.Conn)
	if s == nil {
		t.Fatalf("connection to %s is not over shared memory", pc.Addr())
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	got := 0
	for _, m := range s.maps {
		if m.mem != nil {
			got++
		}
	}
	if got < n {
		t.Fatalf("%d regions mapped, want %d: one-sided operations went as packets", got, n)
	}
}

// TestFabricSelection: auto goes over shared memory to a peer on this
// host, tcp never does, shm refuses a peer elsewhere (before any
// traffic), and TLS keeps TCP.
func TestFabricSelection(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		mode Fabric
		want string
	}{{FabricAuto, "unix"}, {FabricShm, "unix"}, {FabricTCP, "tcp"}, {"", "tcp"}} {
		_, _, pc := pair(t, Options{Fabric: tc.mode}, newCollector())
		if got := pc.RemoteAddr().Network(); got != tc.want {
			t.Errorf("fabric %q: connection over %s, want %s", tc.mode, got, tc.want)
		}
		if got := pc.RemoteAddr().String(); got != pc.Addr() {
			t.Errorf("fabric %q: peer named %q, dialed at %s", tc.mode, got, pc.Addr())
		}
	}
	// A tcp listener has no shared-memory socket: auto falls back.
	srv, _ := NewEndpoint(Options{Fabric: FabricTCP})
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0", newCollector())
	if err != nil {
		t.Fatal(err)
	}
	auto, _ := NewEndpoint(Options{Fabric: FabricAuto})
	defer auto.Close()
	c, err := auto.Dial(ctx, addr.String(), newCollector())
	if err != nil || c.RemoteAddr().Network() != "tcp" {
		t.Fatalf("auto to a tcp-only peer: %v", err)
	}
	shm, _ := NewEndpoint(Options{Fabric: FabricShm})
	defer shm.Close()
	if _, err := shm.Dial(ctx, addr.String(), newCollector()); err == nil || !strings.Contains(err.Error(), "shm only") {
		t.Fatalf("shm to a tcp-only peer: %v", err)
	}
	// 192.0.2.1 (TEST-NET-1) is no address of this host: refused
	// without dialing.
	if _, err := shm.Dial(ctx, "192.0.2.1:9", newCollector()); err == nil || !strings.Contains(err.Error(), "not on this host") {
		t.Fatalf("shm to a remote peer: %v", err)
	}
	if _, err := NewEndpoint(Options{Fabric: FabricShm, ServerTLS: &tls.Config{}}); err == nil {
		t.Fatal("shm with TLS accepted")
	}
	if _, err := NewEndpoint(Options{Fabric: "rdma"}); err == nil {
		t.Fatal("unknown fabric accepted")
	}
	tlsDial, _ := NewEndpoint(Options{Fabric: FabricAuto, DialTLS: func(string) (*tls.Config, error) { return &tls.Config{}, nil }})
	defer tlsDial.Close()
	if names, err := tlsDial.tr.(shmTransport).useShm(ctx, "127.0.0.1:1"); names != nil || err != nil {
		t.Fatalf("auto with TLS chose shared memory: %v %v", names, err)
	}
}

// TestShmHeapRegionGoesByPackets: heap memory registered with an
// endpoint is served by packets to a shared-memory peer (it cannot be
// handed over), with the same checks, and without asking for it first
// (its key says so); so is part of an allocation, and a write-only one
// (the peer would need a readable file to map it).
func TestShmHeapRegionGoesByPackets(t *testing.T) {
	ctx := context.Background()
	col := newCollector()
	srv, _, pc := pair(t, Options{Fabric: FabricShm}, col)
	heap := make([]byte, 64)
	copy(heap, "heap bytes")
	r := srv.Register(heap, RemoteRead)
	shared, _ := srv.Alloc(64)
	sub := srv.Register(shared[:32], RemoteRead) // part of an Alloc: not handed out
	wshared, _ := srv.Alloc(64)
	wo := srv.Register(wshared, RemoteWrite)
	if r.Key()&keyShared != 0 || sub.Key()&keyShared != 0 || wo.Key()&keyShared == 0 {
		t.Fatalf("keys %#x %#x %#x: the shared bit is wrong", r.Key(), sub.Key(), wo.Key())
	}
	got := make([]byte, 10)
	if err := pc.Read(ctx, r.Key(), 0, got); err != nil || string(got) != "heap bytes" {
		t.Fatalf("read %q, %v", got, err)
	}
	if err := pc.Read(ctx, sub.Key(), 0, got); err != nil {
		t.Fatal(err)
	}
	if err := pc.Write(ctx, wo.Key(), 0, []byte("by packet"), false); err != nil {
		t.Fatal(err)
	}
	pc.Send(pc.NewID(), []byte("written"))
	<-col.done
	if string(wshared[:9]) != "by packet" {
		t.Fatalf("write-only region holds %q", wshared[:9])
	}
	s := shmEndOf(pc.Conn)
	s.mu.RLock()
	m1, m2, m3 := s.maps[r.Key()], s.maps[sub.Key()], s.maps[wo.Key()]
	s.mu.RUnlock()
	if m1 != nil || m2 != nil || m3 == nil || m3.mem != nil {
		t.Fatalf("heap, partial or write-only region asked for or mapped: %+v %+v %+v", m1, m2, m3)
	}
	var ae *AccessError
	if err := pc.Read(ctx, r.Key(), 60, got); !errors.As(err, &ae) {
		t.Fatalf("out of bounds by packet: %v", err)
	}
}

// TestShmReadOnlyMapping: a read-only region is handed over read-only:
// the peer's mapping cannot be written even bypassing the checks.
func TestShmReadOnlyMapping(t *testing.T) {
	ctx := context.Background()
	srv, _, pc := pair(t, Options{Fabric: FabricShm}, newCollector())
	mem, _ := srv.Alloc(4096)
	r := srv.Register(mem, RemoteRead)
	if err := pc.Read(ctx, r.Key(), 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	s := shmEndOf(pc.Conn)
	s.mu.RLock()
	m := s.maps[r.Key()]
	s.mu.RUnlock()
	if m == nil || m.mem == nil {
		t.Fatal("not mapped")
	}
	// Making the peer's mapping writable must fail: the file is O_RDONLY.
	if err := unix.Mprotect(m.mem, unix.PROT_READ|unix.PROT_WRITE); err == nil {
		t.Fatal("a read-only region's mapping could be made writable")
	}
}

// TestShmDeregisterWaitsForPeerCopy: Deregister returns only once a
// peer inside a copy (its in-use count, in the shared control page) has
// left it; later operations are refused as on TCP.
func TestShmDeregisterWaitsForPeerCopy(t *testing.T) {
	ctx := context.Background()
	srv, _, pc := pair(t, Options{Fabric: FabricShm}, newCollector())
	for _, release := range []bool{false, true} {
		mem, _ := srv.Alloc(128)
		r := srv.Register(mem, RemoteRead|RemoteWrite)
		if err := pc.Read(ctx, r.Key(), 0, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
		s := shmEndOf(pc.Conn)
		s.mu.RLock()
		m := s.maps[r.Key()]
		s.mu.RUnlock()
		atomic.AddUint32(m.inUse, 1) // as the peer does before a copy
		done := make(chan struct{})
		if release {
			srv.Release(r, func() { close(done) })
		} else {
			go func() { srv.Deregister(r); close(done) }()
		}
		time.Sleep(50 * time.Millisecond)
		select {
		case <-done:
			t.Fatal("deregistered while a peer was copying")
		default:
		}
		if atomic.LoadUint32(m.revoked) != 1 {
			t.Fatal("revoked flag not set")
		}
		if err := srv.Free(mem); !errors.Is(err, ErrRegistered) {
			t.Fatalf("free while a peer copies: %v", err)
		}
		atomic.AddUint32(m.inUse, ^uint32(0))
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("not released once the peer's copy ended")
		}
		if err := srv.Free(mem); err != nil {
			t.Fatal(err)
		}
	}
	// The revoked mapping refuses: an access error, as on TCP.
	var ae *AccessError
	mem, _ := srv.Alloc(8)
	r := srv.Register(mem, RemoteRead)
	pc.Read(ctx, r.Key(), 0, make([]byte, 8))
	srv.Deregister(r)
	if err := pc.Read(ctx, r.Key(), 0, make([]byte, 8)); !errors.As(err, &ae) {
		t.Fatalf("read of a revoked region: %v", err)
	}
}

// TestShmDeregisterFailsHoldingPeer: a peer that stays inside a copy
// (hostile, or stopped) gets WriteTimeout, then its connection is failed.
func TestShmDeregisterFailsHoldingPeer(t *testing.T) {
	ctx := context.Background()
	h := make(connOf, 1)
	srv, _, pc := pair(t, Options{Fabric: FabricShm, WriteTimeout: 200 * time.Millisecond}, h)
	pc.Send(pc.NewID(), []byte("hi"))
	sc := <-h
	mem, _ := srv.Alloc(64)
	r := srv.Register(mem, RemoteRead)
	if err := pc.Read(ctx, r.Key(), 0, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	s := shmEndOf(pc.Conn)
	s.mu.RLock()
	atomic.AddUint32(s.maps[r.Key()].inUse, 1) // and never leaves
	s.mu.RUnlock()
	done := make(chan struct{})
	go func() { srv.Deregister(r); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Deregister waits for ever on a peer holding the region")
	}
	if !errors.Is(sc.Err(), errHeld) {
		t.Fatalf("holding peer's connection: %v", sc.Err())
	}
}

// openFds counts this process's descriptors.
func openFds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestShmHostileGrants: answers to a grant request that are not what
// the protocol allows (descriptor counts, files that are no sealed
// memory files or too small, unknown statuses) fail the request with a
// clear error and leak no descriptor.
func TestShmHostileGrants(t *testing.T) {
	ctx := context.Background()
	memfd := func(n int) int {
		fd, err := newMemfd("t", n, true)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	unsealed := func() int {
		fd, _ := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
		unix.Ftruncate(fd, 4096)
		return fd
	}
	pipe := func() int {
		var p [2]int
		unix.Pipe2(p[:], unix.O_CLOEXEC)
		unix.Close(p[1])
		return p[0]
	}
	answer := func(status byte, slot uint32, n uint64) []byte {
		a := make([]byte, grantRespSize)
		a[0], a[1] = status, byte(RemoteRead)
		binary.LittleEndian.PutUint32(a[4:], slot)
		binary.LittleEndian.PutUint64(a[8:], n)
		return a
	}
	for _, tc := range []struct {
		name string
		resp []byte
		fds  func() []int
		want string
	}{
		{"ok without descriptors", answer(grantOK, 0, 64), func() []int { return nil }, "0 descriptors"},
		{"ok with one", answer(grantOK, 0, 64), func() []int { return []int{memfd(4096)} }, "1 descriptors"},
		{"ok with three", answer(grantOK, 0, 64), func() []int { return []int{memfd(4096), memfd(4096), memfd(4096)} }, "too many"},
		{"refusal with descriptors", answer(grantNone, 0, 0), func() []int { return []int{memfd(4096)} }, "refusal"},
		{"a pipe", answer(grantOK, 0, 64), func() []int { return []int{pipe(), memfd(ctlSize)} }, "not sealed"},
		{"unsealed", answer(grantOK, 0, 64), func() []int { return []int{unsealed(), memfd(ctlSize)} }, "not sealed"},
		{"too small", answer(grantOK, 0, 1<<20), func() []int { return []int{memfd(4096), memfd(ctlSize)} }, "has 4096 bytes"},
		{"small control page", answer(grantOK, 0, 64), func() []int { return []int{memfd(4096), memfd(4096)} }, "has 4096 bytes"},
		{"slot out of range", answer(grantOK, ctlSlots, 64), func() []int { return []int{memfd(4096), memfd(ctlSize)} }, "bad shared region grant"},
		{"unknown status", answer(9, 0, 64), func() []int { return nil }, "answer 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := openFds(t)
			x, y, err := socketPair() // s asks on x, the test answers on y
			if err != nil {
				t.Fatal(err)
			}
			z, w, _ := socketPair() // s's server side, unused
			o := Options{}
			o.fill()
			s := newShmEnd(&o, x, z)
			answered := make(chan struct{})
			go func() {
				defer close(answered)
				q := make([]byte, grantReqSize)
				y.Read(q)
				fds := tc.fds()
				y.WriteMsgUnix(tc.resp, unix.UnixRights(fds...), nil)
				closeFds(fds)
			}()
			err = s.fetch(ctx, 42)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			<-answered
			s.close()
			y.Close()
			w.Close()
			if after := openFds(t); after > before {
				t.Fatalf("%d descriptors leaked", after-before)
			}
		})
	}
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	a, err := fdConn(p[0])
	if err != nil {
		return nil, nil, err
	}
	b, err := fdConn(p[1])
	return a, b, err
}

// TestShmHostileControl: a peer that sends garbage on its control socket
// loses its connection with a protocol error; one that sends a broken
// preamble is dropped; the endpoint goes on serving others.
func TestShmHostileControl(t *testing.T) {
	ctx := context.Background()
	col := newCollector()
	srv, cli, pc := pair(t, Options{Fabric: FabricShm}, col)
	mem, _ := srv.Alloc(64)
	r := srv.Register(mem, RemoteRead)
	shmEndOf(pc.Conn).req.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	select {
	case err := <-col.closed:
		if !errors.Is(err, ErrProtocol) {
			t.Fatalf("closed with %v, want a protocol error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("garbage on the control socket did not close the connection")
	}
	// Broken preambles: no descriptors, descriptors that are not
	// sockets, garbage then silence.
	name := shmName(net.IPv4(127, 0, 0, 1), srv.lns[0].addr().(*net.TCPAddr).Port)
	for i, send := range []func(uc *net.UnixConn){
		func(uc *net.UnixConn) { uc.Write(preambleMagic[:]) },
		func(uc *net.UnixConn) {
			fd, _ := newMemfd("t", 4096, true)
			uc.WriteMsgUnix(preambleMagic[:], unix.UnixRights(fd, fd), nil)
			unix.Close(fd)
		},
		func(uc *net.UnixConn) { uc.Write([]byte("garbage!garbage!")) },
	} {
		uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: name, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		send(uc)
		uc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := uc.Read(make([]byte, 1)); err == nil {
			t.Fatalf("preamble %d: the listener answered", i)
		}
		uc.Close()
	}
	pc2, err := NewPool(cli, 1).Get(ctx, pc.Addr())
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if err := pc2.Read(ctx, r.Key(), 0, got); err != nil {
		t.Fatalf("the endpoint stopped serving: %v", err)
	}
}

// TestShmWriteVisible: a direct WRITE lands in the owner's memory and a
// direct READ sees the owner's bytes (the mappings share pages).
func TestShmWriteVisible(t *testing.T) {
	ctx := context.Background()
	col := newCollector()
	srv, _, pc := pair(t, Options{Fabric: FabricShm}, col)
	mem, _ := srv.Alloc(1 << 16)
	r := srv.Register(mem, RemoteRead|RemoteWrite)
	data := bytes.Repeat([]byte("shm!"), 4096)
	if err := pc.Write(ctx, r.Key(), 100, data, false); err != nil {
		t.Fatal(err)
	}
	pc.Send(pc.NewID(), []byte("written"))
	<-col.done
	if !bytes.Equal(mem[100:100+len(data)], data) {
		t.Fatal("direct write not in the owner's memory")
	}
	copy(mem, "owner")
	got := make([]byte, 5)
	if err := pc.Read(ctx, r.Key(), 0, got); err != nil || string(got) != "owner" {
		t.Fatalf("read %q, %v", got, err)
	}
	var ae *AccessError
	if err := pc.Read(ctx, r.Key(), 1<<16-2, got); !errors.As(err, &ae) {
		t.Fatalf("read past the end: %v", err)
	}
}

// cpuTime is this process's CPU time, user and system.
func cpuTime(t *testing.T) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

const childEnv = "SLUICE_FABRIC_TEST_CHILD"

// TestShmTargetCPUIdle: a second process reads a region of this one, 64
// bytes at a time: a million times over shared memory, 100k times over
// TCP. Over shared memory this process's CPU stays (nearly) where it
// was: the reads are the child's copies. Over TCP each READ costs this
// process's reader. Asserted: the target's CPU for the million reads
// over shm is under a fifth of its CPU for the 100k over TCP.
func TestShmTargetCPUIdle(t *testing.T) {
	if env := os.Getenv(childEnv); env != "" {
		readerChild(t, env)
		return
	}
	var cpu [2]time.Duration
	for i, mode := range []Fabric{FabricShm, FabricTCP} {
		reads := 1_000_000
		if mode == FabricTCP {
			reads = 100_000
		}
		srv, err := NewEndpoint(Options{Fabric: mode})
		if err != nil {
			t.Fatal(err)
		}
		addr, err := srv.Listen("127.0.0.1:0", discard{})
		if err != nil {
			t.Fatal(err)
		}
		mem, _ := srv.Alloc(1 << 16)
		for j := range mem {
			mem[j] = byte(j % 251)
		}
		r := srv.Register(mem, RemoteRead)
		cmd := exec.Command(os.Args[0], "-test.run=^TestShmTargetCPUIdle$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d,%d", childEnv, mode, addr, r.Key(), reads))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		before := cpuTime(t)
		start := time.Now()
		err = cmd.Run()
		cpu[i] = cpuTime(t) - before
		wall := time.Since(start)
		srv.Close()
		if err != nil {
			t.Fatalf("%s child: %v\n%s", mode, err, out.String())
		}
		t.Logf("%s: %d reads of 64 B by another process in %v; target CPU %v (%.2f µs/read); child: %s",
			mode, reads, wall.Round(time.Millisecond), cpu[i], float64(cpu[i].Nanoseconds())/1e3/float64(reads),
			strings.TrimSpace(lastLine(out.String())))
	}
	if cpu[0]*5 >= cpu[1] {
		t.Fatalf("target CPU for 1M reads over shm %v is not under a fifth of for 100k over TCP %v", cpu[0], cpu[1])
	}
}

func lastLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "child:") {
			return strings.TrimPrefix(l, "child:")
		}
	}
	return s
}

// readerChild is the second process of TestShmTargetCPUIdle.
func readerChild(t *testing.T, env string) {
	var mode, addr string
	var key uint64
	var reads int
	f := strings.Split(env, ",")
	if len(f) != 4 {
		t.Fatalf("bad %s %q", childEnv, env)
	}
	mode, addr = f[0], f[1]
	fmt.Sscan(f[2], &key)
	fmt.Sscan(f[3], &reads)
	ep, err := NewEndpoint(Options{Fabric: Fabric(mode)})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctx := context.Background()
	c, err := ep.Dial(ctx, addr, discard{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RemoteAddr().Network(); (got == "unix") != (mode == string(FabricShm)) {
		t.Fatalf("fabric %s connected over %s", mode, got)
	}
	dst := make([]byte, 64)
	before := cpuTime(t)
	start := time.Now()
	for i := range reads {
		off := uint64(i*64) % (1<<16 - 64)
		if err := c.Read(ctx, key, off, dst); err != nil {
			t.Fatal(err)
		}
		if dst[0] != byte(off%251) {
			t.Fatalf("read %d: byte %d, want %d", i, dst[0], off%251)
		}
	}
	fmt.Printf("child: %.2f µs/read, child CPU %v\n", float64(time.Since(start).Nanoseconds())/1e3/float64(reads), cpuTime(t)-before)
}

// TestShmRevocationRace: a peer reading as fast as it can while the
// owner deregisters, then overwrites the memory, never sees the bytes
// written after Deregister returned (the revoked flag and in-use count
// order every copy before or after it).
func TestShmRevocationRace(t *testing.T) {
	ctx := context.Background()
	srv, cli, pc := pair(t, Options{Fabric: FabricShm}, newCollector())
	for i := range 50 {
		c, err := cli.Dial(ctx, pc.Addr(), newCollector())
		if err != nil {
			t.Fatal(err)
		}
		mem, _ := srv.Alloc(4096)
		for j := range mem {
			mem[j] = 'A'
		}
		r := srv.Register(mem, RemoteRead)
		if err := c.Read(ctx, r.Key(), 0, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		saw := make(chan error, 1)
		go func() {
			dst := make([]byte, 4096)
			for n := 0; ; n++ {
				if err := c.Read(ctx, r.Key(), 0, dst); err != nil {
					var ae *AccessError
					if !errors.As(err, &ae) {
						saw <- fmt.Errorf("read %d: %v, want an access error", n, err)
						return
					}
					saw <- nil
					return
				}
				if i := bytes.IndexByte(dst, 'B'); i >= 0 {
					saw <- fmt.Errorf("read %d saw a byte written after Deregister at %d", n, i)
					return
				}
			}
		}()
		time.Sleep(time.Duration(i%5) * time.Millisecond)
		srv.Deregister(r)
		for j := range mem {
			mem[j] = 'B'
		}
		if err := <-saw; err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzShmGrantAnswer: whatever a target answers to a grant request (any
// bytes, 0 to 3 descriptors of sealed memory files of any size), the
// initiator either maps a region it can access within what it mapped or
// fails with an error, and leaks no descriptor.
func FuzzShmGrantAnswer(f *testing.F) {
	ok := make([]byte, grantRespSize)
	ok[1] = byte(RemoteRead | RemoteWrite)
	binary.LittleEndian.PutUint64(ok[8:], 4096)
	f.Add(ok, uint8(2), uint16(1))
	f.Add(ok[:5], uint8(2), uint16(1))
	f.Add([]byte{grantNone}, uint8(0), uint16(0))
	f.Add(bytes.Repeat([]byte{0xff}, grantRespSize), uint8(3), uint16(16))
	f.Fuzz(func(t *testing.T, resp []byte, nfds uint8, pages uint16) {
		if len(resp) > grantRespSize {
			resp = resp[:grantRespSize]
		}
		before := openFds(t)
		x, y, err := socketPair()
		if err != nil {
			t.Fatal(err)
		}
		z, w, _ := socketPair()
		o := Options{HandshakeTimeout: 200 * time.Millisecond}
		o.fill()
		s := newShmEnd(&o, x, z)
		answered := make(chan struct{})
		go func() {
			defer close(answered)
			q := make([]byte, grantReqSize)
			y.Read(q)
			var fds []int
			for range nfds % 4 {
				fd, err := newMemfd("fuzz", int(pages%64+1)*4096, true)
				if err != nil {
					return
				}
				fds = append(fds, fd)
			}
			y.WriteMsgUnix(resp, unix.UnixRights(fds...), nil)
			closeFds(fds)
		}()
		if err := s.fetch(context.Background(), 7); err == nil {
			s.mu.RLock()
			m := s.maps[7]
			s.mu.RUnlock()
			if m == nil {
				t.Fatal("fetch succeeded without a mapping")
			}
			if m.mem != nil {
				// Every byte the grant allows must be readable.
				buf := make([]byte, m.n)
				if err := m.copy(0, buf, RemoteRead); err != nil {
					t.Fatalf("granted region unreadable: %v", err)
				}
			}
		}
		<-answered
		s.close()
		y.Close()
		w.Close()
		if after := openFds(t); after > before {
			t.Fatalf("%d descriptors leaked", after-before)
		}
	})
}

// FuzzShmControlRequest: whatever a peer writes on its control socket,
// the target answers or fails that connection with a protocol error, and
// goes on serving others.
func FuzzShmControlRequest(f *testing.F) {
	req := make([]byte, grantReqSize)
	copy(req, grantMagic[:])
	f.Add(req)
	f.Add(append(req, req...))
	f.Add([]byte("GET / HTTP/1.0\r\n\r\n"))
	f.Add(req[:7])
	f.Fuzz(func(t *testing.T, b []byte) {
		col := newCollector()
		srv, _, pc := pair(t, Options{Fabric: FabricShm}, col)
		mem, _ := srv.Alloc(64)
		r := srv.Register(mem, RemoteRead)
		t.Cleanup(func() { srv.Deregister(r); srv.Free(mem) })
		s := shmEndOf(pc.Conn)
		s.req.Write(b)
		if len(b) >= grantReqSize {
			select {
			case err := <-col.closed:
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("closed with %v", err)
				}
			case <-time.After(100 * time.Millisecond):
			}
		}
		c, err := srv.Dial(context.Background(), pc.Addr(), newCollector())
		if err != nil {
			t.Fatalf("the endpoint stopped accepting: %v", err)
		}
		_ = c
		other, _ := NewEndpoint(Options{Fabric: FabricShm})
		defer other.Close()
		oc, err := other.Dial(context.Background(), pc.Addr(), newCollector())
		if err != nil {
			t.Fatal(err)
		}
		if err := oc.Read(context.Background(), r.Key(), 0, make([]byte, 8)); err != nil {
			t.Fatalf("the endpoint stopped serving: %v", err)
		}
	})
}

// TestShmNoDescriptorLeak: endpoints that connected over shared memory,
// granted and mapped regions, and closed leave no descriptor open (the
// control sockets, memory files and control pages all go, the files of
// allocations never freed included, and a connection refused past
// MaxConns).
func TestShmNoDescriptorLeak(t *testing.T) {
	ctx := context.Background()
	// No collection: a net.Conn's finalizer would close a descriptor
	// leaked by the code.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	before := openFds(t)
	for i := range 20 {
		srv, _ := NewEndpoint(Options{Fabric: FabricShm, MaxConns: 1})
		addr, err := srv.Listen("127.0.0.1:0", newCollector())
		if err != nil {
			t.Fatal(err)
		}
		cli, _ := NewEndpoint(Options{Fabric: FabricShm})
		c, err := cli.Dial(ctx, addr.String(), newCollector())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Dial(ctx, addr.String(), newCollector()); err == nil {
			t.Fatal("a connection past MaxConns was admitted")
		}
		mem, _ := srv.Alloc(4096)
		r := srv.Register(mem, RemoteRead)
		if err := c.Read(ctx, r.Key(), 0, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
		cli.Close()
		srv.Close()
		if i%2 == 0 { // else: never freed, its file closed by Close
			srv.Deregister(r)
			if err := srv.Free(mem); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for openFds(t) > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors left open by 20 closed endpoint pairs", openFds(t)-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestShmRevokedMappingsDropped: a peer does not keep the mappings of
// regions revoked since it mapped them (a long connection to an owner
// that registers and frees many regions would otherwise pile them up).
func TestShmRevokedMappingsDropped(t *testing.T) {
	ctx := context.Background()
	srv, _, pc := pair(t, Options{Fabric: FabricShm}, newCollector())
	s := shmEndOf(pc.Conn)
	for i := range 100 {
		mem, _ := srv.Alloc(4096)
		r := srv.Register(mem, RemoteRead)
		if err := pc.Read(ctx, r.Key(), 0, make([]byte, 8)); err != nil {
			t.Fatalf("region %d: %v", i, err)
		}
		srv.Deregister(r)
		srv.Free(mem)
	}
	s.mu.RLock()
	n := len(s.maps)
	s.mu.RUnlock()
	if n > 1 {
		t.Fatalf("%d mappings kept for 100 regions revoked one after another", n)
	}
}

// rawShmPeer connects to an endpoint's shared-memory socket by hand
// (preamble, hello) and returns the packet stream.
func rawShmPeer(t *testing.T, addr net.Addr) *net.UnixConn {
	t.Helper()
	ta := addr.(*net.TCPAddr)
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: shmName(ta.IP, ta.Port), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var mine, theirs [2]int
	for i := range mine {
		p, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		mine[i], theirs[i] = p[0], p[1]
	}
	uc.WriteMsgUnix(preambleMagic[:], unix.UnixRights(theirs[:]...), nil)
	closeFds(theirs[:])
	t.Cleanup(func() { uc.Close(); closeFds(mine[:]) })
	var h [helloSize]byte
	copy(h[:], helloMagic[:])
	binary.LittleEndian.PutUint32(h[4:], DefaultMTU)
	binary.LittleEndian.PutUint32(h[8:], 16)
	uc.Write(h[:])
	if _, err := io.ReadFull(uc, h[:]); err != nil {
		t.Fatal(err)
	}
	return uc
}

// TestShmStalledAndIdlePeers: over shared memory as over TCP, a peer
// that stops in the middle of a packet loses its connection after the
// stall timeout, and one that sends nothing after the idle timeout.
func TestShmStalledAndIdlePeers(t *testing.T) {
	col := newCollector()
	srv, err := NewEndpoint(Options{Fabric: FabricShm, StallTimeout: 200 * time.Millisecond, IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, _ := srv.Listen("127.0.0.1:0", col)
	idle := rawShmPeer(t, addr)
	stalled := rawShmPeer(t, addr)
	h := make([]byte, HeaderSize)
	putHeader(h, header{kind: KindSend, flags: FlagFirst | FlagLast, length: 4096, id: 1})
	stalled.Write(append(h, 1, 2, 3)) // header plus 3 of 4096 bytes, then nothing
	select {
	case err := <-col.closed:
		if !errors.Is(err, ErrStalled) {
			t.Fatalf("closed for %v, want ErrStalled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stalled connection still open")
	}
	putHeader(h, header{kind: KindSend, flags: FlagFirst | FlagLast, length: 2, id: 9})
	idle.Write(append(h, 'h', 'i'))
	select {
	case id := <-col.done:
		if id != 9 {
			t.Fatalf("got message %d", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("idle connection was closed with the stalled one")
	}
	idle.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: %v, want it closed (EOF) after the idle timeout", err)
	}
}

// TestRepeatedGrantsKeepOneSlot: a peer asking for the same region's
// memory again and again (a hostile one, forgetting its mapping each
// time) is given the one grant it has, and holding all of them in use
// delays Deregister by one WriteTimeout and one grace, not one each
// (before: a slot per request, and about WriteTimeout + k seconds).
func TestRepeatedGrantsKeepOneSlot(t *testing.T) {
	ctx := context.Background()
	h := make(connOf, 1)
	srv, _, pc := pair(t, Options{Fabric: FabricShm, WriteTimeout: 200 * time.Millisecond}, h)
	pc.Send(pc.NewID(), []byte("hi"))
	<-h
	mem, err := srv.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	r := srv.Register(mem, RemoteRead)
	s := shmEndOf(pc.Conn)
	const k = 6
	var holds []*uint32
	for range k {
		if err := pc.Read(ctx, r.Key(), 0, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		holds = append(holds, s.maps[r.Key()].inUse)
		delete(s.maps, r.Key()) // ask again
		s.mu.Unlock()
	}
	r.mu.Lock()
	n := len(r.grants)
	r.mu.Unlock()
	if n != 1 {
		t.Errorf("%d grants recorded for one connection's %d requests, want 1", n, k)
	}
	for _, p := range holds {
		atomic.AddUint32(p, 1)
	}
	start := time.Now()
	srv.Deregister(r)
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Deregister took %v with %d requests of one held connection, want about 1.2 s", d, k)
	}
}

// TestAllocReadOnlyStaysReadOnly: a peer given read-only shared memory
// (AllocReadOnly) cannot make it writable by reopening its descriptor
// through /proc (memory files are mode 0777): no writable mapping, no
// write — while the owner's own mapping still writes. (With Alloc the
// reopened file maps writable and the owner sees the peer's bytes.)
func TestAllocReadOnlyStaysReadOnly(t *testing.T) {
	ep, err := NewEndpoint(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	mem, err := ep.AllocReadOnly(4096)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem, "node's bytes")
	ep.mems.mu.Lock()
	m := ep.mems.m[&mem[0]]
	ep.mems.mu.Unlock()
	ro := ep.mems.dup(m, false) // what a read-only grant sends
	defer unix.Close(ro)
	rw, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", ro), unix.O_RDWR, 0)
	if err == nil {
		defer unix.Close(rw)
		if w, err := unix.Mmap(rw, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			copy(w, "PEER WROTE!!")
			unix.Munmap(w)
			t.Fatalf("the reopened file mapped writable; the owner now sees %q", mem[:12])
		}
		if _, err := unix.Pwrite(rw, []byte("PEER"), 0); err == nil {
			t.Fatalf("the reopened file took a write; the owner sees %q", mem[:12])
		}
	}
	copy(mem, "still mine")
	if string(mem[:10]) != "still mine" {
		t.Fatal("the owner's mapping no longer writes")
	}
}

package main

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// The fabric's TCP framing, written out here independently of package
// fabric so the test speaks the wire format itself (see
// internal/fabric/packet.go).
const (
	pkSend     = 1
	pkWrite    = 2
	pkReadReq  = 3
	pkAccessEr = 6

	flFirst = 1
	flLast  = 2
)

// rawConn is a hand-driven fabric connection to a storage node.
type rawConn struct {
	t       *testing.T
	c       net.Conn
	peerMTU int
}

// dialRaw connects and exchanges hellos ("SLF" 1, MTU, quota, reserved).
func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var hello [16]byte
	copy(hello[:], "SLF\x01")
	binary.LittleEndian.PutUint32(hello[4:], 64<<10)
	binary.LittleEndian.PutUint32(hello[8:], 16)
	if _, err := c.Write(hello[:]); err != nil {
		t.Fatal(err)
	}
	r := &rawConn{t: t, c: c}
	r.peerMTU = r.readHello()
	return r
}

// dialBare connects without a hello.
func dialBare(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c}
}

func (r *rawConn) readHello() int {
	r.t.Helper()
	var peer [16]byte
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.c, peer[:]); err != nil {
		r.t.Fatalf("reading the node's hello: %v", err)
	}
	if string(peer[:4]) != "SLF\x01" {
		r.t.Fatalf("node hello %q", peer[:])
	}
	mtu := int(binary.LittleEndian.Uint32(peer[4:]))
	if mtu < 512 || mtu > 1<<20 {
		r.t.Fatalf("node announced MTU %d", mtu)
	}
	return mtu
}

func (r *rawConn) packet(kind, flags byte, id uint64, payload []byte) {
	r.t.Helper()
	r.frame(kind, flags, id, uint32(len(payload)), payload)
}

// frame writes a packet header declaring length and then payload (which
// may be shorter: a truncated packet).
func (r *rawConn) frame(kind, flags byte, id uint64, length uint32, payload []byte) {
	r.t.Helper()
	var h [16]byte
	h[0], h[1] = kind, flags
	binary.LittleEndian.PutUint32(h[4:], length)
	binary.LittleEndian.PutUint64(h[8:], id)
	r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(append(h[:], payload...)); err != nil {
		r.t.Fatalf("sending: %v", err)
	}
}

// readPacket reads one packet; err is the connection's error if it ends.
func (r *rawConn) readPacket(timeout time.Duration) (kind, flags byte, id uint64, payload []byte, err error) {
	r.c.SetReadDeadline(time.Now().Add(timeout))
	var h [16]byte
	if _, err = io.ReadFull(r.c, h[:]); err != nil {
		return
	}
	kind, flags, id = h[0], h[1], binary.LittleEndian.Uint64(h[8:])
	n := binary.LittleEndian.Uint32(h[4:])
	if n > 2<<20 {
		err = fmt.Errorf("packet of %d bytes", n)
		return
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(r.c, payload)
	return
}

// reply waits for the node's reply to request id: a one-packet message
// carrying a wire reply. It returns the reply and its text.
func (r *rawConn) reply(id uint64) (wire.Reply, string) {
	r.t.Helper()
	kind, flags, got, payload, err := r.readPacket(10 * time.Second)
	if err != nil {
		r.t.Fatalf("waiting for the reply to request %d: %v", id, err)
	}
	if kind != pkSend || flags&flFirst == 0 || got != id {
		r.t.Fatalf("reply to request %d: packet kind %d flags %d id %d", id, kind, flags, got)
	}
	var rep wire.Reply
	if err := wire.ParseReply(payload, &rep); err != nil {
		r.t.Fatalf("reply to request %d does not parse: %v (%x)", id, err, payload)
	}
	return rep, string(rep.Msg)
}

// expectStatus waits for a reply with status want whose text contains
// each of texts.
func (r *rawConn) expectStatus(id uint64, want wire.Status, texts ...string) {
	r.t.Helper()
	rep, msg := r.reply(id)
	if rep.Status != want {
		r.t.Errorf("request %d: status %v (%q), want %v", id, rep.Status, msg, want)
		return
	}
	for _, s := range texts {
		if !strings.Contains(msg, s) {
			r.t.Errorf("request %d: %v reply %q does not mention %q", id, rep.Status, msg, s)
		}
	}
}

// expectClosed reads until the node closes the connection; it returns
// the kinds of packets seen before.
func (r *rawConn) expectClosed(what string) []byte {
	r.t.Helper()
	var kinds []byte
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		kind, _, _, _, err := r.readPacket(time.Until(deadline))
		if err == nil {
			kinds = append(kinds, kind)
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			break
		}
		return kinds // EOF or reset: closed
	}
	r.t.Errorf("%s: the node kept the connection open (packets seen: %v)", what, kinds)
	return kinds
}

// forgedCap is a well-formed capability for chunk on node with a random
// MAC (or one minted with keys, if given).
func forgedCap(t *testing.T, node ids.NodeID, chunk ids.ChunkID, rights capability.Rights, expiry time.Time, keys *capability.Keyring) []byte {
	t.Helper()
	c := capability.Capability{Rights: rights, KeyID: 1, Client: 1, Ino: 2, Chunk: chunk, Off: 0, Len: 64 << 20,
		Expiry: expiry.UnixNano(), Epoch: 1}
	if err := c.SetReplicas([]ids.NodeID{node}); err != nil {
		t.Fatal(err)
	}
	if keys != nil {
		return keys.Mint(&c)
	}
	rand.Read(c.MAC[:])
	return c.AppendBinary(nil)
}

func writeHeader(t *testing.T, chunk ids.ChunkID, off, n uint64, capb []byte, addr string) []byte {
	t.Helper()
	h, err := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Off: off, Len: n, Cap: capb}, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// committed asks the node at addr (node id node) for a chunk's committed
// version and length, with a zero-length read signed by the cluster's key:
// the node's own view, which a chunk file's size is not (a recycled file
// keeps stale bytes past the committed length).
func committed(t *testing.T, addr string, node ids.NodeID, chunk ids.ChunkID, keys *capability.Keyring) (version, length uint64) {
	t.Helper()
	r := dialRaw(t, addr)
	defer r.c.Close()
	h, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: chunk, Cap: forgedCap(t, node, chunk, capability.Read, time.Now().Add(time.Minute), keys)})
	if err != nil {
		t.Fatal(err)
	}
	r.packet(pkSend, flFirst|flLast, 1, h)
	rep, msg := r.reply(1)
	if rep.Status != wire.StatusOK {
		t.Fatalf("stat of chunk %v on %v: %v %q", chunk, node, rep.Status, msg)
	}
	return rep.Version, rep.ChunkLen
}

// sendWrite sends a write message: header, then data in packets of 4 KiB.
func (r *rawConn) sendWrite(id uint64, hdr, data []byte) {
	r.t.Helper()
	r.packet(pkSend, flFirst, id, hdr)
	for off := 0; off < len(data); off += 4096 {
		end := min(off+4096, len(data))
		var fl byte
		if end == len(data) {
			fl = flLast
		}
		r.packet(pkSend, fl, id, data[off:end])
	}
}

// TestHostileDataPlane sends malformed and forged traffic straight to a
// storage node's fabric port. The node must refuse or hang up, write
// nothing, and keep serving everyone else.
func TestHostileDataPlane(t *testing.T) {
	base := baseDir(t)
	dir := filepath.Join(base, "data")
	// Requests silent for 1 s mid-message are cleaned up.
	c := startUp(t, dir, 3, "--idle-timeout", "1s")
	conf := c.conf
	mc := metaClient(t, conf)
	dirs := nodeDirs(t, filepath.Join(dir, "node1"), filepath.Join(dir, "node2"), filepath.Join(dir, "node3"))

	// A victim file whose chunk the forged writes aim at.
	victimData := randomBytes(t, 256<<10)
	mustRun(t, conf, bytes.NewReader(victimData), "put", "-", "/victim")
	_, layout := layoutOf(t, mc, "/victim")
	if len(layout) != 1 {
		t.Fatalf("victim has %d chunks", len(layout))
	}
	victimChunk := layout[0].Chunk
	head := layout[0].Replicas[0].Node // rank 0: where a client's write goes
	addr := c.nodes[head]
	storeDir := filepath.Join(dirs[head], "store")
	before := map[ids.NodeID]map[string]string{}
	for id, d := range dirs {
		before[id] = snapshotDir(t, filepath.Join(d, "store", "chunks"))
	}
	evil := bytes.Repeat([]byte("EVIL"), 16<<10/4)
	far := time.Now().Add(time.Hour)

	// A slow-loris: a packet header promising 4 KiB, then silence. It is
	// held open through every case below.
	loris := dialRaw(t, addr)
	loris.frame(pkSend, flFirst, 1, 4096, []byte{byte(wire.OpWrite), 1, 0})
	lorisSince := time.Now()

	t.Run("garbage instead of a hello", func(t *testing.T) {
		r := dialBare(t, addr)
		r.c.Write(append([]byte("GARBAGE!"), randomBytes(t, 56)...))
		// The node sends its own hello first, then hangs up.
		var hello [16]byte
		r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(r.c, hello[:]); err == nil && string(hello[:3]) != "SLF" {
			t.Errorf("node answered garbage with %q", hello)
		}
		r.expectClosed("garbage hello")
	})

	t.Run("bad MTU in the hello", func(t *testing.T) {
		r := dialBare(t, addr)
		var hello [16]byte
		copy(hello[:], "SLF\x01")
		binary.LittleEndian.PutUint32(hello[4:], 3) // below the minimum
		r.c.Write(hello[:])
		r.readHello()
		r.expectClosed("MTU 3")
	})

	t.Run("garbage after the hello", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.c.Write(randomBytes(t, 200))
		r.expectClosed("random bytes")
		// An unknown packet kind with a valid shape.
		r = dialRaw(t, addr)
		r.packet(0x7e, flFirst|flLast, 1, []byte{1, 2, 3})
		r.expectClosed("packet kind 0x7e")
		// Reserved flag bits.
		r = dialRaw(t, addr)
		r.packet(pkSend, 0x80|flFirst|flLast, 1, []byte{byte(wire.OpRead)})
		r.expectClosed("reserved flags")
	})

	t.Run("oversized and truncated packets", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.frame(pkSend, flFirst|flLast, 1, uint32(r.peerMTU)+1, nil)
		r.expectClosed("packet larger than the MTU")
		r = dialRaw(t, addr)
		r.frame(pkSend, flFirst|flLast, 1, 1<<31, nil)
		r.expectClosed("packet of 2 GiB")
		// A truncated packet, then the client hangs up its side.
		r = dialRaw(t, addr)
		r.frame(pkSend, flFirst|flLast, 1, 1000, make([]byte, 10))
		r.c.(*net.TCPConn).CloseWrite()
		r.expectClosed("truncated packet")
		// A write header, some data, and the connection ends mid-message.
		r = dialRaw(t, addr)
		capb := forgedCap(t, head, victimChunk, capability.Write, far, nil)
		r.packet(pkSend, flFirst, 2, writeHeader(t, victimChunk, 0, 1<<20, capb, addr))
		r.packet(pkSend, 0, 2, evil)
		r.c.(*net.TCPConn).CloseWrite()
		// The refusal is posted asynchronously and the connection closes
		// on the EOF, so the reply may or may not make it out first.
		kinds := r.expectClosed("message cut short")
		t.Logf("forged write cut short by a half-close: node sent packet kinds %v before closing", kinds)
	})

	t.Run("packet of a message that never started", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.packet(pkSend, 0, 9, evil[:100])
		r.expectClosed("middle packet without a first packet")
		r = dialRaw(t, addr)
		r.packet(pkSend, flLast, 9, evil[:100])
		r.expectClosed("last packet without a first packet")
		// A second first packet while a message is open.
		r = dialRaw(t, addr)
		r.packet(pkSend, flFirst, 3, []byte{0x7f, 0, 0})
		r.packet(pkSend, flFirst, 4, []byte{0x7f, 0, 0})
		kinds := r.expectClosed("nested first packet")
		t.Logf("nested first packet: the node sent %v before closing", kinds)
	})

	t.Run("unknown op class", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.packet(pkSend, flFirst|flLast, 5, []byte{0x7f, 1, 2, 3})
		r.expectStatus(5, wire.StatusUnknownOp, "127")
		// With data packets: refused once, the rest dropped, and the
		// connection carries the next request normally.
		r.packet(pkSend, flFirst, 6, []byte{0xff})
		r.packet(pkSend, 0, 6, evil[:1000])
		r.packet(pkSend, flLast, 6, evil[:1000])
		r.expectStatus(6, wire.StatusUnknownOp)
		r.packet(pkSend, flFirst|flLast, 7, []byte{byte(wire.OpReply), 0})
		r.expectStatus(7, wire.StatusUnknownOp)
		r.packet(pkSend, flFirst|flLast, 8, nil)
		r.expectStatus(8, wire.StatusBadRequest)
	})

	t.Run("malformed headers", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.packet(pkSend, flFirst|flLast, 1, []byte{byte(wire.OpWrite), 1, 0, 1, 0, 0})
		r.expectStatus(1, wire.StatusBadRequest)
		r.packet(pkSend, flFirst|flLast, 2, []byte{byte(wire.OpRead), 0, 0})
		r.expectStatus(2, wire.StatusBadRequest)
		// A write header whose replica list is cut.
		h := writeHeader(t, victimChunk, 0, 16, forgedCap(t, head, victimChunk, capability.Write, far, nil), addr)
		r.packet(pkSend, flFirst, 3, h[:len(h)-3])
		r.packet(pkSend, flLast, 3, evil[:16])
		r.expectStatus(3, wire.StatusBadRequest)
		// A capability with a bad version byte.
		capb := forgedCap(t, head, victimChunk, capability.Write, far, nil)
		capb[0] = 9
		r.sendWrite(4, writeHeader(t, victimChunk, 0, 16, capb, addr), evil[:16])
		r.expectStatus(4, wire.StatusAuth, "malformed")
	})

	t.Run("forged write capability", func(t *testing.T) {
		r := dialRaw(t, addr)
		// Over the victim's committed bytes (staged overwrite) ...
		r.sendWrite(10, writeHeader(t, victimChunk, 0, uint64(len(evil)), forgedCap(t, head, victimChunk, capability.Write, far, nil), addr), evil)
		r.expectStatus(10, wire.StatusAuth, "MAC")
		// ... past its end (the append region, straight into the file) ...
		r.sendWrite(11, writeHeader(t, victimChunk, 1<<20, uint64(len(evil)), forgedCap(t, head, victimChunk, capability.Write, far, nil), addr), evil)
		r.expectStatus(11, wire.StatusAuth, "MAC")
		// ... and into a chunk that does not exist.
		r.sendWrite(12, writeHeader(t, 0xdead0000, 0, uint64(len(evil)), forgedCap(t, head, 0xdead0000, capability.Write, far, nil), addr), evil)
		r.expectStatus(12, wire.StatusAuth, "MAC")
		// A forged read capability gets no data either.
		rh, _ := wire.AppendRead(nil, &wire.ReadHeader{Chunk: victimChunk, Off: 0, Len: 4096, Cap: forgedCap(t, head, victimChunk, capability.Read, far, nil)})
		r.packet(pkSend, flFirst|flLast, 13, rh)
		r.expectStatus(13, wire.StatusAuth, "MAC")
		// An unknown key id.
		capb := forgedCap(t, head, victimChunk, capability.Write, far, nil)
		binary.LittleEndian.PutUint32(capb[4:], 77)
		r.sendWrite(14, writeHeader(t, victimChunk, 0, 16, capb, addr), evil[:16])
		r.expectStatus(14, wire.StatusAuth, "key")
	})

	// The same checks with capabilities minted under the real key (read
	// from the node's data directory, as only its owner could): this
	// proves the requests above were refused for their MAC, not for a
	// mistake in this test's encoding.
	keys := nodeKeyring(t, dirs[head])
	const ctrlChunk = ids.ChunkID(0x5eed0000)
	t.Run("genuine capabilities", func(t *testing.T) {
		r := dialRaw(t, addr)
		// Expired.
		r.sendWrite(20, writeHeader(t, ctrlChunk, 0, 16, forgedCap(t, head, ctrlChunk, capability.Write, time.Now().Add(-time.Minute), keys), addr), evil[:16])
		r.expectStatus(20, wire.StatusAuth, "expired")
		// For another chunk than the header's.
		r.sendWrite(21, writeHeader(t, victimChunk, 0, 16, forgedCap(t, head, ctrlChunk, capability.Write, far, keys), addr), evil[:16])
		r.expectStatus(21, wire.StatusAuth, "scope")
		// Read-only, used to write.
		r.sendWrite(22, writeHeader(t, ctrlChunk, 0, 16, forgedCap(t, head, ctrlChunk, capability.Read, far, keys), addr), evil[:16])
		r.expectStatus(22, wire.StatusAuth, "scope")
		// Naming another node.
		r.sendWrite(23, writeHeader(t, ctrlChunk, 0, 16, forgedCap(t, head+1, ctrlChunk, capability.Write, far, keys), addr), evil[:16])
		r.expectStatus(23, wire.StatusAuth)
		// Valid: the write is stored. (A chunk meta does not know of; it
		// only exists on this node.)
		ctrl := randomBytes(t, 10000)
		r.sendWrite(24, writeHeader(t, ctrlChunk, 0, uint64(len(ctrl)), forgedCap(t, head, ctrlChunk, capability.Write, far, keys), addr), ctrl)
		rep, msg := r.reply(24)
		if rep.Status != wire.StatusOK || rep.Version != 1 || rep.ChunkLen != uint64(len(ctrl)) {
			t.Fatalf("genuine write: status %v %q version %d length %d", rep.Status, msg, rep.Version, rep.ChunkLen)
		}
		p := filepath.Join(storeDir, "chunks", fmt.Sprintf("%02x", uint64(ctrlChunk)&0xff), chunkFileName(ctrlChunk))
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, ctrl) {
			t.Errorf("genuine write: chunk file %s: %v, %d bytes, want %d", p, err, len(got), len(ctrl))
		}
		// Read it back inline (no region key): reply then the data.
		rh, _ := wire.AppendRead(nil, &wire.ReadHeader{Chunk: ctrlChunk, Off: 0, Len: uint64(len(ctrl)), Cap: forgedCap(t, head, ctrlChunk, capability.Read, far, keys)})
		r.packet(pkSend, flFirst|flLast, 25, rh)
		var rr wire.Reply
		_, flags, _, payload, err := r.readPacket(10 * time.Second)
		if err != nil || wire.ParseReply(payload, &rr) != nil || rr.Status != wire.StatusOK {
			t.Fatalf("genuine read: %v %v", err, rr.Status)
		}
		var data []byte
		for flags&flLast == 0 {
			_, flags, _, payload, err = r.readPacket(10 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			data = append(data, payload...)
		}
		if !bytes.Equal(data[:min(len(data), len(ctrl))], ctrl) || int(rr.DataLen) != len(data) {
			t.Errorf("genuine read returned %d bytes (reply says %d), want %d", len(data), rr.DataLen, len(ctrl))
		}
	})

	// Erasure-coded traffic: a genuine EC capability naming this node as
	// the parity unit (unit 2 of RS(2,1)) and two other (absent) nodes.
	const ecChunk = ids.ChunkID(0xec000000)
	ecCap := func(rights capability.Rights) []byte {
		c := capability.Capability{Rights: rights, Fanout: plan.FanoutEC, Data: 2, KeyID: 1, Client: 1, Ino: 2, Chunk: ecChunk,
			Len: 64 << 20, Expiry: far.UnixNano(), Epoch: 1}
		if err := c.SetReplicas([]ids.NodeID{head + 100, head + 101, head}); err != nil {
			t.Fatal(err)
		}
		return keys.Mint(&c)
	}
	t.Run("erasure-coded headers", func(t *testing.T) {
		r := dialRaw(t, addr)
		addrs := []string{"127.0.0.1:1", "127.0.0.1:2", addr}
		// A partial parity from a client (no node seal).
		ph, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.EC, Rank: 2, Chunk: ecChunk, Len: 16, Version: 1, WriteID: 1,
			Cap: ecCap(capability.Write)}, addrs)
		var p wire.WriteHeader
		if err := wire.ParseWrite(ph, &p); err != nil {
			t.Fatal(err)
		}
		r.sendWrite(30, wire.AppendPartial(nil, &p, 2, 0, 1, 0), evil[:16])
		r.expectStatus(30, wire.StatusAuth, "only from a data unit's node")
		// ... with a made-up seal.
		r.sendWrite(31, wire.SealForward(wire.AppendPartial(nil, &p, 2, 0, 1, 0), func([]byte) (s [wire.SealSize]byte) { return }), evil[:16])
		r.expectStatus(31, wire.StatusAuth)
		// A parity unit asked to encode.
		eh, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.EC, Flags: wire.FlagEncode, Rank: 2, Chunk: ecChunk, Len: 16, Version: 1,
			WriteID: 1, Cap: ecCap(capability.Write)}, addrs)
		r.sendWrite(32, eh, evil[:16])
		r.expectStatus(32, wire.StatusBadRequest, "not a data unit")
		// A scaled read without a region, and one too long.
		sr, _ := wire.AppendRead(nil, &wire.ReadHeader{Scaled: true, Coef: 3, Chunk: ecChunk, Len: 16, Cap: ecCap(capability.Read)})
		r.packet(pkSend, flFirst|flLast, 33, sr)
		r.expectStatus(33, wire.StatusBadRequest, "scaled")
		sr, _ = wire.AppendRead(nil, &wire.ReadHeader{Scaled: true, Coef: 3, Chunk: ecChunk, Len: 8 << 20, RegionKey: 9, Cap: ecCap(capability.Read)})
		r.packet(pkSend, flFirst|flLast, 34, sr)
		r.expectStatus(34, wire.StatusBadRequest)
		// A repair with a client's read-write capability (no repair right,
		// which only meta's reconciliation holds), one naming a survivor
		// twice, and one asking this node to rebuild a unit it does not hold.
		rep := wire.RepairHeader{Unit: 2, Chunk: ecChunk, Version: 1, Len: 4096, Survivors: []byte{0, 1}, Cap: ecCap(capability.Read | capability.Write)}
		rh, _ := wire.AppendRepair(nil, &rep, addrs)
		r.packet(pkSend, flFirst|flLast, 35, rh)
		r.expectStatus(35, wire.StatusAuth, "scope")
		rep.Cap, rep.Survivors = ecCap(capability.Read|capability.Write|capability.Repair), []byte{0, 0}
		rh, _ = wire.AppendRepair(nil, &rep, addrs)
		r.packet(pkSend, flFirst|flLast, 36, rh)
		r.expectStatus(36, wire.StatusBadRequest, "twice")
		rep.Unit, rep.Survivors = 0, []byte{1, 2}
		rh, _ = wire.AppendRepair(nil, &rep, addrs)
		r.packet(pkSend, flFirst|flLast, 37, rh)
		r.expectStatus(37, wire.StatusAuth, "not unit 0")
		// Nothing of this chunk was stored.
		if v, _ := committed(t, addr, head, ecChunk, keys); v != 0 {
			t.Errorf("hostile EC traffic left chunk %v at version %d", ecChunk, v)
		}
	})

	const idleChunk = ids.ChunkID(0x1d1e0000)
	t.Run("idle request is cleaned up", func(t *testing.T) {
		// A genuine write that stops sending halfway: after the idle
		// timeout the node hangs up and throws away what it placed.
		r := dialRaw(t, addr)
		r.packet(pkSend, flFirst, 40, writeHeader(t, idleChunk, 0, 64<<10, forgedCap(t, head, idleChunk, capability.Write, far, keys), addr))
		r.packet(pkSend, 0, 40, evil)
		r.packet(pkSend, 0, 40, evil[:20000-len(evil)])
		start := time.Now()
		kinds := r.expectClosed("idle request")
		waited := time.Since(start)
		t.Logf("idle request: closed after %s (packets %v)", waited.Round(time.Millisecond), kinds)
		if waited < 500*time.Millisecond {
			t.Errorf("idle request closed after only %s with a 1 s idle timeout", waited)
		}
		p := filepath.Join(storeDir, "chunks", fmt.Sprintf("%02x", uint64(idleChunk)&0xff), chunkFileName(idleChunk))
		eventually(t, 5*time.Second, 50*time.Millisecond, func() (bool, string) {
			_, err := os.Stat(p)
			return errors.Is(err, os.ErrNotExist), fmt.Sprintf("chunk file of the abandoned write: %v", err)
		})
		// The chunk's write lock was released: a new write goes through
		// and the chunk holds exactly it.
		r = dialRaw(t, addr)
		data := randomBytes(t, 10000)
		r.sendWrite(41, writeHeader(t, idleChunk, 0, uint64(len(data)), forgedCap(t, head, idleChunk, capability.Write, far, keys), addr), data)
		if rep, msg := r.reply(41); rep.Status != wire.StatusOK || rep.Version != 1 {
			t.Fatalf("write after the abandoned one: %v %q version %d", rep.Status, msg, rep.Version)
		}
		// The chunk's committed bytes are exactly the new write (the file
		// may be longer: bytes past the committed length are stale and
		// never read).
		if got, err := os.ReadFile(p); err != nil || len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
			t.Errorf("chunk after abandoned + new write: %v, %d bytes, want %d", err, len(got), len(data))
		}
		if !strings.Contains(c.proc.stderrText(), "request aborted") {
			t.Errorf("the node did not log the aborted request")
		}
	})

	t.Run("one-sided access to unregistered regions", func(t *testing.T) {
		r := dialRaw(t, addr)
		pre := make([]byte, 16)
		rand.Read(pre)
		r.packet(pkWrite, 0, 30, append(pre, evil[:512]...))
		if kinds := r.expectClosed("one-sided WRITE"); !bytes.Contains(kinds, []byte{pkAccessEr}) {
			t.Errorf("one-sided WRITE to a random key: packets %v before close, want an access error", kinds)
		}
		r = dialRaw(t, addr)
		req := make([]byte, 24)
		rand.Read(req[:16])
		binary.LittleEndian.PutUint64(req[16:], 4096)
		r.packet(pkReadReq, 0, 31, req)
		if kinds := r.expectClosed("one-sided READ"); !bytes.Contains(kinds, []byte{pkAccessEr}) {
			t.Errorf("one-sided READ of a random key: packets %v before close, want an access error", kinds)
		}
	})

	// Nothing the forged requests sent reached any store: every chunk
	// file is as before (apart from the control write's own chunk).
	for id, d := range dirs {
		after := snapshotDir(t, filepath.Join(d, "store", "chunks"))
		for p, s := range after {
			if (strings.HasSuffix(p, chunkFileName(ctrlChunk)) || strings.HasSuffix(p, chunkFileName(idleChunk))) && id == head {
				continue
			}
			if before[id][p] != s {
				t.Errorf("node %v: %s changed or appeared: %s -> %s", id, p, before[id][p], s)
			}
		}
		for p := range before[id] {
			if _, ok := after[p]; !ok {
				t.Errorf("node %v: %s disappeared", id, p)
			}
		}
	}
	if got := mustRun(t, conf, nil, "get", "/victim", "-").stdout; !bytes.Equal(got, victimData) {
		t.Errorf("victim changed: %d bytes %s", len(got), sum(got))
	}
	checkReplicas(t, mc, dirs, "/victim", victimData)

	// The node still serves: a normal put and get through it.
	if c.proc.exited() {
		t.Fatalf("sluice up died: %v", c.proc.waitErr)
	}
	after := randomBytes(t, 300<<10)
	mustRun(t, conf, bytes.NewReader(after), "put", "-", "/after")
	if got := mustRun(t, conf, nil, "get", "/after", "-").stdout; !bytes.Equal(got, after) {
		t.Errorf("put/get after the attack: %d bytes", len(got))
	}
	checkReplicas(t, mc, dirs, "/after", after)
	if st := nodeStates(status(t, conf)); st[head] != "up" {
		t.Errorf("attacked node is %q", st[head])
	}

	// The slow-loris connection stopped inside a packet long ago. Nothing
	// below the engine times it out, so each such connection holds a
	// receive buffer and a goroutine for ever, and MaxConns of them lock
	// every client and peer replica out of the node.
	time.Sleep(time.Until(lorisSince.Add(3 * time.Second)))
	loris.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := loris.c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("a connection stalled inside a packet is still open after %s (idle timeout 1 s): the node never times out a partial packet",
			time.Since(lorisSince).Round(time.Millisecond))
	}
}

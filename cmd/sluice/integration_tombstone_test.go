package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/wire"
)

// Deleted chunks stay deleted (issue 15, defect 6): a write capability
// outlives its file by minutes, so nodes keep a tombstone for every
// chunk meta deleted and refuse writes to it; copies that escaped the
// deletion anyway are found by the nodes' inventories and collected
// after meta's grace period.

// threeNodes starts meta (with metaArgs) and three node processes (with
// nodeArgs).
func threeNodes(t *testing.T, metaArgs, nodeArgs []string) *splitCluster {
	t.Helper()
	c := startMeta(t, baseDir(t), metaArgs...)
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i), nodeArgs...)
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	return c
}

func (c *splitCluster) keys(t *testing.T) *capability.Keyring {
	t.Helper()
	for _, n := range c.nodes {
		return nodeKeyring(t, n.dir)
	}
	t.Fatal("no node to read capability keys from")
	return nil
}

// chunkHolders lists the nodes (data directories by id) holding a chunk
// file of chunk: one exists exactly while the store holds the chunk
// (deletion recycles it into the pool under another name).
func chunkHolders(t *testing.T, dirs map[ids.NodeID]string, chunk ids.ChunkID) []ids.NodeID {
	t.Helper()
	var out []ids.NodeID
	for id, d := range dirs {
		if _, ok := chunkFiles(t, filepath.Join(d, "store", "chunks"))[chunkFileName(chunk)]; ok {
			out = append(out, id)
		}
	}
	return out
}

// waitNoHolder waits until no node holds chunk.
func waitNoHolder(t *testing.T, dirs map[ids.NodeID]string, chunk ids.ChunkID, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, 100*time.Millisecond, func() (bool, string) {
		h := chunkHolders(t, dirs, chunk)
		return len(h) == 0, fmt.Sprintf("chunk %v still on %v", chunk, h)
	})
}

func (c *splitCluster) dirs() map[ids.NodeID]string {
	out := map[ids.NodeID]string{}
	for id, n := range c.nodes {
		out[id] = n.dir
	}
	return out
}

func (c *splitCluster) holders(t *testing.T, chunk ids.ChunkID) []ids.NodeID {
	t.Helper()
	return chunkHolders(t, c.dirs(), chunk)
}

func (c *splitCluster) waitDeleted(t *testing.T, chunk ids.ChunkID) {
	t.Helper()
	waitNoHolder(t, c.dirs(), chunk, 30*time.Second)
}

// writeLayout asks meta for a write layout of the file at path, as a
// writer would: chunk ids, replicas and write capabilities.
func writeLayout(t *testing.T, mc *metaapi.Client, path string, size int64) []metaapi.ChunkLayout {
	t.Helper()
	ctx := context.Background()
	var ar metaapi.AttrResp
	if err := mc.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(path), Follow: true}, &ar); err != nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	var lr metaapi.LayoutResp
	req := metaapi.LayoutReq{Ino: ar.Attr.Ino, Len: size, Write: true, Who: metaapi.Who{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}}
	if err := mc.Call(ctx, metaapi.OpLayout, req, &lr); err != nil {
		t.Fatalf("write layout of %s: %v", path, err)
	}
	return lr.Chunks
}

// TestReplayedWriteAfterRemove: a write capability captured while a file
// existed, replayed after the file was removed and its chunks deleted,
// is refused as gone; no node holds the chunk afterwards.
func TestReplayedWriteAfterRemove(t *testing.T) {
	c := threeNodes(t, nil, nil)
	keys := c.keys(t)
	mc := metaClient(t, c.conf)
	data := randomBytes(t, 256<<10)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/victim")
	ls := writeLayout(t, mc, "/victim", int64(len(data)))
	if len(ls) != 1 || len(ls[0].Replicas) != 3 {
		t.Fatalf("layout %+v", ls)
	}
	l := ls[0]
	var addrs []string
	for _, r := range l.Replicas {
		addrs = append(addrs, r.Addr)
	}
	head := l.Replicas[0]
	evil := randomBytes(t, 64<<10)
	replay := func(id uint64) (wire.Reply, string) {
		t.Helper()
		h, err := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: l.Chunk, Len: uint64(len(evil)), WriteID: id, Cap: l.Cap}, addrs)
		if err != nil {
			t.Fatal(err)
		}
		r := dialRaw(t, head.Addr)
		defer r.c.Close()
		r.sendWrite(id, h, evil)
		return r.reply(id)
	}
	// The captured capability is good while the file exists.
	if rep, msg := replay(1); rep.Status != wire.StatusOK {
		t.Fatalf("the captured capability while the file exists: %v %q", rep.Status, msg)
	}

	mustRun(t, c.conf, nil, "rm", "/victim")
	c.waitDeleted(t, l.Chunk)

	rep, msg := replay(2)
	if rep.Status != wire.StatusGone || !strings.Contains(msg, "deleted") {
		t.Errorf("the capability replayed after the remove: %v %q, want %v", rep.Status, msg, wire.StatusGone)
	}
	// Nothing re-created (a ring's head answers once every replica has
	// committed or refused).
	if h := c.holders(t, l.Chunk); len(h) != 0 {
		t.Errorf("chunk %v re-created on %v", l.Chunk, h)
	}
	for _, r := range l.Replicas {
		if v, n := committed(t, r.Addr, r.Node, l.Chunk, keys); v != 0 || n != 0 {
			t.Errorf("node %v holds chunk %v at version %d, %d bytes", r.Node, l.Chunk, v, n)
		}
	}
	checkClean(t, c.conf, 30*time.Second)
}

// TestRemoveWhileWriting: one client removes a file another is writing.
// The writer's next write fails with ENOENT saying what happened — not
// EIO, not a retry loop — and leaves nothing on any node; writes racing
// the removal leave nothing after the grace period either.
func TestRemoveWhileWriting(t *testing.T) {
	c := threeNodes(t, []string{"--orphan-grace", "3s"}, []string{"--inventory-interval", "1s"})
	conf, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	writer, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	remover, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		t.Fatal(err)
	}
	defer remover.Close()
	ctx := context.Background()
	mc := metaClient(t, c.conf)

	// 1. The remove completes (every node deleted the chunk) between
	// two writes.
	f, err := writer.Create(ctx, "/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(randomBytes(t, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	chunk := layoutChunk(t, mc, "/f")
	if err := remover.Remove(ctx, "/f"); err != nil {
		t.Fatal(err)
	}
	c.waitDeleted(t, chunk)
	start := time.Now()
	// A front end with a write-back cache (the mount) writes first and
	// records the size later (WriteData): the write itself must fail,
	// saying why.
	_, err = f.WriteData(ctx, randomBytes(t, 64<<10), 0)
	if !metaapi.IsCode(err, metaapi.ENOENT) || !strings.Contains(err.Error(), "removed while it was being written") {
		t.Errorf("WriteData after the remove: %v, want ENOENT saying the file was removed", err)
	}
	_, err = f.WriteAt(randomBytes(t, 1<<20), 1<<20)
	if !metaapi.IsCode(err, metaapi.ENOENT) {
		t.Errorf("WriteAt after the remove: %v, want ENOENT", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the failing writes took %s", d)
	}
	if h := c.holders(t, chunk); len(h) != 0 {
		t.Errorf("the refused writes re-created chunk %v on %v", chunk, h)
	}

	// 2. The remove lands while writes are in flight.
	g, err := writer.Create(ctx, "/g", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt(randomBytes(t, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	gchunk := layoutChunk(t, mc, "/g")
	errc := make(chan error, 1)
	started := make(chan struct{})
	buf := randomBytes(t, 256<<10)
	go func() {
		for i := int64(1); ; i++ {
			if _, err := g.WriteData(ctx, buf, (i*int64(len(buf)))%(32<<20)); err != nil {
				errc <- err
				return
			}
			if i == 2 {
				close(started)
			}
		}
	}()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("writing /g: %v", err)
	}
	if err := remover.Remove(ctx, "/g"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !metaapi.IsCode(err, metaapi.ENOENT) {
			t.Errorf("a write racing the remove: %v, want ENOENT", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the writer kept writing a removed file for a minute")
	}
	// Whatever a racing write left is collected: by the deletion, or
	// after the grace period by the inventory.
	waitNoHolder(t, c.dirs(), gchunk, 60*time.Second)
	checkClean(t, c.conf, 30*time.Second)
}

// TestFUSEWriteAfterRemoveElsewhere: a mount writing a file another
// mount removed gets ENOENT from fsync (its buffered writes reach the
// nodes then), and re-creates nothing.
func TestFUSEWriteAfterRemoveElsewhere(t *testing.T) {
	c, a := fuseCluster(t)
	b := mountAt(t, c.conf, "mnt-b")
	dirs := nodeDirs(t, filepath.Join(c.dir, "node1"), filepath.Join(c.dir, "node2"), filepath.Join(c.dir, "node3"))
	fd := openFD(t, filepath.Join(b.dir, "f"), unix.O_CREAT|unix.O_WRONLY, 0o644)
	pwrite(t, fd, randomBytes(t, 1<<20), 0)
	mustOK(t, "fsync on B", unix.Fsync(fd))
	chunk := layoutChunk(t, metaClient(t, c.conf), "/f")
	mustOK(t, "remove on A", os.Remove(filepath.Join(a.dir, "f")))
	waitNoHolder(t, dirs, chunk, 30*time.Second)
	pwrite(t, fd, randomBytes(t, 1<<20), 1<<20)
	wantErrno(t, "fsync on B after the remove on A", unix.Fsync(fd), syscall.ENOENT)
	if h := chunkHolders(t, dirs, chunk); len(h) != 0 {
		t.Errorf("B's write re-created chunk %v on %v", chunk, h)
	}
	checkClean(t, c.conf, 30*time.Second)
}

// layoutChunk is the chunk id of a one-chunk file.
func layoutChunk(t *testing.T, mc *metaapi.Client, path string) ids.ChunkID {
	t.Helper()
	_, ls := layoutOf(t, mc, path)
	if len(ls) != 1 {
		t.Fatalf("%s has %d chunks", path, len(ls))
	}
	return ls[0].Chunk
}

// strays asks meta what the nodes' inventories found.
func strays(t *testing.T, mc *metaapi.Client) metaapi.StraysResp {
	t.Helper()
	var r metaapi.StraysResp
	if err := mc.Call(context.Background(), metaapi.OpStrays, metaapi.StraysReq{}, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestStrayCopiesCollected: copies meta does not place on a node —
// planted there with capabilities minted by the cluster's key: a live
// file's chunk on a node outside its replica set, and a removed file's
// chunk on a node that never held it — are found by the node's
// inventory, kept through the grace period and collected after it. A
// chunk id meta never gave out is reported and kept. The live file is
// untouched.
func TestStrayCopiesCollected(t *testing.T) {
	const grace = 20 * time.Second
	c := threeNodes(t, []string{"--orphan-grace", grace.String()}, []string{"--inventory-interval", "1s"})
	keys := c.keys(t)
	mc := metaClient(t, c.conf)
	mustRun(t, c.conf, nil, "mkdir", "/one")
	mustRun(t, c.conf, nil, "policy", "set", "/one", "--replicas", "1")
	live := randomBytes(t, 100<<10)
	mustRun(t, c.conf, bytes.NewReader(live), "put", "-", "/one/live")
	mustRun(t, c.conf, bytes.NewReader(randomBytes(t, 10<<10)), "put", "-", "/one/dead")
	_, ll := layoutOf(t, mc, "/one/live")
	_, dl := layoutOf(t, mc, "/one/dead")
	liveChunk, liveNode := ll[0].Chunk, ll[0].Replicas[0].Node
	deadChunk, deadNode := dl[0].Chunk, dl[0].Replicas[0].Node
	mustRun(t, c.conf, nil, "rm", "/one/dead")
	c.waitDeleted(t, deadChunk)

	other := func(not ids.NodeID) *nodeProc {
		for id, n := range c.nodes {
			if id != not {
				return n
			}
		}
		t.Fatal("one node only")
		return nil
	}
	ahead := ids.ChunkID(1 << 40)
	plant := func(n *nodeProc, chunk ids.ChunkID) {
		t.Helper()
		stuff := randomBytes(t, 8<<10)
		r := dialRaw(t, n.addr)
		defer r.c.Close()
		r.sendWrite(1, writeHeader(t, chunk, 0, uint64(len(stuff)), forgedCap(t, n.id, chunk, capability.Write, time.Now().Add(time.Hour), keys), n.addr), stuff)
		r.expectStatus(1, wire.StatusOK)
	}
	notMember, unknown := other(liveNode), other(deadNode)
	plant(notMember, liveChunk)
	plant(unknown, deadChunk)
	plant(notMember, ahead)
	planted := time.Now()

	// The inventories find them, and keep them: the grace is not over.
	found := func(r metaapi.StraysResp, node ids.NodeID, chunk ids.ChunkID, kind metaapi.StrayKind) bool {
		for _, n := range r.Nodes {
			if n.Node != node || n.RoundDone <= planted.UnixNano() {
				continue
			}
			for _, s := range n.List {
				if s.Chunk == chunk && s.Kind == kind {
					return true
				}
			}
		}
		return false
	}
	eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		r := strays(t, mc)
		ok := found(r, notMember.id, liveChunk, metaapi.StrayNotMember) && found(r, unknown.id, deadChunk, metaapi.StrayUnknown) &&
			found(r, notMember.id, ahead, metaapi.StrayAhead)
		return ok, fmt.Sprintf("strays %+v", r.Nodes)
	})
	if since := time.Since(planted); since < grace {
		if v, _ := committed(t, notMember.addr, notMember.id, liveChunk, keys); v == 0 {
			t.Errorf("the stray copy of chunk %v on %v collected %s after it was planted, before the grace of %s", liveChunk, notMember.id, since, grace)
		}
		if v, _ := committed(t, unknown.addr, unknown.id, deadChunk, keys); v == 0 {
			t.Errorf("the stray copy of chunk %v on %v collected %s after it was planted, before the grace of %s", deadChunk, unknown.id, since, grace)
		}
	} else {
		t.Logf("the check before the grace came %s after planting: skipped", since)
	}

	// After the grace they go.
	eventually(t, grace+60*time.Second, 200*time.Millisecond, func() (bool, string) {
		v1, _ := committed(t, notMember.addr, notMember.id, liveChunk, keys)
		v2, _ := committed(t, unknown.addr, unknown.id, deadChunk, keys)
		return v1 == 0 && v2 == 0, fmt.Sprintf("versions of the strays: %d, %d", v1, v2)
	})
	if since := time.Since(planted); since < grace {
		t.Errorf("strays collected %s after they were planted, before the grace of %s", since, grace)
	}
	// Another whole round later: the copy ahead of meta is kept, and the
	// live file's own copy is untouched.
	roundAfter := time.Now().UnixNano()
	eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		for _, n := range strays(t, mc).Nodes {
			if n.Node == notMember.id {
				return n.RoundDone > roundAfter, fmt.Sprintf("%+v", n)
			}
		}
		return false, "no report"
	})
	if v, _ := committed(t, notMember.addr, notMember.id, ahead, keys); v == 0 {
		t.Errorf("chunk %v, beyond meta's counter, was collected", ahead)
	}
	if got := mustRun(t, c.conf, nil, "cat", "/one/live").stdout; !bytes.Equal(got, live) {
		t.Errorf("the live file reads %d bytes (%s), want %d (%s)", len(got), sum(got), len(live), sum(live))
	}
	if v, _ := committed(t, c.nodes[liveNode].addr, liveNode, liveChunk, keys); v == 0 {
		t.Errorf("the live file's own copy on %v is gone", liveNode)
	}
	// The fsck reports the copy kept, and nothing else.
	res := checkReport(t, c.conf, "--verify")
	if len(res.Problems) != 1 || res.Problems[0].Kind != metaapi.CheckUnknownCopy || res.Problems[0].Count != 1 ||
		!strings.Contains(res.Problems[0].Examples[0], ahead.String()) {
		t.Errorf("sluice check: %+v", res.Problems)
	}
}

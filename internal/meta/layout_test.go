package meta

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// addNodes registers n storage nodes in domains round-robin over domains
// (none if empty) and returns their ids.
func (f *fixture) addNodes(n int, domains ...string) []ids.NodeID {
	f.t.Helper()
	var out []ids.NodeID
	for i := 0; i < n; i++ {
		req := metaapi.RegisterReq{Addr: fmt.Sprintf("127.0.0.1:%d", 9000+len(f.s.nodes)+1), Capacity: 1 << 40, Free: 1 << 40}
		if len(domains) > 0 {
			req.Domain = domains[i%len(domains)]
		}
		r, err := f.s.Register(req)
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, r.ID)
	}
	return out
}

func (f *fixture) layout(path string, off, n int64, write bool) metaapi.LayoutResp {
	f.t.Helper()
	r, err := f.s.Layout(7, metaapi.LayoutReq{Ino: f.ino(path), Off: off, Len: n, Write: write, Who: root})
	if err != nil {
		f.t.Fatalf("layout %s [%d,+%d) write=%v: %v", path, off, n, write, err)
	}
	return r
}

// heartbeat sends a heartbeat for node id acknowledging deleted.
func (f *fixture) heartbeat(id ids.NodeID, deleted ...ids.ChunkID) metaapi.HeartbeatResp {
	f.t.Helper()
	r, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: id, Capacity: 1 << 40, Free: 1 << 40, Deleted: deleted})
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

// goneIDs are the chunks a heartbeat says were deleted.
func goneIDs(r metaapi.HeartbeatResp) []ids.ChunkID {
	var out []ids.ChunkID
	for _, g := range r.Gone {
		out = append(out, g.Chunk)
	}
	return out
}

func TestLayoutAllocates(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(5, "r1", "r2", "r3")
	f.tree("/file")
	ino := f.ino("/file")
	const cs = testChunkSize

	r := f.layout("/file", cs/2, 3*cs, true) // touches chunks 0..3
	if len(r.Chunks) != 4 || r.More {
		t.Fatalf("%d chunks (more=%v), want 4", len(r.Chunks), r.More)
	}
	st := f.s.Status2()
	if r.Epoch != st.Epoch {
		t.Fatalf("layout epoch %d, status epoch %d", r.Epoch, st.Epoch)
	}
	addr := map[ids.NodeID]string{}
	for _, n := range st.Nodes {
		addr[n.ID] = n.Addr
	}
	keys := f.s.keys
	now := f.clk.Now()
	seen := map[ids.ChunkID]bool{}
	for i, c := range r.Chunks {
		if c.Index != int64(i) {
			t.Fatalf("chunk %d has index %d", i, c.Index)
		}
		if c.Chunk == 0 || seen[c.Chunk] {
			t.Fatalf("chunk id %v zero or repeated", c.Chunk)
		}
		seen[c.Chunk] = true
		if len(c.Replicas) != 3 {
			t.Fatalf("chunk %d: %d replicas, want 3", i, len(c.Replicas))
		}
		var repIDs []ids.NodeID
		domains := map[string]bool{}
		for _, rep := range c.Replicas {
			if !slices.Contains(nodes, rep.Node) || rep.Addr != addr[rep.Node] || rep.Addr == "" {
				t.Fatalf("replica %+v is not a registered node with its address", rep)
			}
			repIDs = append(repIDs, rep.Node)
			domains[f.s.nodes[rep.Node].rec.Domain] = true
		}
		if len(domains) != 3 {
			t.Fatalf("chunk %d replicas %v span %d domains, want 3", i, repIDs, len(domains))
		}
		var cp capability.Capability
		n, err := keys.Open(c.Cap, now.UnixNano(), &cp)
		if err != nil || n != len(c.Cap) {
			t.Fatalf("chunk %d: capability does not open: n=%d err=%v", i, n, err)
		}
		want := capability.Capability{
			Rights: capability.Read | capability.Write, KeyID: keys.CurrentKey(), Client: 7, Ino: ino,
			Chunk: c.Chunk, Off: 0, Len: cs, Expiry: now.Add(10 * time.Minute).UnixNano(), Issued: now.UnixNano(), Epoch: r.Epoch,
		}
		want.SetReplicas(repIDs)
		want.MAC = cp.MAC
		if cp != want {
			t.Fatalf("chunk %d capability\n got %+v\nwant %+v", i, cp, want)
		}
		if c.Expiry != want.Expiry {
			t.Fatalf("expiry %d, want %d", c.Expiry, want.Expiry)
		}
		// Expired after the TTL.
		if _, err := keys.Open(c.Cap, now.Add(11*time.Minute).UnixNano(), &cp); err == nil {
			t.Fatal("capability still valid after its TTL")
		}
	}

	// Asking again allocates nothing new.
	r2 := f.layout("/file", 0, 4*cs, true)
	for i := range r2.Chunks {
		if r2.Chunks[i].Chunk != r.Chunks[i].Chunk || !slices.Equal(r2.Chunks[i].Replicas, r.Chunks[i].Replicas) {
			t.Fatalf("chunk %d changed on second layout", i)
		}
	}
	if st2 := f.s.Status2(); st2.Chunks != 4 {
		t.Fatalf("status counts %d chunks, want 4", st2.Chunks)
	}

	// Reads list only existing chunks, with read-only capabilities.
	rr := f.layout("/file", 2*cs, 10*cs, false)
	if len(rr.Chunks) != 2 || rr.Chunks[0].Index != 2 || rr.Chunks[1].Index != 3 {
		t.Fatalf("read layout %+v", rr.Chunks)
	}
	var cp capability.Capability
	if _, err := keys.Open(rr.Chunks[0].Cap, now.UnixNano(), &cp); err != nil || cp.Rights != capability.Read {
		t.Fatalf("read capability rights %v err %v", cp.Rights, err)
	}
	if rr := f.layout("/file", 10*cs, cs, false); len(rr.Chunks) != 0 {
		t.Fatalf("hole has chunks: %+v", rr.Chunks)
	}
	// An empty range is fine and allocates nothing.
	if rr := f.layout("/file", 100*cs, 0, true); len(rr.Chunks) != 0 {
		t.Fatal("empty range returned chunks")
	}
}

func TestLayoutSpreadsLoad(t *testing.T) {
	f := newFixture(t)
	f.addNodes(6)
	f.tree("/big")
	r := f.layout("/big", 0, 120*testChunkSize, true)
	count := map[ids.NodeID]int{}
	for _, c := range r.Chunks {
		for _, rep := range c.Replicas {
			count[rep.Node]++
		}
	}
	for id, n := range count { // expect 60 each
		if n < 35 || n > 85 {
			t.Errorf("node %v holds %d of 360 replicas", id, n)
		}
	}
	if len(count) != 6 {
		t.Errorf("only %d of 6 nodes used", len(count))
	}
}

func TestLayoutPaging(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
	f.addNodes(1)
	f.tree("/f")
	r := f.layout("/f", 0, 300*testChunkSize, true)
	if len(r.Chunks) != metaapi.MaxLayoutChunks || !r.More {
		t.Fatalf("%d chunks, more=%v; want %d and more", len(r.Chunks), r.More, metaapi.MaxLayoutChunks)
	}
	r = f.layout("/f", 256*testChunkSize, 44*testChunkSize, true)
	if len(r.Chunks) != 44 || r.More || r.Chunks[0].Index != 256 {
		t.Fatalf("second page: %d chunks from %d, more=%v", len(r.Chunks), r.Chunks[0].Index, r.More)
	}
	r = f.layout("/f", 0, 300*testChunkSize, false)
	if len(r.Chunks) != metaapi.MaxLayoutChunks || !r.More {
		t.Fatalf("read: %d chunks, more=%v", len(r.Chunks), r.More)
	}
}

func TestLayoutErrors(t *testing.T) {
	f := newFixture(t)
	f.tree(stdTree...)
	f.s.SetAttr(metaapi.SetAttrReq{Ino: ids.RootIno, Mode: ptr(uint32(0o777)), Who: root})
	f.mk("/", "ro", metaapi.TypeFile, 0o444, alice)
	f.mk("/", "wo", metaapi.TypeFile, 0o200, alice)
	lay := func(path string, off, n int64, write bool, who metaapi.Who) error {
		_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino(path), Off: off, Len: n, Write: write, Who: who})
		return err
	}
	// No nodes at all.
	err := lay("/f", 0, 1, true, root)
	wantCode(t, err, metaapi.ENOSPC)
	f.addNodes(2)
	err = lay("/f", 0, 1, true, root)
	wantCode(t, err, metaapi.ENOSPC)
	if !strings.Contains(err.Error(), "policy needs 3 replicas but only 2 storage nodes are up") {
		t.Fatalf("unclear message: %v", err)
	}
	if st := f.s.Status2(); st.Chunks != 0 {
		t.Fatalf("failed allocation left %d chunks", st.Chunks)
	}
	f.addNodes(1)
	for _, tc := range []struct {
		name string
		err  error
		want metaapi.Code
	}{
		{"negative off", lay("/f", -1, 1, false, root), metaapi.EINVAL},
		{"negative len", lay("/f", 0, -1, false, root), metaapi.EINVAL},
		{"beyond max size", lay("/f", metaapi.MaxFileSize-10, 11, false, root), metaapi.EFBIG},
		{"offset beyond max", lay("/f", metaapi.MaxFileSize+1, 0, false, root), metaapi.EFBIG},
		{"huge len", lay("/f", 1, 1<<62, false, root), metaapi.EFBIG},
		{"dir", lay("/d", 0, 1, false, root), metaapi.EISDIR},
		{"fifo", lay("/p", 0, 1, false, root), metaapi.EINVAL},
		{"symlink", lay("/l", 0, 1, false, root), metaapi.EINVAL},
		// The mode binds everyone but the owner, who may read and write
		// its file's data whatever the mode (as through the descriptor
		// that created it read-only; the kernel checks opens).
		{"write read-only by other", lay("/ro", 0, 1, true, bob), metaapi.EACCES},
		{"write read-only by group", lay("/ro", 0, 1, true, carol), metaapi.EACCES},
		{"read write-only by group", lay("/wo", 0, 1, false, carol), metaapi.EACCES},
		{"read write-only by other", lay("/wo", 0, 1, false, bob), metaapi.EACCES},
		{"read read-only", lay("/ro", 0, 1, false, bob), ""},
		{"write read-only by owner", lay("/ro", 0, 1, true, alice), ""},
		{"read write-only by owner", lay("/wo", 0, 1, false, alice), ""},
		{"up to max size", lay("/f", metaapi.MaxFileSize-10, 10, false, root), ""},
	} {
		if tc.want == "" && tc.err != nil || tc.want != "" && !metaapi.IsCode(tc.err, tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, tc.err, tc.want)
		}
	}
	_, err = f.s.Layout(1, metaapi.LayoutReq{Ino: 4444, Len: 1})
	wantCode(t, err, metaapi.ENOENT)
}

func TestCommit(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 2 })
	f.addNodes(3)
	f.tree("/f", "/g")
	r := f.layout("/f", 0, 2*testChunkSize, true)
	g := f.layout("/g", 0, 1, true)
	c0, c1 := r.Chunks[0], r.Chunks[1]
	f.clk.Advance(time.Second)
	commit := func(size int64, mtime int64, cv ...metaapi.ChunkVersion) (metaapi.Attr, error) {
		return f.s.Commit(metaapi.CommitReq{Ino: f.ino("/f"), Size: size, Mtime: mtime, Chunks: cv, Who: root})
	}
	a, err := commit(100, 0, metaapi.ChunkVersion{Index: 0, Chunk: c0.Chunk, Version: 5})
	wantCode(t, err, "")
	if a.Size != 100 || a.Mtime != f.clk.Now().UnixNano() || a.Ctime != a.Mtime {
		t.Fatalf("attr after commit %+v", a)
	}
	// Size and version only grow.
	a, err = commit(50, 77, metaapi.ChunkVersion{Index: 0, Chunk: c0.Chunk, Version: 3},
		metaapi.ChunkVersion{Index: 1, Chunk: c1.Chunk, Version: 2})
	wantCode(t, err, "")
	if a.Size != 100 || a.Mtime != 77 {
		t.Fatalf("attr %+v, want size 100 and mtime 77", a)
	}
	r = f.layout("/f", 0, 2*testChunkSize, false)
	if r.Chunks[0].Version != 5 || r.Chunks[1].Version != 2 {
		t.Fatalf("versions %d %d, want 5 2", r.Chunks[0].Version, r.Chunks[1].Version)
	}
	for _, tc := range []struct {
		name string
		cv   metaapi.ChunkVersion
		size int64
		want metaapi.Code
	}{
		{"chunk of another file", metaapi.ChunkVersion{Index: 0, Chunk: g.Chunks[0].Chunk, Version: 9}, 0, metaapi.EINVAL},
		{"wrong index", metaapi.ChunkVersion{Index: 1, Chunk: c0.Chunk, Version: 9}, 0, metaapi.EINVAL},
		{"unallocated index", metaapi.ChunkVersion{Index: 7, Chunk: c0.Chunk, Version: 9}, 0, metaapi.EINVAL},
		{"negative index", metaapi.ChunkVersion{Index: -1, Chunk: c0.Chunk, Version: 9}, 0, metaapi.EINVAL},
		{"bad end", metaapi.ChunkVersion{Index: 0, Chunk: c0.Chunk, Version: 9, End: testChunkSize + 1}, 0, metaapi.EINVAL},
		{"negative size", metaapi.ChunkVersion{Index: 0, Chunk: c0.Chunk}, -1, metaapi.EINVAL},
		{"huge size", metaapi.ChunkVersion{Index: 0, Chunk: c0.Chunk}, metaapi.MaxFileSize + 1, metaapi.EFBIG},
	} {
		_, err := commit(tc.size, 0, tc.cv)
		if !metaapi.IsCode(err, tc.want) {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		}
	}
	// A failed commit changed nothing.
	if a := f.attr("/f"); a.Size != 100 {
		t.Fatalf("size %d after failed commits", a.Size)
	}
	if r := f.layout("/f", 0, 1, false); r.Chunks[0].Version != 5 {
		t.Fatalf("version %d after failed commits", r.Chunks[0].Version)
	}
	_, err = f.s.Commit(metaapi.CommitReq{Ino: f.ino("/f"), Size: 1, Who: bob})
	wantCode(t, err, metaapi.EACCES)
	_, err = f.s.Commit(metaapi.CommitReq{Ino: ids.RootIno, Size: 1, Who: root})
	wantCode(t, err, metaapi.EISDIR)
}

// TestTruncateAndDelete covers the chunk lifecycle: truncation drops whole
// chunks and marks the partial one; unlinking the last name queues every
// replica for deletion; heartbeats hand the queue out and take acks.
func TestTruncateAndDelete(t *testing.T) {
	const cs = testChunkSize
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 2 })
	nodes := f.addNodes(3)
	f.tree("/f")
	ino := f.ino("/f")
	r := f.layout("/f", 0, 4*cs, true)
	if _, err := f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 4 * cs, Who: root}); err != nil {
		t.Fatal(err)
	}
	where := map[ids.ChunkID][]ids.NodeID{}
	for _, c := range r.Chunks {
		for _, rep := range c.Replicas {
			where[c.Chunk] = append(where[c.Chunk], rep.Node)
		}
	}
	queued := func() map[ids.NodeID][]ids.ChunkID {
		out := map[ids.NodeID][]ids.ChunkID{}
		for _, n := range nodes {
			out[n] = goneIDs(f.heartbeat(n))
		}
		return out
	}

	// Truncate to 1.5 chunks: chunks 2 and 3 go, chunk 1 keeps its data
	// but reads as zeros from cs/2.
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: ptr(int64(cs + cs/2)), Who: root}); err != nil {
		t.Fatal(err)
	}
	lr := f.layout("/f", 0, 4*cs, false)
	if len(lr.Chunks) != 2 || lr.Chunks[1].ZeroFrom != cs/2 || lr.Chunks[0].ZeroFrom != 0 {
		t.Fatalf("after truncate: %+v", lr.Chunks)
	}
	q := queued()
	for _, c := range r.Chunks[2:] {
		for _, n := range where[c.Chunk] {
			if !slices.Contains(q[n], c.Chunk) {
				t.Fatalf("chunk %v not queued for deletion on %v (queue %v)", c.Chunk, n, q[n])
			}
		}
	}
	total := 0
	for _, l := range q {
		total += len(l)
	}
	if total != 4 {
		t.Fatalf("%d deletions queued, want 4 (2 chunks x 2 replicas)", total)
	}
	// Truncating further inside the chunk lowers the mark; a write past it
	// raises it again; a write to the end clears it.
	f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: ptr(int64(cs + 100)), Who: root})
	if z := f.layout("/f", cs, 1, false).Chunks[0].ZeroFrom; z != 100 {
		t.Fatalf("ZeroFrom %d, want 100", z)
	}
	f.s.Commit(metaapi.CommitReq{Ino: ino, Size: cs + 500, Who: root,
		Chunks: []metaapi.ChunkVersion{{Index: 1, Chunk: r.Chunks[1].Chunk, Version: 1, End: 500}}})
	if z := f.layout("/f", cs, 1, false).Chunks[0].ZeroFrom; z != 500 {
		t.Fatalf("ZeroFrom %d after write to 500, want 500", z)
	}
	// Extending leaves the mark where the old end was.
	f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: ptr(int64(10 * cs)), Who: root})
	if z := f.layout("/f", cs, 1, false).Chunks[0].ZeroFrom; z != 500 {
		t.Fatalf("ZeroFrom %d after extend, want 500", z)
	}
	f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 2 * cs, Who: root,
		Chunks: []metaapi.ChunkVersion{{Index: 1, Chunk: r.Chunks[1].Chunk, Version: 2, End: cs}}})
	if z := f.layout("/f", cs, 1, false).Chunks[0].ZeroFrom; z != 0 {
		t.Fatalf("ZeroFrom %d after full write, want 0", z)
	}
	// Truncating to a chunk boundary drops the chunk, no mark.
	f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: ptr(int64(cs)), Who: root})
	if lr := f.layout("/f", 0, 4*cs, false); len(lr.Chunks) != 1 || lr.Chunks[0].ZeroFrom != 0 {
		t.Fatalf("after truncate to boundary: %+v", lr.Chunks)
	}

	// Acknowledge everything queued so far.
	for n, l := range queued() {
		f.heartbeat(n, l...)
	}
	for n, l := range queued() {
		if len(l) != 0 {
			t.Fatalf("node %v still has %v queued after acking", n, l)
		}
	}
	// A hard link keeps the data; removing the last name queues it.
	if _, err := f.s.Link(metaapi.LinkReq{Ino: ino, NewParent: ids.RootIno, NewName: "g", Who: root}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "f", Who: root}), "")
	for n, l := range queued() {
		if len(l) != 0 {
			t.Fatalf("node %v told to delete %v while a link remains", n, l)
		}
	}
	wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "g", Who: root}), "")
	q = queued()
	for _, n := range where[r.Chunks[0].Chunk] {
		if !slices.Equal(q[n], []ids.ChunkID{r.Chunks[0].Chunk}) {
			t.Fatalf("node %v queue %v, want [%v]", n, q[n], r.Chunks[0].Chunk)
		}
	}
	if st := f.s.Status2(); st.Chunks != 0 || st.Files != 0 {
		t.Fatalf("status after delete: %+v", st)
	}
	// New chunks never reuse ids.
	f.tree("/h")
	for _, c := range f.layout("/h", 0, 4*cs, true).Chunks {
		if _, old := where[c.Chunk]; old {
			t.Fatalf("chunk id %v reused", c.Chunk)
		}
	}
}

func TestRenameOverFileQueuesChunks(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
	n := f.addNodes(1)[0]
	f.tree("/a", "/b")
	cb := f.layout("/b", 0, 1, true).Chunks[0].Chunk
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: "a", NewParent: ids.RootIno, NewName: "b", Who: root}), "")
	if q := goneIDs(f.heartbeat(n)); !slices.Equal(q, []ids.ChunkID{cb}) {
		t.Fatalf("queue %v, want [%v]", q, cb)
	}
}

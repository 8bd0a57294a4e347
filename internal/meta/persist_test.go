package meta

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// reopen closes the service and opens the same directory again, as a
// restart would, keeping the fake clock.
func (f *fixture) reopen() {
	f.t.Helper()
	if err := f.s.Close(); err != nil {
		f.t.Fatal(err)
	}
	s, err := Open(f.opt)
	if err != nil {
		f.t.Fatal(err)
	}
	f.s = s
	f.t.Cleanup(func() { s.Close() })
}

func TestReopenKeepsEverything(t *testing.T) {
	f := newFixture(t, onDisk, func(o *Options) { o.DefaultReplicas = 2 })
	nodes := f.addNodes(3, "x", "y")
	f.tree("/a/", "/a/b/", "/a/b/file", "/l->a/b", "/p|")
	f.setPolicy("/a", ring(3))
	f.tree("/a/three")
	f.s.Link(metaapi.LinkReq{Ino: f.ino("/a/b/file"), NewParent: ids.RootIno, NewName: "hard", Who: root})
	lay := f.layout("/a/b/file", 0, 3*testChunkSize, true)
	f.s.Commit(metaapi.CommitReq{Ino: f.ino("/a/b/file"), Size: 2*testChunkSize + 5,
		Chunks: []metaapi.ChunkVersion{{Index: 0, Chunk: lay.Chunks[0].Chunk, Version: 4}}, Who: root})
	f.tree("/gone")
	goneChunk := f.layout("/gone", 0, 1, true).Chunks[0]
	wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "gone", Who: root}), "")
	secret := f.s.Secret().String()
	before := f.s.Status2()
	attrs := map[string]metaapi.Attr{}
	paths := []string{"/", "/a", "/a/b", "/a/b/file", "/l", "/p", "/hard", "/a/three"}
	for _, p := range paths {
		attrs[p] = f.attr(p)
	}

	f.reopen()

	if f.s.Secret().String() != secret {
		t.Fatal("cluster secret changed across restart")
	}
	for _, p := range paths {
		if got := f.attr(p); fmt.Sprint(got) != fmt.Sprint(attrs[p]) || (got.Policy != nil && *got.Policy != *attrs[p].Policy) {
			t.Errorf("%s: %+v after reopen, was %+v", p, got, attrs[p])
		}
	}
	after := f.s.Status2()
	if after.Files != before.Files || after.Dirs != before.Dirs || after.Chunks != before.Chunks || after.Epoch < before.Epoch {
		t.Fatalf("status before %+v\nafter %+v", before, after)
	}
	if len(after.Nodes) != 3 {
		t.Fatalf("%d nodes after reopen", len(after.Nodes))
	}
	for _, n := range after.Nodes {
		if n.State != metaapi.NodeDown {
			t.Fatalf("node %v is %s before its first heartbeat after restart", n.ID, n.State)
		}
	}
	if p := f.policy("/a/b"); p.Policy != ring(3) || p.From != f.ino("/a") {
		t.Fatalf("policy after reopen %+v", p)
	}
	if p := f.policy("/"); p.Policy != ring(2) {
		t.Fatalf("root policy after reopen %+v", p)
	}

	// Just after a restart, a shortage of live nodes is "try again".
	_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino("/a/b/file"), Off: 3 * testChunkSize, Len: 1, Write: true, Who: root})
	wantCode(t, err, metaapi.EAGAIN)
	for _, n := range nodes {
		hb := f.heartbeat(n)
		if n == goneChunk.Replicas[0].Node || n == goneChunk.Replicas[1].Node {
			if g := goneIDs(hb); len(g) != 1 || g[0] != goneChunk.Chunk {
				t.Fatalf("deletion queue lost across restart: %v", g)
			}
		}
	}
	r := f.layout("/a/b/file", 0, 4*testChunkSize, true)
	for i := 0; i < 3; i++ {
		if r.Chunks[i].Chunk != lay.Chunks[i].Chunk {
			t.Fatalf("chunk %d changed across restart", i)
		}
	}
	if r.Chunks[0].Version != 4 {
		t.Fatalf("version %d after restart", r.Chunks[0].Version)
	}
	// Counters survive: new ids are beyond every id used before.
	if r.Chunks[3].Chunk <= goneChunk.Chunk {
		t.Fatalf("chunk id %v reused (old max %v)", r.Chunks[3].Chunk, goneChunk.Chunk)
	}
	if a := f.mk("/", "new", metaapi.TypeFile, 0o644, root); a.Ino <= attrs["/a/three"].Ino {
		t.Fatalf("inode %d reused", a.Ino)
	}
	if reg, _ := f.s.Register(metaapi.RegisterReq{Addr: "10.1.1.1:1"}); reg.ID != 4 {
		t.Fatalf("node id %v after restart, want 4", reg.ID)
	}
	// Once the grace period is over, a shortage is ENOSPC again.
	f.reopen()
	f.clk.Advance(11 * time.Second)
	_, err = f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino("/a/b/file"), Off: 9 * testChunkSize, Len: 1, Write: true, Who: root})
	wantCode(t, err, metaapi.ENOSPC)
	if err := f.s.Check(); err != nil {
		t.Fatal(err)
	}
	// Closed services refuse politely.
	f.s.Close()
	_, err = f.s.GetAttr(metaapi.GetAttrReq{Ino: ids.RootIno})
	wantCode(t, err, metaapi.EAGAIN)
}

// TestCrashDurability kills a meta process with SIGKILL while it is
// acknowledging mutations, and checks that everything acknowledged is
// there after reopening.
func TestCrashDurability(t *testing.T) {
	if dir := os.Getenv("SLUICE_META_CRASH_DIR"); dir != "" {
		crashChild(dir)
		return
	}
	if testing.Short() {
		t.Skip("spawns a process")
	}
	dir := t.TempDir()
	acked := map[string]string{} // name -> "created" or "renamed"
	// Several rounds, each killing the process at a different point.
	for round := 0; round < 4; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashDurability$")
		cmd.Env = append(os.Environ(), "SLUICE_META_CRASH_DIR="+dir, fmt.Sprintf("SLUICE_META_CRASH_ROUND=%d", round))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		n := 0
		for n < 100+37*round && sc.Scan() {
			kind, name, _ := strings.Cut(sc.Text(), " ")
			acked[name] = kind
			n++
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if n < 100 {
			t.Fatalf("round %d: child acknowledged only %d mutations", round, n)
		}
	}

	s, err := Open(Options{Dir: dir, SweepInterval: -1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatalf("invariants after crash: %v", err)
	}
	exists := func(name string) bool {
		_, err := s.Lookup(metaapi.LookupReq{Parent: ids.RootIno, Name: metaapi.ByteString(name)})
		return err == nil
	}
	for name, kind := range acked {
		renamed := "r" + strings.TrimPrefix(name, "c")
		switch kind {
		case "created": // the rename may or may not have happened
			if !exists(name) && !exists(renamed) {
				t.Errorf("acknowledged create of %s lost", name)
			}
		case "renamed":
			if !exists(renamed) || exists(name) {
				t.Errorf("acknowledged rename of %s lost", name)
			}
		}
	}
}

// crashChild creates and renames files from several goroutines, printing
// each acknowledgement, until it is killed.
func crashChild(dir string) {
	s, err := Open(Options{Dir: dir, SweepInterval: -1, Logger: testLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var mu sync.Mutex
	say := func(kind, name string) {
		mu.Lock()
		fmt.Fprintf(os.Stdout, "%s %s\n", kind, name)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				name := fmt.Sprintf("c%s-%d-%d", os.Getenv("SLUICE_META_CRASH_ROUND"), g, i)
				if _, err := s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Who: root}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				say("created", name)
				if err := s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: metaapi.ByteString(name), NewParent: ids.RootIno, NewName: metaapi.ByteString("r" + name[1:]), Who: root}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				say("renamed", name)
			}
		}()
	}
	wg.Wait()
}

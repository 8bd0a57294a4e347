package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// netPartition is a network namespace joined to this one by a veth pair:
// 10.X.Y.2 inside, 10.X.Y.1 (meta) and 10.X.Y.3 (everything else)
// outside.
type netPartition struct {
	ns, outer             string
	inner, metaIP, hostIP string
}

func newNetPartition(t *testing.T) *netPartition {
	t.Helper()
	requireRoot(t)
	tag := netTag()
	sub := fmt.Sprintf("10.213.%d", 1+rand.IntN(250))
	p := &netPartition{ns: "slc" + tag, outer: "slca" + tag, inner: sub + ".2", metaIP: sub + ".1", hostIP: sub + ".3"}
	addNetns(t, p.ns)
	vethInto(t, p.outer, p.ns, "slcb"+tag, p.inner)
	// The host address first: it is the source of connections from this
	// side, so cutting the meta address off inside leaves them alone.
	ipCmd(t, "addr", "add", p.hostIP+"/24", "dev", p.outer)
	ipCmd(t, "addr", "add", p.metaIP+"/24", "dev", p.outer)
	ipCmd(t, "link", "set", p.outer, "up")
	return p
}

// cutFromMeta makes the inner side unable to reach meta's address (and
// so to answer it), while it still reaches, and is reached by, every
// other address.
func (p *netPartition) cutFromMeta(t *testing.T) {
	ipCmd(t, "netns", "exec", p.ns, "ip", "route", "add", "blackhole", p.metaIP+"/32")
}

func (p *netPartition) heal(t *testing.T) {
	ipCmd(t, "netns", "exec", p.ns, "ip", "route", "del", "blackhole", p.metaIP+"/32")
}

// TestPartitionNeverAcknowledgesLostWrites: a node is cut off from meta
// (but not from clients or the other nodes) while clients write in place
// to files it holds replicas of, through layouts they cached before. Meta
// marks it down and moves its replicas; the remaining members are fenced,
// so a write through the old replica set fails rather than land only on
// the cut-off node. At the end, with that node gone, every file reads
// back as exactly the writes that were acknowledged.
func TestPartitionNeverAcknowledgesLostWrites(t *testing.T) {
	requireRoot(t)
	np := newNetPartition(t)
	dir := baseDir(t)
	c := startMeta(t, dir, "--listen", np.metaIP+":0", "--repair-grace", "2s")
	for i := 1; i <= 4; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i), "--listen", np.hostIP+":0")
	}
	// The node that will be cut off runs inside the namespace.
	cutDir := filepath.Join(dir, "cut")
	cutArgs := append([]string{"netns", "exec", np.ns, sluiceBin, "node", "--data", cutDir,
		"--meta", c.meta, "--listen", np.inner + ":0"}, c.joinArgs(t, cutDir)...)
	cut := startCmd(t, dir, "cut", nil, "ip", cutArgs...)
	m := cut.waitLine(t, reNodeListen, 20*time.Second)
	cutID := nodeID(t, m[1])
	waitNodesUp(t, c.conf, 5, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")

	conf, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sdk.New(sdk.Options{Conf: conf, BusyRetry: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()

	// Files whose replica sets include the node to be cut off.
	type file struct {
		path  string
		f     *sdk.File
		data  []byte   // what the acknowledged writes made it
		maybe [][]byte // other possible contents after a failed write
	}
	var files []*file
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; len(files) < 6 && i < 60; i++ {
		p := fmt.Sprintf("/f%d", i)
		data := randomBytes(t, 1<<20+rng.IntN(1<<20))
		if _, err := cl.Put(ctx, p, bytes.NewReader(data), 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := cl.Stat(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var lay metaapi.LayoutResp
		if err := cl.Meta().Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: a.Ino, Len: a.Size}, &lay); err != nil {
			t.Fatal(err)
		}
		if !holds(lay, cutID) {
			continue
		}
		f, err := cl.Open(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, &file{path: p, f: f, data: data})
	}
	if len(files) < 3 {
		t.Fatalf("only %d files have a replica on the node to cut off", len(files))
	}

	// Writers patch their files in place, with the layouts they hold.
	var acked, failed, ackedCut atomic.Int64
	var cutOff atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, fl := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 9))
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(20+r.IntN(80)) * time.Millisecond):
				}
				if fl.maybe != nil {
					continue // uncertain after a failed write: leave it
				}
				off := r.IntN(len(fl.data) - 4096)
				patch := make([]byte, 1+r.IntN(min(64<<10, len(fl.data)-off)))
				for j := range patch {
					patch[j] = byte(r.Uint32())
				}
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				_, err := fl.f.WriteAtContext(wctx, patch, int64(off))
				cancel()
				next := bytes.Clone(fl.data)
				copy(next[off:], patch)
				if err != nil {
					failed.Add(1)
					fl.maybe = [][]byte{next}
					continue
				}
				fl.data = next
				acked.Add(1)
				if cutOff.Load() {
					ackedCut.Add(1)
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	np.cutFromMeta(t)
	cutOff.Store(true)
	cutAt := time.Now()
	t.Logf("node %v cut off from meta after %d acknowledged writes", cutID, acked.Load())
	// Meta marks it down, waits out the grace period and moves its
	// replicas while the writers go on.
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		return nodeStates(st)[cutID] == metaapi.NodeDown && nodeMembers(st, cutID) == 0,
			fmt.Sprintf("cut-off node %v: state %s, %d members", cutID, nodeStates(st)[cutID], nodeMembers(st, cutID))
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("during the cut (%s): %d writes acknowledged, %d failed; %d acknowledged in all",
		time.Since(cutAt).Round(100*time.Millisecond), ackedCut.Load(), failed.Load(), acked.Load())
	if ackedCut.Load() == 0 {
		t.Errorf("no write was acknowledged during the cut: fail-over did not work")
	}
	// Writers kept using layouts from before the move: members of the
	// new set must have refused those writes (fenced), never taken them.
	cs := cl.Stats()
	t.Logf("client: %d writes refused as fenced and retried on a fresh layout, %d fail-overs", cs.Fenced, cs.Failovers)
	if cs.Fenced == 0 {
		t.Errorf("no write planned on the old replica sets was refused as fenced")
	}

	// The cut-off node leaves for good; every file must read back as
	// acknowledged, from the replicas meta now lists (three reads start
	// at three different replicas).
	cut.kill()
	for _, fl := range files {
		fl.f.Close()
		for range 3 {
			var out bytes.Buffer
			if _, err := cl.Get(ctx, fl.path, &out); err != nil {
				t.Fatalf("%s: %v", fl.path, err)
			}
			got := out.Bytes()
			ok := bytes.Equal(got, fl.data)
			for _, m := range fl.maybe {
				ok = ok || bytes.Equal(got, m)
			}
			if !ok {
				t.Fatalf("%s reads back as no acknowledged state: %s", fl.path, describeMismatch(got, fl.data, nil))
			}
		}
	}
}

func holds(lay metaapi.LayoutResp, id ids.NodeID) bool {
	for _, ch := range lay.Chunks {
		for _, r := range ch.Replicas {
			if r.Node == id {
				return true
			}
		}
	}
	return false
}

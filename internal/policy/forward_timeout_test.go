package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/policy"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

type miniNode struct {
	st   *store.Store
	addr string
}

// startMini runs one storage node's data path (store, engine with the
// policies, fabric) with the given reply timeout.
func startMini(t *testing.T, id ids.NodeID, key capability.Key, replyTimeout time.Duration) *miniNode {
	t.Helper()
	st, err := store.Open(store.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := fabric.NewEndpoint(fabric.Options{})
	fwd, _ := fabric.NewEndpoint(fabric.Options{})
	pool := fabric.NewPool(fwd, 4)
	eng, err := engine.New(engine.Options{}, policy.Contexts(policy.Deps{
		Self: func() ids.NodeID { return id }, Keys: capability.NewKeyring(key), Store: st,
		Forward: pool, ForwardQuota: ep.Options().Quota, ReplyTimeout: replyTimeout,
	})...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ep.Listen("127.0.0.1:0", eng)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ep.Close()
		pool.Close()
		fwd.Close()
		time.Sleep(100 * time.Millisecond)
		eng.Close()
		st.Close()
	})
	return &miniNode{st: st, addr: a.String()}
}

// TestForwardReplyTimeoutCountsFromReply: forward.send creates its
// ReplyTimeout context when the forward starts and uses it for the final
// wait for the downstream's verdict. A write whose data takes longer than
// ReplyTimeout to stream (16 MiB at < 280 KB/s with the default 60s)
// reaches that wait with the deadline already past: the head reports "no
// reply within", aborts — while the downstream, which got every byte,
// commits. The replicas diverge (downstream at v, head at v-1, meta at
// v-1, so reads from different replicas return different data) and,
// since the head assigns v again next time and the downstream wants v+1,
// every later write to the chunk is refused as stale.
func TestForwardReplyTimeoutCountsFromReply(t *testing.T) {
	key, _ := capability.GenerateKey(1)
	keys := capability.NewKeyring(key)
	a := startMini(t, 1, key, time.Second)
	b := startMini(t, 2, key, time.Second)
	c := capability.Capability{Rights: capability.Write, Client: 1, Ino: 1, Chunk: 30, Len: 1 << 20, Expiry: time.Now().Add(time.Minute).UnixNano()}
	c.SetReplicas([]ids.NodeID{1, 2})
	cp := keys.Mint(&c)
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: 30, Len: 2000, Cap: cp}, []string{a.addr, b.addr})

	ep, _ := fabric.NewEndpoint(fabric.Options{})
	defer ep.Close()
	pc, err := fabric.NewPool(ep, 1).Get(context.Background(), a.addr)
	if err != nil {
		t.Fatal(err)
	}
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	mw, _ := pc.Begin(id, hdr, false)
	mw.Write(make([]byte, 1000), false)
	mw.Flush()
	time.Sleep(1500 * time.Millisecond) // a slow sender: longer than ReplyTimeout overall
	mw.Write(make([]byte, 1000), true)
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	var rep wire.Reply
	select {
	case p := <-ch:
		wire.ParseReply(p.Data, &rep)
		rep.Msg = append([]byte(nil), rep.Msg...)
		p.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("no reply")
	}
	time.Sleep(200 * time.Millisecond)
	ia, _ := a.st.Stat(30)
	ib, _ := b.st.Stat(30)
	if ia.Version != ib.Version {
		t.Fatalf("replicas diverged: head v%d, downstream v%d (head replied %v %q)", ia.Version, ib.Version, rep.Status, rep.Msg)
	}
	if rep.Status != wire.StatusOK {
		t.Fatalf("write whose every replica got all data failed: %v %q", rep.Status, rep.Msg)
	}
}

package policy

import (
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestContextsMatchHeaders: the engine gives each kind of request, as the
// wire encoders lay it out, to its own execution context — so the header
// bytes the contexts match on are where the encoders put mode and flags.
// Every request here carries a capability no key opens, so each context
// refuses it in its header handler and the refusal names the context.
func TestContextsMatchHeaders(t *testing.T) {
	events := make(chan engine.Event, 16)
	eng, err := engine.New(engine.Options{OnEvent: func(ev engine.Event) { events <- ev }},
		Contexts(Deps{Self: func() ids.NodeID { return 1 }, Keys: capability.NewKeyring()})...)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := fabric.NewEndpoint(fabric.Options{})
	addr, err := srv.Listen("127.0.0.1:0", eng)
	if err != nil {
		t.Fatal(err)
	}
	cli, _ := fabric.NewEndpoint(fabric.Options{})
	t.Cleanup(func() { cli.Close(); srv.Close(); eng.Close() })
	pc, err := fabric.NewPool(cli, 1).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	bogus := []byte("not a capability")
	two := []string{"127.0.0.1:1", "127.0.0.1:2"}
	write := func(s plan.Strategy, m plan.Mode, flags uint8, version uint64) []byte {
		h := wire.WriteHeader{Strategy: s, Mode: m, Flags: flags, Chunk: 7, Len: 10, Version: version, Cap: bogus, RegionKey: 1}
		b, err := wire.AppendWrite(nil, &h, two)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	read := func(scaled bool) []byte {
		b, err := wire.AppendRead(nil, &wire.ReadHeader{Scaled: scaled, Chunk: 7, Len: 10, RegionKey: 1, Cap: bogus})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	repair := func(m wire.RepairMode, survivors []byte) []byte {
		b, err := wire.AppendRepair(nil, &wire.RepairHeader{Mode: m, Unit: 0, Chunk: 7, Version: 1, Len: 10, Survivors: survivors, Cap: bogus}, two)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		hdr  []byte
		want string
	}{
		{write(plan.Ring, plan.Stream, 0, 0), "write-stream"},
		{write(plan.Tree, plan.Stream, wire.FlagBase, 5), "write-stream"},
		{write(plan.Flat, plan.Stream, 0, 3), "write-stream"},
		{write(plan.Ring, plan.Host, 0, 0), "write-host"},
		{write(plan.EC, plan.Host, wire.FlagEncode, 3), "write-host"},
		{write(plan.Ring, plan.Pull, 0, 0), "write-pull"},
		{write(plan.Flat, plan.Stream, wire.FlagReserve, 0), "write-reserve"},
		{write(plan.Flat, plan.Stream, wire.FlagReserve, 4), "write-reserve"}, // a release
		{write(plan.EC, plan.Stream, wire.FlagEncode, 3), "write-encode"},
		{write(plan.EC, plan.Stream, wire.FlagPartial, 3), "write-parity"},
		{[]byte{byte(wire.OpWrite), 1, 0}, "write-stream"}, // malformed: refused by the catch-all
		{read(false), "read"},
		{read(true), "read-scaled"},
		{repair(wire.RepairFence, nil), "repair-fence"},
		{repair(wire.RepairDrop, nil), "repair-drop"},
		{repair(wire.RepairGather, []byte{1}), "rebuild"},
		{repair(wire.RepairCopy, []byte{1}), "rebuild"},
	} {
		head := c.hdr[:min(8, len(c.hdr))]
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		if err := pc.Send(id, c.hdr); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-ch:
			var r wire.Reply
			if err := wire.ParseReply(p.Data, &r); err != nil || r.Status == wire.StatusOK {
				t.Errorf("header %x: reply %v %q (%v), want a refusal", head, r.Status, r.Msg, err)
			}
			p.Release()
		case <-time.After(10 * time.Second):
			t.Fatalf("header %x: no reply", head)
		}
		ev := <-events
		if ev.Kind != engine.EventRefused || ev.Context != c.want {
			t.Errorf("header %x: %v by %q (%v), want refused by %s", head, ev.Kind, ev.Context, ev.Reason, c.want)
		}
	}
}

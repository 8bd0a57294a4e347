package admit

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestStep runs the chunk tables in testdata/: each file steps one chunk
// through events and prints every decision and the state after it.
//
//	replicas (shows every replica's chunk; every other command takes on=R)
//	chunk [version=V] [fence=E|tombstone] [doubt=(base,version,tag,off,end)]
//	head off=O end=E [tag=T]        follow version=V base=B [tag=T] [wait]
//	applied write=W [version=V]
//	plan epoch=E   commit   abort [in-doubt]   fence epoch=E
//	drop epoch=E version=V   collect epoch=E   resolve version=V
func TestStep(t *testing.T) {
	datadriven.Walk(t, "testdata/step", func(t *testing.T, path string) {
		// One chunk's copies on three replicas; on=R picks the replica an
		// event happens on (default rank 0, the head).
		var cs [3]Chunk
		for i := range cs {
			cs[i] = Chunk{ID: 7}
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			on := 0
			d.MaybeScanArgs(t, "on", &on)
			if on < 0 || on >= len(cs) {
				t.Fatalf("%s: no replica %d", d.Pos, on)
			}
			c := &cs[on]
			switch d.Cmd {
			case "replicas":
				var b strings.Builder
				for i, c := range cs {
					fmt.Fprintf(&b, "%d: %s\n", i, show(c))
				}
				return b.String()
			case "chunk":
				*c = Chunk{ID: 7}
				d.MaybeScanArgs(t, "version", &c.Version)
				d.MaybeScanArgs(t, "tag", &c.Tag)
				d.MaybeScanArgs(t, "fence", &c.Fence)
				if d.HasArg("tombstone") {
					c.Fence = Tombstone
				}
				if d.HasArg("doubt") {
					dbt := &c.Doubt
					d.ScanArgs(t, "doubt", &dbt.Base, &dbt.Version, &dbt.Tag, &dbt.Off, &dbt.End)
					c.InDoubt = true
				}
				return show(*c)
			case "applied":
				var write, version uint64
				d.ScanArgs(t, "write", &write)
				d.MaybeScanArgs(t, "version", &version)
				return fmt.Sprint(c.Applied(write, version))
			}
			var ev Event
			switch d.Cmd {
			case "head":
				var e BeginHead
				d.ScanArgs(t, "off", &e.Off)
				d.ScanArgs(t, "end", &e.End)
				d.MaybeScanArgs(t, "tag", &e.Tag)
				ev = e
			case "follow":
				var e BeginFollow
				d.ScanArgs(t, "version", &e.Version)
				d.ScanArgs(t, "base", &e.Base)
				d.MaybeScanArgs(t, "tag", &e.Tag)
				e.Wait = d.HasArg("wait")
				ev = e
			case "plan":
				var e Plan
				d.ScanArgs(t, "epoch", &e.Epoch)
				ev = e
			case "commit":
				ev = Commit{}
			case "abort":
				ev = Abort{InDoubt: d.HasArg("in-doubt")}
			case "fence":
				var e Fence
				d.ScanArgs(t, "epoch", &e.Epoch)
				ev = e
			case "drop":
				var e Drop
				d.ScanArgs(t, "epoch", &e.Epoch)
				d.ScanArgs(t, "version", &e.Version)
				ev = e
			case "collect":
				var e Collect
				d.ScanArgs(t, "epoch", &e.Epoch)
				ev = e
			case "resolve":
				var e Resolve
				d.ScanArgs(t, "version", &e.Version)
				ev = e
			default:
				t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
			}
			before := *c
			next, dec := Step(before, ev)
			_, ending := ev.(Abort)
			if dec.Err != nil && !dec.SaveFence && !ending && show(next) != show(before) {
				t.Fatalf("%s: a refused event changed the state:\n%s\n%s", d.Pos, show(before), show(next))
			}
			*c = next
			return decision(dec) + "\n" + show(next)
		})
	})
}

func decision(d Decision) string {
	var b strings.Builder
	if d.Err != nil {
		fmt.Fprintf(&b, "refused (%s): %v", kind(d.Err), d.Err)
	} else {
		b.WriteString("ok")
		if d.Version != 0 {
			fmt.Fprintf(&b, " version=%d base=%d", d.Version, d.Base)
		}
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{d.SaveFence, "save-fence"}, {d.SaveDoubt, "save-doubt"}, {d.ClearDoubt, "clear-doubt"}, {d.Delete, "delete"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	return b.String()
}

func kind(err error) string {
	for _, k := range []error{ErrBusy, ErrStale, ErrInDoubt, ErrFenced, ErrDeleted, ErrRange, ErrMismatch} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return "unknown"
}

func show(c Chunk) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chunk: version=%d", c.Version)
	if c.Tag != 0 {
		fmt.Fprintf(&b, " tag=%d", c.Tag)
	}
	switch c.Fence {
	case 0:
	case Tombstone:
		b.WriteString(" tombstone")
	default:
		fmt.Fprintf(&b, " fence=%d", c.Fence)
	}
	if d := c.Doubt; c.InDoubt {
		fmt.Fprintf(&b, " doubt=(base=%d version=%d tag=%d [%d,%d))", d.Base, d.Version, d.Tag, d.Off, d.End)
	}
	if w := c.Write; c.Open {
		fmt.Fprintf(&b, " write=(version=%d base=%d", w.Version, w.Base)
		if w.Head {
			fmt.Fprintf(&b, " head tag=%d [%d,%d)", w.Tag, w.Off, w.End)
		} else if w.Tag != 0 {
			fmt.Fprintf(&b, " tag=%d", w.Tag)
		}
		if w.Epoch != 0 {
			fmt.Fprintf(&b, " epoch=%d", w.Epoch)
		}
		if w.Resolves {
			b.WriteString(" resolves")
		}
		b.WriteString(")")
	}
	return b.String()
}

// TestReservations runs the tables of rank 0's flat-write reservations.
//
//	table max=N per-client=N
//	put chunk=C version=V off=O len=L write=W client=K hold=H
//	take chunk=C version=V off=O len=L write=W
//	release chunk=C version=V write=W client=K
//	remove chunk=C hold=H   close
func TestReservations(t *testing.T) {
	datadriven.Walk(t, "testdata/reserve", func(t *testing.T, path string) {
		var tab *Reservations[int]
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var chunk ids.ChunkID
			var r Reservation
			var hold int
			d.MaybeScanArgs(t, "chunk", &chunk)
			d.MaybeScanArgs(t, "version", &r.Version)
			d.MaybeScanArgs(t, "off", &r.Off)
			d.MaybeScanArgs(t, "len", &r.Len)
			d.MaybeScanArgs(t, "write", &r.WriteID)
			d.MaybeScanArgs(t, "client", &r.Client)
			d.MaybeScanArgs(t, "hold", &hold)
			var out string
			switch d.Cmd {
			case "table":
				var max, per int
				d.ScanArgs(t, "max", &max)
				d.ScanArgs(t, "per-client", &per)
				tab = NewReservations[int](max, per)
				out = "ok"
			case "put":
				out = result(tab.Put(chunk, r, hold))
			case "take":
				h, err := tab.Take(chunk, r)
				out = result(err)
				if err == nil {
					out = fmt.Sprintf("ok hold=%d", h)
				}
			case "release":
				h, ok := tab.Release(chunk, r.Version, r.WriteID, r.Client)
				out = fmt.Sprintf("released=%v hold=%d", ok, h)
			case "remove":
				out = fmt.Sprintf("removed=%v", tab.Remove(chunk, hold))
			case "close":
				out = fmt.Sprintf("ended %d holds", len(tab.Close()))
			default:
				t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
			}
			return fmt.Sprintf("%s\nreserved: %d, by client: %v", out, tab.Len(), tab.byClient)
		})
	})
}

func result(err error) string {
	if err != nil {
		return fmt.Sprintf("refused (%s): %v", kind(err), err)
	}
	return "ok"
}

package engine

import (
	"testing"

	"github.com/sluicefs/sluice/internal/wire"
)

// named is a header-only context that answers with its own name.
func named(name string, op wire.Op, match ...Field) *Context {
	return &Context{Name: name, Class: op, Match: match, Handlers: Handlers{
		Header: func(*Request, []byte) error { return nil },
		Completion: func(r *Request) {
			r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK}, nil, r.Context()))
		},
	}}
}

// TestMatchHeaderFields: a message goes to the first context of its op
// whose header fields it carries, the rest to the op's catch-all; an op
// without a catch-all refuses what matches none of its contexts.
func TestMatchHeaderFields(t *testing.T) {
	eng, err := New(Options{},
		named("mode-1", 1, Field{At: 1, Mask: 0xff, Value: 1}),
		named("flag-4", 1, Field{At: 1, Mask: 0xff, Value: 0}, Field{At: 2, Mask: 4, Value: 4}),
		named("rest", 1),
		named("only-7", 2, Field{At: 1, Mask: 0x0f, Value: 7}),
	)
	if err != nil {
		t.Fatal(err)
	}
	pc := serve(t, eng).conn(t)
	for _, c := range []struct {
		hdr  []byte
		want string // context name, or "" for refused as unknown
	}{
		{[]byte{1, 1, 4}, "mode-1"},     // the first match wins
		{[]byte{1, 0, 4 | 1}, "flag-4"}, // a masked field
		{[]byte{1, 0, 1}, "rest"},       // the flag is clear
		{[]byte{1, 2, 4}, "rest"},       // another mode
		{[]byte{1, 0}, "rest"},          // too short for flag-4's field
		{[]byte{2, 0x37}, "only-7"},     // bits outside the mask ignored
		{[]byte{2, 0x36}, ""},           // no catch-all for op 2
		{[]byte{2}, ""},                 // too short for any
		{[]byte{3, 1, 4}, ""},           // no context for op 3
	} {
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		pc.Send(id, c.hdr)
		r := waitReply(t, pc, ch)
		switch {
		case c.want == "" && r.Status != wire.StatusUnknownOp:
			t.Errorf("header %v: %v %q, want refused as of no class", c.hdr, r.Status, r.Msg)
		case c.want != "" && (r.Status != wire.StatusOK || string(r.Msg) != c.want):
			t.Errorf("header %v: %v %q, want context %s", c.hdr, r.Status, r.Msg, c.want)
		}
	}
	if s := eng.Stats(); s.UnknownClass != 3 || s.Completed != 6 {
		t.Errorf("stats %+v: want 3 of unknown class, 6 completed", s)
	}
}

// TestMatchUnreachable: New refuses a context no message could reach.
func TestMatchUnreachable(t *testing.T) {
	f := Field{At: 1, Mask: 0xff, Value: 1}
	for name, cs := range map[string][]*Context{
		"after the catch-all": {named("all", 1), named("late", 1, f)},
		"two catch-alls":      {named("a", 1), named("b", 1)},
		"same fields":         {named("a", 1, f), named("b", 1, f)},
		"value off the mask":  {named("a", 1, Field{At: 1, Mask: 0x0f, Value: 0x10})},
		"the op byte":         {named("a", 1, Field{At: 0, Mask: 0xff, Value: 1})},
	} {
		if eng, err := New(Options{}, cs...); err == nil {
			eng.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	// The same fields on another op are another class.
	eng, err := New(Options{}, named("a", 1, f), named("b", 2, f), named("c", 1))
	if err != nil {
		t.Fatal(err)
	}
	eng.Close()
}

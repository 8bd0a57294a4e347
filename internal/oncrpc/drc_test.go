package oncrpc

import (
	"bytes"
	"testing"
)

func key(xid uint32) drcKey {
	return drcKey{client: "10.0.0.1", xid: xid, prog: 100003, vers: 3, proc: 9, sum: 0xabcd, size: 40}
}

func TestDRCStates(t *testing.T) {
	d := newDRC(10, 1<<20)
	k := key(1)
	if st, _ := d.begin(k); st != drcNew {
		t.Fatalf("first sight: %v", st)
	}
	if st, _ := d.begin(k); st != drcInProgress {
		t.Fatalf("while running: %v", st)
	}
	reply := []byte("reply")
	d.finish(k, reply)
	reply[0] = 'X' // the cache keeps its own copy
	st, got := d.begin(k)
	if st != drcDone || string(got) != "reply" {
		t.Fatalf("after finishing: %v %q", st, got)
	}

	// Any field of the key tells calls apart.
	others := []drcKey{key(2)}
	for i := range 6 {
		o := key(1)
		switch i {
		case 0:
			o.client = "10.0.0.2"
		case 1:
			o.prog++
		case 2:
			o.vers++
		case 3:
			o.proc++
		case 4:
			o.sum++
		case 5:
			o.size++
		}
		others = append(others, o)
	}
	for _, o := range others {
		if st, _ := d.begin(o); st != drcNew {
			t.Fatalf("%+v: %v, want a new call", o, st)
		}
		d.finish(o, nil) // no reply sent: forgotten
		if st, _ := d.begin(o); st != drcNew {
			t.Fatalf("%+v after a nil reply: %v", o, st)
		}
		d.finish(o, nil)
	}
	if f, r := d.len(); f != 1 || r != 0 {
		t.Fatalf("%d finished, %d running; want 1, 0", f, r)
	}
}

func TestDRCEvictsLRU(t *testing.T) {
	d := newDRC(3, 1<<20)
	for x := uint32(1); x <= 3; x++ {
		d.begin(key(x))
		d.finish(key(x), []byte{byte(x)})
	}
	d.begin(key(1)) // 1 is now the most recent; 2 the least
	d.begin(key(4))
	d.finish(key(4), []byte{4})
	if st, _ := d.begin(key(2)); st != drcNew {
		t.Fatalf("least recently used entry kept: %v", st)
	}
	for _, x := range []uint32{1, 3, 4} {
		if st, r := d.begin(key(x)); st != drcDone || !bytes.Equal(r, []byte{byte(x)}) {
			t.Fatalf("entry %d: %v %v", x, st, r)
		}
	}
}

func TestDRCBytesBound(t *testing.T) {
	d := newDRC(100, 3*(100+drcOverhead))
	for x := uint32(1); x <= 5; x++ {
		d.begin(key(x))
		d.finish(key(x), make([]byte, 100))
	}
	if f, _ := d.len(); f != 3 || d.bytes > d.maxBytes {
		t.Fatalf("%d entries, %d bytes, bound %d", f, d.bytes, d.maxBytes)
	}
	// A reply larger than the whole cache is not kept (and evicts nothing).
	d.begin(key(9))
	d.finish(key(9), make([]byte, 3*(100+drcOverhead)))
	if st, _ := d.begin(key(9)); st != drcNew {
		t.Fatalf("oversized reply cached: %v", st)
	}
	if f, _ := d.len(); f != 3 {
		t.Fatalf("%d entries after an oversized reply, want 3", f)
	}
}

func TestDRCKeepsRunning(t *testing.T) {
	// Calls in progress are not evicted, however many finish around them.
	d := newDRC(2, 1<<20)
	d.begin(key(100))
	for x := uint32(1); x <= 10; x++ {
		d.begin(key(x))
		d.finish(key(x), []byte{1})
	}
	if st, _ := d.begin(key(100)); st != drcInProgress {
		t.Fatalf("running call evicted: %v", st)
	}
	if f, r := d.len(); f != 2 || r != 1 {
		t.Fatalf("%d finished, %d running; want 2, 1", f, r)
	}
	d.finish(key(100), []byte{2})
	if f, r := d.len(); f != 2 || r != 0 {
		t.Fatalf("%d finished, %d running; want 2, 0", f, r)
	}
	// Finishing what was never begun changes nothing.
	d.finish(key(500), []byte{3})
	if st, _ := d.begin(key(500)); st != drcNew {
		t.Fatalf("unbegun call cached: %v", st)
	}
}

package oncrpc

import (
	"container/list"
	"slices"
	"sync"
)

// A client that loses a connection retransmits its outstanding calls on a
// new one. For a non-idempotent procedure (CREATE, REMOVE, RENAME...) a
// second run would fail or do the wrong thing, so the server remembers
// the replies it sent, like Linux knfsd's duplicate-request cache: a
// retransmission gets the first reply without running the handler again.

// drcKey identifies a call across retransmissions: the client's IP without
// its port (a reconnect gets a new port), the xid, the procedure, and a
// checksum and length of the arguments (so a client that reuses an xid
// after a reboot is not answered for a different call).
type drcKey struct {
	client                string
	xid, prog, vers, proc uint32
	sum                   uint32 // CRC-32 (IEEE) of the argument bytes
	size                  int    // length of the argument bytes
}

type drcState int

const (
	drcNew        drcState = iota // first sight: run the call, then finish
	drcInProgress                 // the first copy still runs: drop this one
	drcDone                       // answered: resend the cached reply
)

// drcOverhead approximates the memory of an entry besides its reply, so a
// cache of tiny replies is bounded by bytes too.
const drcOverhead = 128

type drcEntry struct {
	reply []byte
	elem  *list.Element // in drc.lru; nil while the call runs
}

// drc is a duplicate-request cache bounded by finished entries and by
// their bytes, evicting the least recently used. Calls in progress are
// never evicted (a duplicate of one must not run alongside it); there are
// at most as many of them as handlers running.
type drc struct {
	mu       sync.Mutex
	entries  map[drcKey]*drcEntry
	lru      list.List // of drcKey, finished entries, most recent first
	max      int       // finished entries kept
	maxBytes int       // their bytes, with drcOverhead each
	bytes    int
}

func newDRC(max, maxBytes int) *drc {
	return &drc{entries: make(map[drcKey]*drcEntry), max: max, maxBytes: maxBytes}
}

// begin looks k up. For drcNew the caller must call finish(k, ...) once
// the call is answered; for drcDone the reply is returned (it must not be
// modified).
func (d *drc) begin(k drcKey) (drcState, []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.entries[k]
	switch {
	case e == nil:
		d.entries[k] = &drcEntry{}
		return drcNew, nil
	case e.elem == nil:
		return drcInProgress, nil
	}
	d.lru.MoveToFront(e.elem)
	return drcDone, e.reply
}

// finish records the reply of k (copying it), or forgets k when the reply
// is too large to keep, or is nil (no reply was sent).
func (d *drc) finish(k drcKey, reply []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.entries[k]
	if e == nil || e.elem != nil {
		return // not begun: nothing to finish
	}
	size := len(reply) + drcOverhead
	if reply == nil || d.max <= 0 || size > d.maxBytes {
		delete(d.entries, k)
		return
	}
	e.reply = slices.Clone(reply)
	e.elem = d.lru.PushFront(k)
	d.bytes += size
	for d.lru.Len() > d.max || d.bytes > d.maxBytes {
		old := d.lru.Back()
		ok := d.lru.Remove(old).(drcKey)
		d.bytes -= len(d.entries[ok].reply) + drcOverhead
		delete(d.entries, ok)
	}
}

// len returns the finished and in-progress entries, for tests.
func (d *drc) len() (finished, running int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lru.Len(), len(d.entries) - d.lru.Len()
}

package policy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/wire"
)

// peerConn is a pooled connection to another storage node.
type peerConn = fabric.PeerConn

// forward streams one write's packets to a child replica (the next one of
// a ring, or one of two in a tree). The
// payload handler pushes each packet as it arrives (never blocking: the
// queue holds as many packets as the inbound connection's quota, which
// bounds how many can be alive) and a sender goroutine writes them to an
// exclusive connection, batching what has queued up into one writev. So
// a worker never waits on the network, and a slow replica back-pressures
// only the connection feeding it.
type forward struct {
	d    *Deps
	node ids.NodeID
	addr string
	rank int

	q      chan item
	stop   chan struct{}
	stopMu sync.Once
	reason error
	err    atomic.Pointer[error] // set once the forward has failed
	done   chan struct{}
	result error
	// conn is the connection in use, so abort can close it and interrupt
	// a send blocked on a slow replica.
	conn atomic.Pointer[fabric.PeerConn]
}

func startForward(d *Deps, node ids.NodeID, addr string, rank int, hdr []byte, headerOnly bool) *forward {
	f := &forward{
		d: d, node: node, addr: addr, rank: rank,
		q:    make(chan item, d.ForwardQuota+1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	hdr = append([]byte(nil), hdr...) // the caller's buffer is reused
	go f.run(hdr, headerOnly)
	return f
}

// push hands a retained packet to the sender.
func (f *forward) push(p *fabric.Packet) { f.q <- item{p: p} }

// pushBuf hands a computed buffer (a partial parity) to the sender, which
// releases it once sent.
func (f *forward) pushBuf(b *outBuf) { f.q <- item{b: b} }

// item is what a forward sends: a received packet passed on as it is, or
// a buffer the node computed from one (a partial parity).
type item struct {
	p *fabric.Packet
	b *outBuf
}

func (it item) data() []byte {
	if it.b != nil {
		return it.b.data
	}
	return it.p.Data
}

func (it item) last() bool {
	if it.b != nil {
		return it.b.last
	}
	return it.p.Last()
}

func (it item) release() {
	if it.b != nil {
		it.b.release()
		return
	}
	it.p.Release()
}

// failed returns the forward's error once it has failed, else nil.
func (f *forward) failed() error {
	if e := f.err.Load(); e != nil {
		return *e
	}
	return nil
}

// abort stops the forward without waiting: a dial in progress is
// cancelled and the connection closed, so a send blocked on a slow replica
// returns; the next replica sees its connection close mid-message and
// cleans up at once.
func (f *forward) abort(reason error) {
	f.stopMu.Do(func() {
		f.reason = reason
		close(f.stop)
		if pc := f.conn.Load(); pc != nil {
			pc.Close()
		}
	})
}

// wait returns the downstream replica's verdict: nil once it (and every
// replica after it) has the write durably.
func (f *forward) wait() error {
	<-f.done
	return f.result
}

func (f *forward) fail(err error) error {
	err = wrapReplica(f.rank, f.addr, err)
	f.err.Store(&err)
	return err
}

func (f *forward) run(hdr []byte, headerOnly bool) {
	defer close(f.done)
	f.result = f.send(hdr, headerOnly)
}

// drain releases packets the payload handler still pushes after a
// failure, until the message's last packet or an abort.
func (f *forward) drain(sawLast bool) {
	for !sawLast {
		select {
		case p := <-f.q:
			sawLast = p.last()
			p.release()
		case <-f.stop:
			for {
				select {
				case p := <-f.q:
					p.release()
				default:
					return
				}
			}
		}
	}
}

func (f *forward) send(hdr []byte, headerOnly bool) error {
	dctx, cancel := context.WithTimeout(context.Background(), f.d.ReplyTimeout)
	defer cancel()
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-dctx.Done():
		}
	}()
	pc, err := dialReplicaWith(f.d, dctx, f.node, &f.addr, f.stop)
	if err != nil {
		if stopped(f.stop) {
			return f.reason
		}
		err = f.fail(err)
		f.drain(headerOnly)
		return err
	}
	f.conn.Store(pc)
	if stopped(f.stop) { // abort may have missed the connection
		pc.Close()
		f.drain(headerOnly)
		return f.reason
	}
	call, err := exchange.Start(f.d.Forward, pc, hdr, headerOnly)
	if err != nil {
		err = f.fail(err)
		f.drain(headerOnly)
		return err
	}
	var pending [64]item // sent but not yet flushed
	np := 0
	releasePending := func() {
		for i := range np {
			pending[i].release()
			pending[i] = item{}
		}
		np = 0
	}
	sawLast := headerOnly
	if !headerOnly && len(f.q) == 0 {
		// The header goes out at once, so the next replica admits the
		// write while data is on its way; if data is already queued, the
		// header leaves with it in one writev.
		if err := call.Flush(); err != nil {
			err = f.fail(err)
			f.drain(false)
			return err
		}
	}
	for !sawLast {
		select {
		case p := <-f.q:
			sawLast = p.last()
			werr := call.Write(p.data(), sawLast)
			pending[np] = p
			np++
			if werr == nil && (sawLast || np == len(pending) || len(f.q) == 0) {
				werr = call.Flush()
				releasePending()
			}
			if werr != nil {
				// The call aborted the message, dropping the batched
				// packets unsent.
				releasePending()
				err := f.fail(werr)
				f.drain(sawLast)
				return err
			}
		case <-f.stop:
			// Do not flush: the replica may be the slow one. Aborting
			// drops the batched packets and closes the connection.
			call.Abort(f.reason)
			releasePending()
			f.drain(false)
			return f.reason
		case p, ok := <-call.Replies():
			// An early reply: a refusal, or "already applied" (a retry the
			// replica committed before). Either way stop sending; the
			// unfinished message dies with the connection.
			rerr := replyErr(call.Answered(p, ok))
			releasePending()
			if rerr == nil {
				f.conn.Store(nil)
				f.drain(false)
				return nil
			}
			err := f.fail(rerr)
			f.drain(false)
			return err
		}
	}
	// Everything is flushed (but a lone header, which cannot block): from
	// here a stop ends FinishUnless, which closes the connection, so abort
	// need not (the connection may go back to the pool).
	f.conn.Store(nil)
	if stopped(f.stop) {
		call.Abort(f.reason)
		return &wire.PartialError{Err: f.reason}
	}
	// The reply timeout counts from the end of the transfer: a slow
	// transfer must not make a replica that has everything look dead.
	p, err := call.FinishUnless(f.stop, f.d.ReplyTimeout)
	if err == exchange.ErrStopped {
		return &wire.PartialError{Err: f.reason}
	}
	if err := finalReply(p, err); err != nil {
		return f.fail(err)
	}
	return nil
}

// noReply is a replica's silence after it was sent a whole write: it may
// have committed it.
func noReply(d time.Duration) error {
	return &wire.PartialError{Err: wire.Errorf(wire.StatusReplica, "no reply within %s of the end of the transfer", d)}
}

// finalReply is replyErr for the reply to a whole write: anything but a
// reply from the replica (a lost connection, silence, a garbled reply)
// leaves open whether it committed.
func finalReply(p *fabric.Packet, err error) error {
	if err != nil {
		var silent *exchange.NoReplyError
		if errors.As(err, &silent) {
			return noReply(silent.After)
		}
	}
	if err = replyErr(p, err); err == nil {
		return nil
	}
	var we *wire.Error
	if !errors.As(err, &we) {
		return &wire.PartialError{Err: err}
	}
	return err
}

func stopped(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// replyErr turns a downstream reply (or the error that came instead, a
// lost connection as the connection's own error) into nil or an error.
func replyErr(p *fabric.Packet, err error) error {
	if err != nil {
		var lost *exchange.LostError
		if errors.As(err, &lost) {
			return lost.Err
		}
		return err
	}
	defer p.Release()
	var r wire.Reply
	if err := wire.ParseReply(p.Data, &r); err != nil {
		return err
	}
	return r.Err()
}

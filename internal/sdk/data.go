package sdk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// maxBlockSize is the largest checksum block a node may use; read
// buffers leave this much slack on each side for block alignment.
const maxBlockSize = wire.MaxBlockSize

// writePiece is how much of a write is queued before flushing to the
// socket, and between checks for an early refusal.
const writePiece = 1 << 20

// replyTimeout bounds waiting for a node's reply after a request is sent.
const replyTimeout = 2 * time.Minute

// NodeError is a failure reported by (or talking to) a storage node.
type NodeError struct {
	Op   string
	Addr string
	Err  error
}

func (e *NodeError) Error() string { return fmt.Sprintf("%s at %s: %v", e.Op, e.Addr, e.Err) }
func (e *NodeError) Unwrap() error { return e.Err }

func statusOf(err error) (wire.Status, bool) {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Status, true
	}
	return 0, false
}

// writeMode is how a write is carried: the file's plan, and flags.
type writeMode struct {
	plan  plan.Plan
	flags uint8
}

// modeFor is how a file of policy pol is written: its plan, unless a
// benchmark forces a protocol.
func (c *Client) modeFor(pol *metaapi.Policy) (writeMode, error) {
	wm := writeMode{plan: pol.Plan()}
	if !wm.plan.Named() {
		return wm, fmt.Errorf("unknown replication strategy %q", wm.plan)
	}
	p := c.bench.Protocol
	if p == "" || p == ProtoStream {
		return wm, nil
	}
	if pol != nil && pol.Units() != 1 {
		return wm, fmt.Errorf("protocol %s is for single-replica writes; this file has %d replicas", p, pol.Units())
	}
	switch p {
	case ProtoRPC:
		return writeMode{plan: plan.Plan{Strategy: plan.Ring, Mode: plan.Host}}, nil
	case ProtoRPCPull:
		return writeMode{plan: plan.Plan{Strategy: plan.Ring, Mode: plan.Pull}}, nil
	case ProtoRaw:
		return writeMode{plan: plan.Default, flags: wire.FlagRaw}, nil
	}
	return wm, fmt.Errorf("unknown write protocol %q (known: stream, rpc, rpc-pull, raw)", p)
}

// retryBusy runs op until it succeeds, fails for good, or has been busy
// (request table full, chunk locked) for longer than BusyRetry.
func (c *Client) retryBusy(ctx context.Context, op func() (uint64, error)) (uint64, error) {
	return c.retryBusyFor(ctx, c.opts.BusyRetry, op)
}

// retryBusyFor is retryBusy for at most d.
func (c *Client) retryBusyFor(ctx context.Context, d time.Duration, op func() (uint64, error)) (uint64, error) {
	return c.retryWhile(ctx, d, func() (uint64, error, bool) {
		v, err := op()
		s, ok := statusOf(err)
		return v, err, ok && s.Retryable()
	})
}

// retryWhile runs op again, with jittered exponential backoff, while it
// says to and for at most d.
func (c *Client) retryWhile(ctx context.Context, d time.Duration, op func() (v uint64, err error, again bool)) (uint64, error) {
	deadline := time.Now().Add(d)
	backoff := time.Millisecond
	for {
		v, err, again := op()
		if !again || !time.Now().Before(deadline) {
			return v, err
		}
		c.busyRetries.Add(1)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(backoff + rand.N(backoff)):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// writeChunk writes data at chunk offset off of chunk l and returns the
// version it committed as. It returns only once every replica has the
// data durably. Busy answers are retried with backoff.
//
// id names this logical write and must be kept across every retry of it
// (newWriteID): a replica that already applied it answers so instead of
// refusing it as stale, and a head that holds it in doubt (a replica
// below may have committed it) admits only it or a covering write.
func (c *Client) writeChunk(ctx context.Context, l *metaapi.ChunkLayout, off int64, data []byte, wm writeMode, id uint64) (uint64, error) {
	addrs := make([]string, len(l.Replicas))
	for i, r := range l.Replicas {
		addrs[i] = r.Addr
	}
	h := wire.WriteHeader{Strategy: wm.plan.Strategy, Mode: wm.plan.Mode, Flags: wm.flags, Chunk: l.Chunk, Off: uint64(off), Len: uint64(len(data)),
		Cap: l.Cap, WriteID: id}
	if wm.plan.Strategy == plan.Flat {
		return c.writeFlat(ctx, l, addrs, h, data)
	}
	head := addrs[0]
	partial := false // some attempt may have reached some replicas
	ver, err := c.retryBusy(ctx, func() (uint64, error) {
		var v uint64
		var err error
		if wm.plan.Mode == plan.Pull {
			v, err = c.sendPull(ctx, head, h, addrs, data)
		} else {
			var hdr []byte
			if hdr, err = wire.AppendWrite(nil, &h, addrs); err != nil {
				return 0, err
			}
			v, err = c.sendWrite(ctx, head, hdr, data)
		}
		partial = partial || wire.IsPartial(err)
		return v, err
	})
	if err != nil {
		if partial && !wire.IsPartial(err) {
			err = &wire.PartialError{Err: err}
		}
		return 0, &NodeError{Op: fmt.Sprintf("write chunk %v", l.Chunk), Addr: head, Err: err}
	}
	return ver, nil
}

// writeFlat is client-driven replication: reserve the chunk's next version
// at rank 0, then send every replica its copy in parallel.
func (c *Client) writeFlat(ctx context.Context, l *metaapi.ChunkLayout, addrs []string, h wire.WriteHeader, data []byte) (uint64, error) {
	res := h
	res.Flags |= wire.FlagReserve
	rhdr, err := wire.AppendWrite(nil, &res, addrs)
	if err != nil {
		return 0, err
	}
	var rep wire.Reply
	_, err = c.retryBusy(ctx, func() (uint64, error) {
		var err error
		rep, err = c.sendWriteReply(ctx, addrs[0], rhdr, nil)
		return rep.Version, err
	})
	if err != nil {
		return 0, &NodeError{Op: fmt.Sprintf("reserve chunk %v", l.Chunk), Addr: addrs[0], Err: err}
	}
	ver := rep.Version
	if rep.Skipped > 0 {
		// The reservation covers an unresolved write: replicas may be at
		// any version since before it.
		h.Flags |= wire.FlagBase
		h.Base = ver - 1 - rep.Skipped
	}
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hi := h
			hi.Rank, hi.Version = uint8(i), ver
			hdr, err := wire.AppendWrite(nil, &hi, addrs)
			if err == nil {
				_, err = c.retryBusy(ctx, func() (uint64, error) { return c.sendWrite(ctx, addr, hdr, data) })
			}
			if err != nil {
				errs[i] = &NodeError{Op: fmt.Sprintf("write chunk %v (flat, rank %d)", l.Chunk, i), Addr: addr, Err: err}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return ver, nil
}

// sendPull sends a pulled write: only the request, naming data registered
// for the node to READ; the reply comes once the node has it durably.
func (c *Client) sendPull(ctx context.Context, addr string, h wire.WriteHeader, addrs []string, data []byte) (uint64, error) {
	region := c.ep.Register(data, fabric.RemoteRead)
	defer c.ep.Deregister(region)
	h.RegionKey, h.RegionOff = region.Key(), 0
	hdr, err := wire.AppendWrite(nil, &h, addrs)
	if err != nil {
		return 0, err
	}
	return c.sendWrite(ctx, addr, hdr, nil)
}

func (c *Client) sendWrite(ctx context.Context, addr string, hdr, data []byte) (uint64, error) {
	rep, err := c.sendWriteReply(ctx, addr, hdr, data)
	return rep.Version, err
}

// sendWriteReply sends a write and returns the node's reply.
func (c *Client) sendWriteReply(ctx context.Context, addr string, hdr, data []byte) (wire.Reply, error) {
	var parts [][]byte
	if len(data) > 0 {
		parts = [][]byte{data}
	}
	return c.sendWriteParts(ctx, addr, hdr, parts)
}

// sendWriteParts sends a write whose data is the concatenation of parts.
func (c *Client) sendWriteParts(ctx context.Context, addr string, hdr []byte, parts [][]byte) (wire.Reply, error) {
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	call, err := exchange.Begin(ctx, c.pool, addr, hdr, total == 0)
	if err != nil {
		return wire.Reply{}, err
	}
	call.SetData(parts)
	for call.Left() > 0 {
		// The node may answer before the end: a refusal, or "already
		// applied" (a retry of a write it committed). Either way the
		// unfinished message dies with the connection.
		answered, p, err := call.Pump(parts, writePiece)
		if answered {
			return parseReply(p, err)
		}
		if err != nil {
			return wire.Reply{}, err
		}
	}
	return awaitReply(ctx, &call)
}

// awaitReply waits for the reply to a request (see exchange.Call.Finish).
func awaitReply(ctx context.Context, call *exchange.Call) (wire.Reply, error) {
	return parseReply(call.Finish(ctx, replyTimeout))
}

// parseReply decodes a reply packet (copying what outlives it), or
// passes on the error that came instead.
func parseReply(p *fabric.Packet, err error) (wire.Reply, error) {
	if err != nil {
		return wire.Reply{}, err
	}
	defer p.Release()
	var r wire.Reply
	if err := wire.ParseReply(p.Data, &r); err != nil {
		return r, err
	}
	if err := r.Err(); err != nil {
		return wire.Reply{Status: r.Status}, err
	}
	r.CRCs = append([]byte(nil), r.CRCs...)
	r.Export.Detach()
	r.Msg = nil
	return r, nil
}

// joined is several errors on one line, each still matchable with errors.Is/As.
type joined []error

func (j joined) Error() string {
	parts := make([]string, len(j))
	for i, e := range j {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

func (j joined) Unwrap() []error { return j }

func oneLine(errs []error) error { return joined(errs) }

// newWriteID returns a random non-zero write id.
func newWriteID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

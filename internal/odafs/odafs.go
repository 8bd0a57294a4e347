// Package odafs is the client's side of optimistic direct-access reads
// (seed 004's ODAFS): a cache of blocks, a directory of remote references
// to blocks in storage nodes' exported caches (many more references than
// cached blocks: a reference outlives its block here, as the thesis'
// empty headers do), and the decisions of the read path — serve from the
// cache, read optimistically through a reference, or ask the node by RPC
// (inline below a threshold, placed directly above it) — and of whether
// what an optimistic read brought may be used. Pure: no sockets, no
// fabric; the SDK does the reads these decisions ask for.
package odafs

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/ids"
)

// Ref is a remote reference as a node hands it out with a read reply:
// where its exported cache holds a chunk block, and under which node
// epoch (a restarted node's references all fail: its regions are new).
type Ref struct {
	Node   ids.NodeID
	Epoch  uint64
	Region uint64 // the exported cache's region key
	// Key authenticates optimistic reads of this reference (regionmac).
	Key [16]byte
	expcache.Ref
}

// BlockID names a block of a chunk.
type BlockID struct {
	Chunk ids.ChunkID
	Block uint64
}

// Options size a client's caches.
type Options struct {
	// Entries bounds the directory's references (default 65,536;
	// negative: none — a cache of blocks only, as a DAFS client with a
	// cache on top, for comparison).
	Entries int
	// CacheBytes bounds the cached blocks' bytes (default 16 MiB; 0
	// with Entries set: references only).
	CacheBytes int64
	// BlockSize is the exported caches' block size (default 4 KiB).
	BlockSize int
	// Inline is the largest read the RPC answers inline; above it the
	// node places the data directly (default 16 KiB).
	Inline int
}

func (o *Options) defaults() {
	if o.Entries == 0 {
		o.Entries = 1 << 16
	}
	if o.CacheBytes < 0 {
		o.CacheBytes = 0
	} else if o.CacheBytes == 0 {
		o.CacheBytes = 16 << 20
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 4 << 10
	}
	if o.Inline <= 0 {
		o.Inline = 16 << 10
	}
}

// Client holds a client's cached blocks and references. Safe for
// concurrent use.
type Client struct {
	mu    sync.Mutex
	opts  Options
	refs  map[BlockID]*list.Element // of *refEntry
	refLR *list.List                // front: most recently used
	data  map[BlockID]*list.Element // of *dataEntry
	datLR *list.List
	bytes int64
	// epochs are the nodes' current runs, from the references learnt
	// last: a reference of another run is dropped.
	epochs map[ids.NodeID]uint64
}

type refEntry struct {
	id  BlockID
	ref Ref
}

type dataEntry struct {
	id      BlockID
	version uint64
	data    []byte
}

// New returns a client's caches.
func New(opts Options) *Client {
	opts.defaults()
	return &Client{opts: opts, refs: map[BlockID]*list.Element{}, refLR: list.New(), data: map[BlockID]*list.Element{}, datLR: list.New(), epochs: map[ids.NodeID]uint64{}}
}

// Options returns the options in force (defaults filled in).
func (c *Client) Options() Options { return c.opts }

// Path is how a read of a block is to be served.
type Path int

const (
	// Hit: from the client's cache.
	Hit Path = iota
	// Optimistic: a one-sided read through the reference.
	Optimistic
	// RPCInline: a read request answered with the data inline.
	RPCInline
	// RPCDirect: a read request whose data the node places directly.
	RPCDirect
)

func (p Path) String() string {
	switch p {
	case Hit:
		return "hit"
	case Optimistic:
		return "optimistic"
	case RPCInline:
		return "rpc-inline"
	case RPCDirect:
		return "rpc-direct"
	}
	return fmt.Sprintf("path(%d)", int(p))
}

// Plan decides how to read block id, of n bytes, that the layout says is
// at version or later on the nodes members: the cached bytes on a hit (a
// copy is the caller's to make), the reference for an optimistic read,
// or which RPC. A cached block or reference of an older version, or a
// reference to a node no longer among members, is dropped, not used.
func (c *Client) Plan(id BlockID, n int, version uint64, members []ids.NodeID) (Path, []byte, Ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.data[id]; ok {
		d := e.Value.(*dataEntry)
		if d.version >= version {
			c.datLR.MoveToFront(e)
			return Hit, d.data, Ref{}
		}
		c.dropDataLocked(e)
	}
	if e, ok := c.refs[id]; ok {
		r := e.Value.(*refEntry).ref
		if r.Version >= version && member(members, r.Node) {
			c.refLR.MoveToFront(e)
			return Optimistic, nil, r
		}
		c.refLR.Remove(e)
		delete(c.refs, id)
	}
	if n <= c.opts.Inline {
		return RPCInline, nil, Ref{}
	}
	return RPCDirect, nil, Ref{}
}

func member(members []ids.NodeID, n ids.NodeID) bool {
	for _, m := range members {
		if m == n {
			return true
		}
	}
	return false
}

// Accept decides whether an optimistic read through r may be used: slot
// and gen are what its two one-sided reads copied (expcache.Check), the
// node's epoch is the one the client knows now, and the layout's
// version and members are as for Plan. It returns the block's bytes
// (within slot) or an error; on an error the reference is dropped and the
// caller falls back to an RPC.
func (c *Client) Accept(id BlockID, r Ref, slot []byte, gen uint64, epoch uint64, version uint64, members []ids.NodeID) ([]byte, error) {
	var data []byte
	var err error
	switch {
	case r.Epoch != epoch:
		err = fmt.Errorf("%w: reference of node %v's epoch %d, now %d", expcache.ErrStale, r.Node, r.Epoch, epoch)
	case r.Version < version:
		err = fmt.Errorf("%w: reference to version %d, the layout's is %d", expcache.ErrStale, r.Version, version)
	case !member(members, r.Node):
		err = fmt.Errorf("%w: node %v no longer holds the chunk", expcache.ErrStale, r.Node)
	case r.Chunk != id.Chunk || r.Block != id.Block:
		err = fmt.Errorf("%w: reference to another block", expcache.ErrStale)
	default:
		data, err = expcache.Check(r.Ref, slot, gen, c.opts.BlockSize)
	}
	if err != nil {
		c.Forget(id)
		return nil, err
	}
	return data, nil
}

// Epoch returns the run of node n the client last learnt references of.
func (c *Client) Epoch(n ids.NodeID) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epochs[n]
}

// Learn records the reference a read reply carried for block id. A
// reference of a new run of its node drops those of the node's earlier
// runs (which fail, their regions gone).
func (c *Client) Learn(id BlockID, r Ref) {
	if c.opts.Entries < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.epochs[r.Node]; !ok || old != r.Epoch {
		c.epochs[r.Node] = r.Epoch
		if ok {
			c.forgetNodeLocked(r.Node)
		}
	}
	if e, ok := c.refs[id]; ok {
		e.Value.(*refEntry).ref = r
		c.refLR.MoveToFront(e)
		return
	}
	c.refs[id] = c.refLR.PushFront(&refEntry{id: id, ref: r})
	for len(c.refs) > c.opts.Entries {
		e := c.refLR.Back()
		c.refLR.Remove(e)
		delete(c.refs, e.Value.(*refEntry).id)
	}
}

// Keep caches data (the caller's from now on: not to be changed) as
// block id at version, evicting the least recently used blocks beyond
// CacheBytes. Its reference stays when the block is evicted.
func (c *Client) Keep(id BlockID, version uint64, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int64(len(data)) > c.opts.CacheBytes {
		return
	}
	if e, ok := c.data[id]; ok {
		c.dropDataLocked(e)
	}
	c.data[id] = c.datLR.PushFront(&dataEntry{id: id, version: version, data: data})
	c.bytes += int64(len(data))
	for c.bytes > c.opts.CacheBytes {
		c.dropDataLocked(c.datLR.Back())
	}
}

// Forget drops what the client holds of block id (its reference failed,
// or the client wrote the block).
func (c *Client) Forget(id BlockID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.refs[id]; ok {
		c.refLR.Remove(e)
		delete(c.refs, id)
	}
	if e, ok := c.data[id]; ok {
		c.dropDataLocked(e)
	}
}

// ForgetNode drops every reference to node (it restarted: a new epoch).
func (c *Client) ForgetNode(n ids.NodeID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetNodeLocked(n)
}

func (c *Client) forgetNodeLocked(n ids.NodeID) {
	for id, e := range c.refs {
		if e.Value.(*refEntry).ref.Node == n {
			c.refLR.Remove(e)
			delete(c.refs, id)
		}
	}
}

// Each calls f with every reference held, most recently used first
// (under the client's lock: f must not call back).
func (c *Client) Each(f func(BlockID, Ref)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.refLR.Front(); e != nil; e = e.Next() {
		r := e.Value.(*refEntry)
		f(r.id, r.ref)
	}
}

// Nodes counts the references held to each node (tests, statistics).
func (c *Client) Nodes() map[ids.NodeID]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := map[ids.NodeID]int{}
	for _, e := range c.refs {
		n[e.Value.(*refEntry).ref.Node]++
	}
	return n
}

// Len reports the references and cached blocks held (tests, statistics).
func (c *Client) Len() (refs, blocks int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.refs), len(c.data)
}

func (c *Client) dropDataLocked(e *list.Element) {
	d := e.Value.(*dataEntry)
	c.datLR.Remove(e)
	delete(c.data, d.id)
	c.bytes -= int64(len(d.data))
}

// Package expcache is a storage node's exported cache (seed 004's ODAFS):
// chunk blocks kept in memory that clients read with one-sided
// operations, no RPC and no work by the node's CPU. The memory is one
// arena of slots, each a fixed header and a block; the header says which
// chunk block, at which version, the slot holds, with a CRC of the bytes
// and a generation that changes before the bytes do (a seqlock). Every
// fill takes a generation never used before, so a reference — a slot and
// the generation it was filled under — names one fill for ever: when the
// slot is refilled or invalidated the reference fails, and the node keeps
// no record of who holds references.
//
// The cache itself is the node's bookkeeping (which slot holds what, the
// order of eviction); Check is the reader's side: whether the bytes an
// optimistic read copied are the block the reference names. The arena is
// memory the caller provides: from the heap, or shared memory a fabric
// backend can map into a client.
package expcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/ids"
)

// HeaderSize is the bytes of a slot's header, before its block.
const HeaderSize = 64

// The header's fields, little-endian, at these offsets. The generation
// is first, 8-byte aligned (slots are HeaderSize+block bytes, a multiple
// of 8), so it can be read and written atomically in place.
const (
	offGen     = 0  // uint64: odd while the slot changes; 0 empty
	offChunk   = 8  // uint64
	offBlock   = 16 // uint64: the block's index in the chunk
	offVersion = 24 // uint64: the chunk's version the bytes are of
	offLen     = 32 // uint32: valid bytes of the block
	offCRC     = 36 // uint32: CRC-32C of those bytes
)

// Ref names one fill of a slot: what a read reply hands a client for its
// later optimistic reads (with the node, region and epoch, which are the
// caller's).
type Ref struct {
	Slot    uint32
	Gen     uint64 // even, never used by another fill
	Chunk   ids.ChunkID
	Block   uint64
	Version uint64
	Len     uint32
}

// Off is where the slot of r lies in the arena.
func (r Ref) Off(blockSize int) int64 { return int64(r.Slot) * int64(HeaderSize+blockSize) }

// GenOff is where the generation word of r's slot lies in the arena: the
// second read of an optimistic read.
func (r Ref) GenOff(blockSize int) int64 { return r.Off(blockSize) + offGen }

type key struct {
	chunk ids.ChunkID
	block uint64
}

// Cache is the node's side. Its methods are safe for concurrent use.
type Cache struct {
	mu        sync.Mutex
	mem       []byte
	blockSize int
	slots     []slot
	index     map[ids.ChunkID]map[uint64]uint32 // chunk, block -> slot
	hand      uint32                            // the clock's hand
	next      uint64                            // the next fill's generation, even
}

// slot is the node's record of a slot (the header in the arena is the
// readers').
type slot struct {
	k      key
	used   bool
	ref    bool // the clock's second-chance bit
	refVal Ref
	until  int64 // Expire drops the slot after it (0: never)
}

// New makes a cache of the slots that fit in mem, which must be zeroed
// (fresh from make or a new memory file), blocks of blockSize (a
// multiple of 8). Generations start at genBase (rounded up to even):
// a node gives a base above any a previous run of it used (its epoch in
// the high bits), so no generation is ever reused.
func New(mem []byte, blockSize int, genBase uint64) (*Cache, error) {
	if blockSize <= 0 || blockSize%8 != 0 {
		return nil, fmt.Errorf("expcache: block size %d is not a positive multiple of 8", blockSize)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		return nil, errors.New("expcache: arena not 8-byte aligned")
	}
	n := len(mem) / (HeaderSize + blockSize)
	if n == 0 {
		return nil, fmt.Errorf("expcache: %d bytes hold no slot of %d", len(mem), HeaderSize+blockSize)
	}
	if n > 1<<31 {
		n = 1 << 31
	}
	c := &Cache{mem: mem, blockSize: blockSize, slots: make([]slot, n), index: map[ids.ChunkID]map[uint64]uint32{}, next: (genBase + 1) &^ 1}
	if c.next == 0 {
		c.next = 2 // 0 means empty
	}
	// mem is zeroed (every slot empty) and is not touched here: shared
	// memory is committed only as blocks fill it.
	return c, nil
}

// BlockSize is the cache's block size.
func (c *Cache) BlockSize() int { return c.blockSize }

// Slots is how many blocks the cache holds.
func (c *Cache) Slots() int { return len(c.slots) }

// Get returns the reference of chunk's block if the cache holds it at
// version or later.
func (c *Cache) Get(chunk ids.ChunkID, block, version uint64) (Ref, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[chunk][block]
	if !ok || c.slots[i].refVal.Version < version {
		return Ref{}, false
	}
	c.slots[i].ref = true
	return c.slots[i].refVal, true
}

// Fill stores data as chunk's block at version (replacing what the cache
// held of that block, else the slot the clock evicts) and returns its
// reference. Data longer than a block is refused.
func (c *Cache) Fill(chunk ids.ChunkID, block, version uint64, data []byte) (Ref, error) {
	if len(data) > c.blockSize {
		return Ref{}, fmt.Errorf("expcache: %d bytes for a block of %d", len(data), c.blockSize)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := key{chunk, block}
	i, ok := c.index[chunk][block]
	if !ok {
		i = c.evictLocked()
		m := c.index[chunk]
		if m == nil {
			m = map[uint64]uint32{}
			c.index[chunk] = m
		}
		m[block] = i
	}
	gen := c.next
	c.next += 2
	h := c.header(i)
	// The seqlock: odd before any byte changes, the new (even, never used)
	// generation after. A reader that saw the old generation after its
	// copy copied no byte of this fill.
	h.gen().Store(gen - 1)
	body := c.body(i)
	copy(body, data)
	clear(body[len(data):])
	binary.LittleEndian.PutUint64(h[offChunk:], uint64(chunk))
	binary.LittleEndian.PutUint64(h[offBlock:], block)
	binary.LittleEndian.PutUint64(h[offVersion:], version)
	binary.LittleEndian.PutUint32(h[offLen:], uint32(len(data)))
	binary.LittleEndian.PutUint32(h[offCRC:], crc32c.Checksum(data))
	h.gen().Store(gen)
	r := Ref{Slot: i, Gen: gen, Chunk: chunk, Block: block, Version: version, Len: uint32(len(data))}
	c.slots[i] = slot{k: k, used: true, ref: true, refVal: r}
	return r, nil
}

// InvalidateChunk drops every block of chunk (its data changed or is
// gone): their references fail from now on. Its cost is the chunk's
// blocks held, not the cache's.
func (c *Cache) InvalidateChunk(chunk ids.ChunkID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, i := range c.index[chunk] {
		c.dropLocked(i)
	}
}

// Invalidate drops chunk's block, if held.
func (c *Cache) Invalidate(chunk ids.ChunkID, block uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.index[chunk][block]; ok {
		c.dropLocked(i)
	}
}

// evictLocked returns a free slot, evicting by the clock if none is.
func (c *Cache) evictLocked() uint32 {
	for {
		i := c.hand
		c.hand = (c.hand + 1) % uint32(len(c.slots))
		s := &c.slots[i]
		switch {
		case !s.used:
			return i
		case s.ref:
			s.ref = false
		default:
			c.dropLocked(i)
			return i
		}
	}
}

// dropLocked empties slot i: its generation goes to a new odd value
// (never a reference's), so its references fail.
func (c *Cache) dropLocked(i uint32) {
	s := &c.slots[i]
	if m := c.index[s.k.chunk]; m != nil {
		delete(m, s.k.block)
		if len(m) == 0 {
			delete(c.index, s.k.chunk)
		}
	}
	*s = slot{}
	c.header(i).gen().Store(c.next + 1)
	c.next += 2
}

// header is slot i's header in the arena.
type header []byte

func (h header) gen() *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&h[offGen])) }

func (c *Cache) header(i uint32) header {
	off := int(i) * (HeaderSize + c.blockSize)
	return header(c.mem[off : off+HeaderSize])
}

func (c *Cache) body(i uint32) []byte {
	off := int(i)*(HeaderSize+c.blockSize) + HeaderSize
	return c.mem[off : off+c.blockSize]
}

// Extend keeps slot's fill gen at least until (Unix nanoseconds; see
// Expire). A node caching blocks for one client sets it to the expiry of
// the capability each block was read under.
func (c *Cache) Extend(slot uint32, gen uint64, until int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := &c.slots[slot]; s.used && s.refVal.Gen == gen && s.until < until {
		s.until = until
	}
}

// Expire drops every slot whose Extend time is before now, and returns
// how many it dropped. Slots never extended stay.
func (c *Cache) Expire(now int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.slots {
		if s := &c.slots[i]; s.used && s.until != 0 && s.until < now {
			c.dropLocked(uint32(i))
			n++
		}
	}
	return n
}

// Holds reports whether the slot at off (a slot's offset) holds the fill
// gen names, without the lock: a quick refusal of stale references
// before any further work.
func (c *Cache) Holds(off, gen uint64) bool {
	size := uint64(HeaderSize + c.blockSize)
	i := off / size
	return off%size == 0 && i < uint64(len(c.slots)) && gen&1 == 0 && c.header(uint32(i)).gen().Load() == gen
}

// ReadSlot serves a guarded optimistic read (one the node serves itself,
// over a network): it must read a whole slot from its header (len(dst)
// bytes at off), with the slot's generation word as its word, and the
// slot must still hold the fill gen names. The copy is taken under the
// cache's lock, so it is one fill's bytes whole, and ReadSlot returns
// the generation.
func (c *Cache) ReadSlot(dst []byte, off, wordOff, gen uint64) (uint64, error) {
	size := uint64(HeaderSize + c.blockSize)
	i, n := off/size, uint64(len(dst))
	switch {
	case off%size != 0 || i >= uint64(len(c.slots)):
		return 0, fmt.Errorf("expcache: offset %d is not a slot's", off)
	case n == 0 || n > size:
		return 0, fmt.Errorf("expcache: %d bytes of a %d-byte slot", n, size)
	case wordOff != off+offGen:
		return 0, fmt.Errorf("expcache: word at %d is not slot %d's generation", wordOff, i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if got := c.header(uint32(i)).gen().Load(); got != gen || gen&1 != 0 {
		return 0, fmt.Errorf("expcache: stale: slot %d holds generation %d, not %d", i, got, gen)
	}
	copy(dst, c.mem[off:off+n])
	return gen, nil
}

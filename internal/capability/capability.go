// Package capability implements the tickets meta mints and storage nodes
// check on the data path (seed 000 §IV): a fixed-layout binary record naming
// the client, the inode and chunk, a byte range within the chunk, the
// rights granted, when it was issued and when it expires, the layout
// epoch and the replica set the layout was planned on, sealed with a
// truncated HMAC-SHA256 under a random key meta makes and hands to
// storage nodes, named by a key id (which rotates: docs/capkeys.md).
//
// Verification needs no round trip and no per-client state on the node:
// the header handler decodes the record in place, recomputes the MAC and
// compares. Decoding never allocates, so the check costs a few hundred
// nanoseconds.
package capability

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
)

// Rights is a bit set of operations a capability allows.
type Rights uint8

const (
	// Read allows reading the range.
	Read Rights = 1 << 0
	// Write allows writing the range.
	Write Rights = 1 << 1
	// Repair allows a node to fence its copy, and to replace it by one
	// copied or rebuilt from the other members (OpRepair). Only meta's
	// own reconciliation mints it, at the epoch it fenced the chunk at:
	// a client's read or write capability cannot change a replica set's
	// contents behind meta's back (docs/failures.md).
	Repair Rights = 1 << 2
)

func (r Rights) String() string {
	if r == 0 || r&^(Read|Write|Repair) != 0 {
		return fmt.Sprintf("rights(%d)", uint8(r))
	}
	var b []byte
	for i, c := range "rwR" {
		if r&(1<<i) != 0 {
			b = append(b, byte(c))
		}
	}
	return string(b)
}

// MaxReplicas bounds the replica set a capability can name (replicas or the
// K+M units of an erasure-coded stripe).
const MaxReplicas = 32

// MACSize is the length of the truncated MAC.
const MACSize = 16

// version is the first byte of every encoded capability. 2: the issue
// time (revocation compares it).
const version = 2

// fixedSize is the encoded size without replicas and MAC.
const fixedSize = 4 + 4 + 8*7 + 4 + 8

// Capability is a decoded ticket. Replicas is a fixed array so decoding
// does not allocate; only the first NReplicas entries are meaningful.
type Capability struct {
	Rights Rights
	// Fanout is who may write the copies other than the first: meta
	// sets it from the file's plan (plan.Plan.Fanout).
	Fanout plan.Fanout
	KeyID  uint32
	Client ids.ClientID
	Ino    ids.Ino
	Chunk  ids.ChunkID
	Off    uint64 // start of the allowed range within the chunk
	Len    uint64 // length of the allowed range
	Expiry int64  // unix nanoseconds
	// Issued is when meta minted it (unix nanoseconds, meta's clock): a
	// revocation refuses a client's capabilities issued at or before it.
	Issued    int64
	Epoch     uint64 // cluster-map epoch the layout was planned on
	NReplicas uint8
	// Data is the number of data units of an erasure-coded stripe group
	// (plan.FanoutEC); 0 otherwise.
	Data     uint8
	Replicas [MaxReplicas]ids.NodeID
	MAC      [MACSize]byte
}

// Errors returned by Decode and Keyring.Open. They are distinct so the
// node can tell the client precisely why it was refused.
var (
	ErrMalformed  = errors.New("capability: malformed")
	ErrUnknownKey = errors.New("capability: unknown key id")
	ErrBadMAC     = errors.New("capability: MAC mismatch (forged or corrupted)")
	ErrExpired    = errors.New("capability: expired")
	// ErrRevoked is an ErrExpired (errors.Is), so whoever handles an
	// expired capability (a client fetching a fresh layout) handles a
	// revoked one the same way.
	ErrRevoked = fmt.Errorf("%w: revoked", ErrExpired)
	ErrScope   = errors.New("capability: request outside the capability's scope")
)

// Size returns the encoded length of c.
func (c *Capability) Size() int { return fixedSize + 4*int(c.NReplicas) + MACSize }

// SetReplicas fills the replica set.
func (c *Capability) SetReplicas(nodes []ids.NodeID) error {
	if len(nodes) > MaxReplicas {
		return fmt.Errorf("capability: %d replicas, at most %d", len(nodes), MaxReplicas)
	}
	c.NReplicas = uint8(len(nodes))
	copy(c.Replicas[:], nodes)
	return nil
}

// ReplicaList returns the meaningful part of Replicas.
func (c *Capability) ReplicaList() []ids.NodeID { return c.Replicas[:c.NReplicas] }

// appendBody encodes everything the MAC covers.
func (c *Capability) appendBody(b []byte) []byte {
	b = append(b, version, byte(c.Rights), c.NReplicas, byte(c.Fanout))
	b = binary.LittleEndian.AppendUint32(b, c.KeyID)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Client))
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Ino))
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Chunk))
	b = binary.LittleEndian.AppendUint64(b, c.Off)
	b = binary.LittleEndian.AppendUint64(b, c.Len)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Expiry))
	b = binary.LittleEndian.AppendUint64(b, c.Epoch)
	b = append(b, c.Data, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Issued))
	for _, r := range c.Replicas[:c.NReplicas] {
		b = binary.LittleEndian.AppendUint32(b, uint32(r))
	}
	return b
}

// AppendBinary appends the encoding of c, including its MAC as it stands.
func (c *Capability) AppendBinary(b []byte) []byte {
	b = c.appendBody(b)
	return append(b, c.MAC[:]...)
}

// Decode parses an encoded capability from the front of b into c and
// returns the number of bytes it used. It checks structure only; use
// Keyring.Open to authenticate.
func Decode(b []byte, c *Capability) (int, error) {
	if len(b) < fixedSize+MACSize {
		return 0, fmt.Errorf("%w: %d bytes, need at least %d", ErrMalformed, len(b), fixedSize+MACSize)
	}
	if b[0] != version {
		return 0, fmt.Errorf("%w: version %d", ErrMalformed, b[0])
	}
	n := int(b[2])
	if n > MaxReplicas || b[3] > byte(plan.FanoutEC) {
		return 0, fmt.Errorf("%w: %d replicas, fanout %d", ErrMalformed, n, b[3])
	}
	if data := int(b[64]); (plan.Fanout(b[3]) == plan.FanoutEC) != (data > 0) || data >= max(n, 1) || b[65]|b[66]|b[67] != 0 {
		return 0, fmt.Errorf("%w: %d data units of %d, fanout %d", ErrMalformed, data, n, b[3])
	}
	size := fixedSize + 4*n + MACSize
	if len(b) < size {
		return 0, fmt.Errorf("%w: %d bytes, need %d", ErrMalformed, len(b), size)
	}
	c.Rights = Rights(b[1])
	c.Fanout = plan.Fanout(b[3])
	c.NReplicas = uint8(n)
	c.KeyID = binary.LittleEndian.Uint32(b[4:])
	c.Client = ids.ClientID(binary.LittleEndian.Uint64(b[8:]))
	c.Ino = ids.Ino(binary.LittleEndian.Uint64(b[16:]))
	c.Chunk = ids.ChunkID(binary.LittleEndian.Uint64(b[24:]))
	c.Off = binary.LittleEndian.Uint64(b[32:])
	c.Len = binary.LittleEndian.Uint64(b[40:])
	c.Expiry = int64(binary.LittleEndian.Uint64(b[48:]))
	c.Epoch = binary.LittleEndian.Uint64(b[56:])
	c.Data = b[64]
	c.Issued = int64(binary.LittleEndian.Uint64(b[68:]))
	for i := 0; i < n; i++ {
		c.Replicas[i] = ids.NodeID(binary.LittleEndian.Uint32(b[fixedSize+4*i:]))
	}
	copy(c.MAC[:], b[size-MACSize:size])
	return size, nil
}

// Allows reports whether c grants rights over [off, off+n) of chunk.
func (c *Capability) Allows(rights Rights, chunk ids.ChunkID, off, n uint64) error {
	if c.Rights&rights != rights {
		return fmt.Errorf("%w: needs %v, has %v", ErrScope, rights, c.Rights)
	}
	if c.Chunk != chunk {
		return fmt.Errorf("%w: chunk %v, capability is for %v", ErrScope, chunk, c.Chunk)
	}
	end := off + n
	if end < off || off < c.Off || end > c.Off+c.Len {
		return fmt.Errorf("%w: range [%d,+%d) not within [%d,+%d)", ErrScope, off, n, c.Off, c.Len)
	}
	return nil
}

// RankOf returns the position of node in the replica set, or -1.
func (c *Capability) RankOf(node ids.NodeID) int {
	for i, r := range c.Replicas[:c.NReplicas] {
		if r == node {
			return i
		}
	}
	return -1
}

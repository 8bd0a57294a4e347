// Package ids defines the identifiers shared by every Sluice component:
// storage nodes, chunks, inodes and clients. They are plain integers so
// they can be carried in fixed-size wire headers and capability MACs.
package ids

import "strconv"

// NodeID names a storage node. Meta assigns it on first registration and
// the node keeps it in its data directory, so it survives restarts. 0 is
// never a valid node.
type NodeID uint32

func (n NodeID) String() string { return "n" + strconv.FormatUint(uint64(n), 10) }

// ChunkID names one chunk of file data cluster-wide. Meta allocates them
// from a counter; a chunk's replicas share the same ID on every node.
type ChunkID uint64

func (c ChunkID) String() string { return "c" + strconv.FormatUint(uint64(c), 16) }

// Ino is an inode number in the namespace. The root directory is RootIno.
type Ino uint64

// RootIno is the inode number of "/".
const RootIno Ino = 1

// ClientID names a client credential (one line of client.conf).
type ClientID uint64

// Package plan is the one vocabulary of how a chunk is written: the
// strategy its copies are chained in (ring, tree, flat, or the units of
// an erasure code), the mode nodes handle the data in (streamed per
// packet, stored and forwarded by the host CPU, or pulled), and from
// those who may write which copy (Fanout). A file's policy names its
// plan ("ring", "host-tree", ...); meta's layout mints capabilities
// carrying the plan's Fanout; the client sends the plan in every write
// header; the nodes' write policy checks the one against the other.
// Nothing else translates between names, header bytes and rights.
package plan

import (
	"fmt"
	"strings"
)

// Strategy is how a chunk's copies are chained. Its values are the
// wire header's strategy byte.
type Strategy uint8

const (
	// Ring: each replica forwards to the replica of the next rank.
	Ring Strategy = 1
	// Tree: a pipelined binary tree; rank r forwards to ranks 2r+1 and
	// 2r+2.
	Tree Strategy = 2
	// Flat: the client writes every replica itself; no replica forwards.
	// The version comes from a reservation at rank 0.
	Flat Strategy = 3
	// EC: one unit of an erasure-coded stripe group; the rank is the
	// unit's index (data units first, then parity units). Like flat, the
	// client writes each unit with the version reserved at unit 0.
	EC Strategy = 4
)

func (s Strategy) String() string {
	switch s {
	case Ring:
		return "ring"
	case Tree:
		return "tree"
	case Flat:
		return "flat"
	case EC:
		return "ec"
	}
	return fmt.Sprintf("strategy(%d)", uint8(s))
}

// Children returns the ranks a replica of rank forwards to among n.
func (s Strategy) Children(rank, n int) []int {
	switch s {
	case Ring:
		if rank+1 < n {
			return []int{rank + 1}
		}
	case Tree:
		var out []int
		for _, c := range []int{2*rank + 1, 2*rank + 2} {
			if c < n {
				out = append(out, c)
			}
		}
		return out
	}
	return nil
}

// Parent returns the rank that forwards to rank (rank > 0) in a ring or
// tree.
func (s Strategy) Parent(rank int) int {
	if s == Tree {
		return (rank - 1) / 2
	}
	return rank - 1
}

// Fanout says who writes a chunk's copies other than the first.
func (s Strategy) Fanout() Fanout {
	switch s {
	case Flat:
		return FanoutClient
	case EC:
		return FanoutEC
	}
	return FanoutNodes
}

// Mode is how a node handles a write's data. Its values are the wire
// header's mode byte.
type Mode uint8

const (
	// Stream: the handler engine checks the header and places and
	// forwards every packet as it arrives (the sPIN design).
	Stream Mode = 0
	// Host: store-and-forward, the CPU-centric baseline: the whole
	// request is received into host memory, then validated, stored and
	// forwarded. With one replica this is the "rpc" protocol.
	Host Mode = 1
	// Pull: the header names a region of the client's; the node
	// validates it, then pulls the data with one-sided READs
	// ("rpc-pull").
	Pull Mode = 2
)

func (m Mode) String() string {
	switch m {
	case Stream:
		return "stream"
	case Host:
		return "host"
	case Pull:
		return "pull"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Fanout says who may write a chunk's copies other than the first; a
// capability carries it, so a node knows which writes to take from a
// client.
type Fanout uint8

const (
	// FanoutNodes: the client writes rank 0 only; every other replica
	// accepts a write only as forwarded (and sealed) by another node —
	// ring and tree plans in either mode.
	FanoutNodes Fanout = 0
	// FanoutClient: the client writes every replica itself (flat), so
	// the nodes trust it to send them all the same bytes.
	FanoutClient Fanout = 1
	// FanoutEC: the chunk is an erasure-coded stripe group: the replica
	// set is its data units then its parity units, and the client writes
	// each unit itself (a parity unit may also take partial parities a
	// data unit's node forwards and seals).
	FanoutEC Fanout = 2
)

func (f Fanout) String() string {
	switch f {
	case FanoutNodes:
		return "node-replicated"
	case FanoutClient:
		return "client-replicated"
	case FanoutEC:
		return "erasure-coded"
	}
	return fmt.Sprintf("fanout(%d)", uint8(f))
}

// Plan is how a chunk is written. The zero Plan is unset (no strategy).
type Plan struct {
	Strategy Strategy
	Mode     Mode
}

// The plans a replicated policy may name (seed 000 §V): ring, tree and
// flat stream (flat from the client); host-ring and host-tree are the
// CPU-centric store-and-forward baselines. Their names are spelt out
// once here, so naming and parsing a plan (in every layout meta sends)
// allocate nothing.
var named = []Plan{{Ring, Stream}, {Tree, Stream}, {Flat, Stream}, {Ring, Host}, {Tree, Host}}

var (
	names     = []string{"ring", "tree", "flat", "host-ring", "host-tree"}
	nameBytes = [][]byte{[]byte("ring"), []byte("tree"), []byte("flat"), []byte("host-ring"), []byte("host-tree")}
)

// index is p's place in named, or -1.
func (p Plan) index() int {
	for i, q := range named {
		if p == q {
			return i
		}
	}
	return -1
}

// Replicated lists the plans a replicated policy may name.
func Replicated() []Plan { return append([]Plan(nil), named...) }

// Names lists the names a policy may give, for help texts and errors.
func Names() []string { return append([]string(nil), names...) }

// Default is the plan of a replicated policy that names none.
var Default = Plan{Strategy: Ring}

// Fanout is who writes the plan's copies other than the first.
func (p Plan) Fanout() Fanout { return p.Strategy.Fanout() }

// IsZero reports an unset plan.
func (p Plan) IsZero() bool { return p == Plan{} }

// String is the plan's name as a policy gives it: "ring", "host-tree",
// ... ("" for the zero Plan).
func (p Plan) String() string {
	if i := p.index(); i >= 0 {
		return names[i]
	}
	switch {
	case p.IsZero():
		return ""
	case p.Mode == Stream:
		return p.Strategy.String()
	}
	return p.Mode.String() + "-" + p.Strategy.String()
}

// Parse reads a replicated policy's plan name ("" is the zero Plan).
func Parse(name string) (Plan, error) {
	if name == "" {
		return Plan{}, nil
	}
	for i, n := range names {
		if n == name {
			return named[i], nil
		}
	}
	return Plan{}, fmt.Errorf("unknown replication strategy %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Named reports whether a replicated policy may name p.
func (p Plan) Named() bool { return p.index() >= 0 }

// MarshalText writes the plan's name: policies keep their JSON form
// ("strategy": "host-ring").
// The slice returned is shared: encoders copy it, none may change it.
func (p Plan) MarshalText() ([]byte, error) {
	if i := p.index(); i >= 0 {
		return nameBytes[i], nil
	}
	if !p.IsZero() {
		return nil, fmt.Errorf("plan %v/%v has no name", p.Strategy, p.Mode)
	}
	return nil, nil
}

// UnmarshalText reads a plan's name.
func (p *Plan) UnmarshalText(b []byte) error {
	for i, n := range names {
		if string(b) == n { // compared without a copy
			*p = named[i]
			return nil
		}
	}
	q, err := Parse(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

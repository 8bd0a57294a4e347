package sdk

import (
	"fmt"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
)

// BenchOptions are knobs for benchmarks that compare how Sluice moves
// data (`sluice bench`): a program using the SDK has no use for them and
// calls New. Each knob overrides what the file's policy would choose.
type BenchOptions struct {
	// Protocol forces how single-replica writes authenticate: ProtoStream
	// (the default), ProtoRPC, ProtoRPCPull or ProtoRaw.
	Protocol string
	// ECMode is how erasure-coded writes are encoded: ECStream (the
	// default), ECPerChunk or ECCentral.
	ECMode string
	// LinkRate (bytes per second) and LinkDelay (one way) emulate the
	// client's network link; both 0 (the default) is the real one.
	LinkRate  float64
	LinkDelay time.Duration
}

// Protocols a benchmark can force for single-replica writes: the seed's
// authentication comparison.
const (
	ProtoStream  = "stream"   // capability checked in the header handler, data streams at once (the default)
	ProtoRPC     = "rpc"      // whole request buffered, then validated, then stored
	ProtoRPCPull = "rpc-pull" // request first, node validates, then pulls the data
	ProtoRaw     = "raw"      // no validation at all; nodes refuse it unless started for benchmarks
)

// Erasure-coding modes a benchmark can choose.
const (
	ECStream   = "stream"    // data nodes send partial parities per packet (the default)
	ECPerChunk = "per-chunk" // data nodes receive the whole unit, then send partial parities
	ECCentral  = "central"   // the client encodes and writes the parity units itself
)

// NewBench is New with benchmark knobs.
func NewBench(opts Options, bench BenchOptions) (*Client, error) {
	var link *fabric.Link
	if bench.LinkRate != 0 || bench.LinkDelay != 0 {
		l, err := fabric.NewLink(bench.LinkRate, bench.LinkDelay)
		if err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		link = l
	}
	return newClient(opts, bench, link)
}

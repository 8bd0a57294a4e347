package nfs3

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"

	"github.com/sluicefs/sluice/internal/fabricrpc"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// ServeOptions configure Listen: the gateway (Options) and the
// transports it is served on.
type ServeOptions struct {
	Options
	// Listen is the TCP address NFS, MOUNT and the stats program
	// (StatsProg) are served on, one port for all.
	Listen string
	// FabricListen, if set, also serves them with RPC over the fabric
	// transport on this address, tuned by Fabric.
	FabricListen string
	Fabric       FabricOptions
	// MaxConns and MaxConnsPerHost bound each transport's connections
	// (oncrpc.Server, fabricrpc.Server; 0: their defaults).
	MaxConns, MaxConnsPerHost int
}

// FabricOptions tune the fabric transport (fabricrpc.Server's fields of
// the same names; 0: their defaults).
type FabricOptions struct{ BufSize, BufCount, ChunkMin int }

// StatsProg is a private RPC program (in the transient range) the
// gateway serves beside NFS and MOUNT, to callers on the same machine:
// procedure 1 returns its Stats as JSON, for `sluice bench nfs`.
const StatsProg = 0x40534c55

// Stats are the counters the stats program reports.
type Stats struct {
	TCP    oncrpc.Stats    `json:"tcp"`
	Fabric fabricrpc.Stats `json:"fabric"`
	// The read cache: block lookups that hit and missed, bytes held.
	CacheHits, CacheMisses, CacheBytes int64
	// The gateway's client's optimistic reads (sluice nfs --odafs):
	// served, and fallen back to a request (sdk.Stats).
	Optimistic, OptimisticFallbacks uint64
}

// Server is a gateway listening on its transports (Listen).
type Server struct {
	gw      *Gateway
	rpc     *oncrpc.Server
	fab     *fabricrpc.Server // nil: no fabric transport
	ln      net.Listener
	fabAddr net.Addr
}

// Listen makes the gateway and listens on its transports; Serve serves
// them.
func Listen(opts ServeOptions) (*Server, error) {
	g, err := New(opts.Options)
	if err != nil {
		return nil, err
	}
	log := g.log
	s := &Server{gw: g, rpc: &oncrpc.Server{MaxRecord: MaxData + 64<<10, Logger: log, MaxConns: opts.MaxConns, MaxConnsPerHost: opts.MaxConnsPerHost}}
	s.rpc.Programs = append(g.Programs(), s.statsProgram())
	if s.ln, err = net.Listen("tcp", opts.Listen); err != nil {
		return nil, fmt.Errorf("nfs: %w", err)
	}
	if opts.FabricListen != "" {
		s.fab = &fabricrpc.Server{RPC: s.rpc, Logger: log.With("transport", "fabric"), BufSize: opts.Fabric.BufSize, BufCount: opts.Fabric.BufCount,
			ChunkMin: opts.Fabric.ChunkMin, MaxConns: opts.MaxConns, MaxConnsPerHost: opts.MaxConnsPerHost}
		if s.fabAddr, err = s.fab.Listen(opts.FabricListen); err != nil {
			s.ln.Close()
			return nil, fmt.Errorf("nfs: fabric transport: %w", err)
		}
	}
	return s, nil
}

// Addr is the TCP transport's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// FabricAddr is the fabric transport's address; nil without one.
func (s *Server) FabricAddr() net.Addr { return s.fabAddr }

// Serve serves until ctx is done (then nil) or the TCP transport fails,
// and closes both transports.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.rpc.Serve(s.ln) }()
	var err error
	select {
	case err = <-errc:
		s.rpc.Close()
	case <-ctx.Done():
		err = s.rpc.Close()
	}
	if s.fab != nil {
		s.fab.Close()
	}
	return err
}

// Stats returns the transports', the read cache's and the optimistic
// reads' counters.
func (s *Server) Stats() Stats {
	st := Stats{TCP: s.rpc.Stats()}
	if s.fab != nil {
		st.Fabric = s.fab.Stats()
	}
	st.CacheHits, st.CacheMisses, st.CacheBytes = s.gw.CacheStats()
	cs := s.gw.cl.Stats()
	st.Optimistic, st.OptimisticFallbacks = cs.Optimistic, cs.OptimisticFallbacks
	return st
}

func (s *Server) statsProgram() oncrpc.Program {
	return oncrpc.Program{Prog: StatsProg, Low: 1, High: 1,
		Handle: func(_ context.Context, c *oncrpc.Call, _ *xdr.Reader, res *xdr.Writer) oncrpc.AcceptStat {
			// Only for callers on this machine: the counters describe
			// every client's traffic.
			if host, _, err := net.SplitHostPort(c.Remote); err != nil || !net.ParseIP(host).IsLoopback() {
				return oncrpc.ProgUnavail
			}
			switch c.Proc {
			case 0:
			case 1:
				b, _ := json.Marshal(s.Stats())
				res.Opaque(b)
			default:
				return oncrpc.ProcUnavail
			}
			return oncrpc.Success
		}}
}

// HandleKey is the key a gateway MACs file handles with (Options), derived
// from its client credential: the same for every gateway of the cluster
// and across restarts, so handles outlive them, and unknown to NFS
// clients.
func HandleKey(credential string) []byte {
	m := hmac.New(sha256.New, []byte(credential))
	m.Write([]byte("sluice nfs file handles v1"))
	return m.Sum(nil)
}

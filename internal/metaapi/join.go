package metaapi

import "github.com/sluicefs/sluice/internal/ids"

// Joining: an admin asks meta for a one-time join token (JoinToken); a
// new storage node presents it with a certificate request (Join) and
// gets its node id, its certificate and what it needs of the cluster.

// JoinTokenReq asks for a join token valid for TTL (ns; 0: an hour).
// With Node, the token admits only that node, keeping its id: a node
// that lost its credentials, or whose data directory predates TLS.
type JoinTokenReq struct {
	TTL  int64      `json:"ttl,omitempty"`
	Node ids.NodeID `json:"node,omitempty"`
}

// JoinTokenResp is a new token (jointoken text) and its expiry (unix ns).
type JoinTokenResp struct {
	Token   string `json:"token"`
	Expires int64  `json:"expires"`
}

// JoinReq is a new node's: the token and a certificate request (DER);
// ID is the node's id when it already has one (rejoining).
type JoinReq struct {
	Token string     `json:"token"`
	CSR   []byte     `json:"csr"`
	ID    ids.NodeID `json:"id,omitempty"`
	// Want is the id a new node asks for (`sluice node --id`), in
	// [1, MaxNodeID] and not another node's; 0: meta picks one.
	Want ids.NodeID `json:"want,omitempty"`
}

// MaxNodeID is the largest node id a node may ask for.
const MaxNodeID = 1<<24 - 1

// JoinResp gives a joined node its id, its certificate naming that id
// and the cluster CA (PEM). Nothing else: the keys it checks capabilities
// with come with its registration and heartbeats (docs/capkeys.md), and
// the cluster secret never leaves meta.
type JoinResp struct {
	ID   ids.NodeID `json:"id"`
	Cert string     `json:"cert"`
	CA   string     `json:"ca"`
}

// Bounds of join requests and tokens.
const (
	MaxCSRBytes    = 4 << 10
	DefaultJoinTTL = int64(3600e9)          // an hour
	MaxJoinTTL     = int64(7 * 24 * 3600e9) // a week
	MaxJoinTokens  = 1024                   // outstanding at once
)

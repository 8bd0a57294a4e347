package metaapi

import "github.com/sluicefs/sluice/internal/ids"

// Joining: an admin asks meta for a one-time join token (JoinToken); a
// new storage node presents it with a certificate request (Join) and
// gets its node id, its certificate and what it needs of the cluster.

// JoinTokenReq asks for a join token valid for TTL (ns; 0: an hour).
type JoinTokenReq struct {
	TTL int64 `json:"ttl,omitempty"`
}

// JoinTokenResp is a new token (jointoken text) and its expiry (unix ns).
type JoinTokenResp struct {
	Token   string `json:"token"`
	Expires int64  `json:"expires"`
}

// JoinReq is a new node's: the token and a certificate request (DER).
type JoinReq struct {
	Token string `json:"token"`
	CSR   []byte `json:"csr"`
}

// JoinResp gives a joined node its id, its certificate naming that id
// and the cluster CA (PEM), and the cluster secret (hex), which it keeps
// private: it derives the keys capabilities are checked with.
type JoinResp struct {
	ID     ids.NodeID `json:"id"`
	Cert   string     `json:"cert"`
	CA     string     `json:"ca"`
	Secret string     `json:"secret"`
}

// Bounds of join requests and tokens.
const (
	MaxCSRBytes    = 4 << 10
	DefaultJoinTTL = int64(3600e9)          // an hour
	MaxJoinTTL     = int64(7 * 24 * 3600e9) // a week
	MaxJoinTokens  = 1024                   // outstanding at once
)

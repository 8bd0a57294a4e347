package sdk

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// JoinToken has meta create a one-time token a new storage node joins
// the cluster with, valid for ttl (an admin's call); with node, a token
// for that node to join again keeping its id.
func (c *Client) JoinToken(ctx context.Context, ttl time.Duration, node ids.NodeID) (metaapi.JoinTokenResp, error) {
	var resp metaapi.JoinTokenResp
	if err := c.meta.Call(ctx, metaapi.OpJoinToken, metaapi.JoinTokenReq{TTL: int64(ttl), Node: node}, &resp); err != nil {
		return resp, fmt.Errorf("creating a join token: %w", err)
	}
	return resp, nil
}

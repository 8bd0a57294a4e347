package client

import (
	"context"
	"fmt"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
)

// Policy is how the data of new files under a directory is made
// redundant: Replicas copies written with Strategy ("ring", the default,
// "tree", "flat", "host-ring" or "host-tree"), or an erasure code (EC).
type Policy struct {
	Replicas int
	Strategy string
	EC       *ErasureCode
}

// ErasureCode is a Reed-Solomon code: Data data units and Parity parity
// units per stripe, Cell bytes of a stripe on each unit (0: the default).
type ErasureCode struct {
	Data, Parity int
	Cell         int64
}

func (p Policy) String() string {
	if p.EC != nil {
		return fmt.Sprintf("ec=%d+%d cell=%d", p.EC.Data, p.EC.Parity, p.EC.Cell)
	}
	return fmt.Sprintf("replicas=%d strategy=%s", p.Replicas, p.Strategy)
}

func (p Policy) meta() (metaapi.Policy, error) {
	if p.EC != nil {
		cell := p.EC.Cell
		if cell == 0 {
			cell = metaapi.DefaultECCell
		}
		if p.Replicas != 0 || p.Strategy != "" {
			return metaapi.Policy{}, fmt.Errorf("a policy is either replicated or erasure-coded, not both")
		}
		return metaapi.Policy{EC: &metaapi.ErasureCode{Data: p.EC.Data, Parity: p.EC.Parity, Cell: cell}}, nil
	}
	name := p.Strategy
	if name == "" {
		name = plan.Default.String()
	}
	pl, err := plan.Parse(name)
	if err != nil {
		return metaapi.Policy{}, err
	}
	return metaapi.Policy{Replicas: p.Replicas, Strategy: pl}, nil
}

func policyOf(p metaapi.Policy) Policy {
	if p.EC != nil {
		return Policy{EC: &ErasureCode{Data: p.EC.Data, Parity: p.EC.Parity, Cell: p.EC.Cell}}
	}
	return Policy{Replicas: p.Replicas, Strategy: p.Strategy.String()}
}

// SetPolicy sets the policy new files under directory p get (files
// keep the policy they were created with).
func (c *Client) SetPolicy(ctx context.Context, p string, pol Policy) error {
	mp, err := pol.meta()
	if err != nil {
		return &PathError{Op: "policy set", Path: p, Err: err}
	}
	if err := mp.Validate(); err != nil {
		return &PathError{Op: "policy set", Path: p, Err: err}
	}
	return c.c.SetPolicy(ctx, p, mp)
}

// GetPolicy returns the policy new files under p get, and whether p
// inherits it from an ancestor directory rather than having it set on
// itself.
func (c *Client) GetPolicy(ctx context.Context, p string) (pol Policy, inherited bool, err error) {
	a, err := c.c.Stat(ctx, p)
	if err != nil {
		return Policy{}, false, err
	}
	resp, err := c.c.GetPolicy(ctx, p)
	if err != nil {
		return Policy{}, false, err
	}
	return policyOf(resp.Policy), resp.From != a.Ino, nil
}

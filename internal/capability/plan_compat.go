package capability

import "github.com/sluicefs/sluice/internal/plan"

// Transitional names for plan's, until every caller says plan.X.
type Fanout = plan.Fanout

const (
	FanoutNodes  = plan.FanoutNodes
	FanoutClient = plan.FanoutClient
	FanoutEC     = plan.FanoutEC
)

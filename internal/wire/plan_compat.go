package wire

import "github.com/sluicefs/sluice/internal/plan"

// Transitional names for plan's, until every caller says plan.X.
type (
	Strategy = plan.Strategy
	Mode     = plan.Mode
)

const (
	StrategyRing = plan.Ring
	StrategyTree = plan.Tree
	StrategyFlat = plan.Flat
	StrategyEC   = plan.EC
	ModeStream   = plan.Stream
	ModeHost     = plan.Host
	ModePull     = plan.Pull
)

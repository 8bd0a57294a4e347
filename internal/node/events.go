package node

import "github.com/sluicefs/sluice/internal/engine"

func (n *Node) onEvent(ev engine.Event) {
	switch ev.Kind {
	case engine.EventAborted:
		n.log.Info("request aborted", "context", ev.Context, "peer", ev.Peer, "reason", ev.Reason)
	case engine.EventRefused:
		n.log.Debug("request refused", "context", ev.Context, "peer", ev.Peer, "reason", ev.Reason)
	case engine.EventTableFull:
		n.log.Debug("request table full", "peer", ev.Peer)
	case engine.EventUnknownClass:
		n.log.Warn("message of unknown class", "peer", ev.Peer, "reason", ev.Reason)
	}
}

package fabric

import "fmt"

// Fabric is how an endpoint reaches its peers (Options.Fabric).
type Fabric string

const (
	// FabricTCP: every connection is TCP.
	FabricTCP Fabric = "tcp"
	// FabricAuto: shared memory to peers on this host (network
	// namespace), TCP to others.
	FabricAuto Fabric = "auto"
	// FabricShm: shared memory only; a peer elsewhere is refused.
	FabricShm Fabric = "shm"
)

// ParseFabric parses a --fabric flag value.
func ParseFabric(s string) (Fabric, error) {
	switch f := Fabric(s); f {
	case FabricTCP, FabricAuto, FabricShm:
		return f, nil
	}
	return "", fmt.Errorf("fabric: unknown fabric %q (auto, tcp or shm)", s)
}

// newTransport is the transport o.Fabric selects.
func newTransport(o *Options) transport {
	if o.Fabric == FabricTCP {
		return tcpTransport{opts: o}
	}
	return shmTransport{tcp: tcpTransport{opts: o}, mode: o.Fabric}
}

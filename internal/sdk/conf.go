package sdk

import (
	"fmt"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The names below are what a program outside this module uses to reach a
// cluster: it cannot import the internal packages the types are defined
// in, but through these aliases it can name them, and their fields are
// plain values.

// Conf is the content of client.conf, the file `sluice` writes for a
// principal: the meta address (Meta, host:port), the principal's id and
// secret credential (ClientID, Credential, Principal) and the PEM of the
// cluster CA meta's certificate must chain to (CA). NewFromFile reads one.
type Conf = config.ClientConf

// Who is an identity for permission checks at meta: a uid, its primary
// gid and supplementary gids (UID, GID, GIDs).
type Who = metaapi.Who

// NewFromFile is New with opts.Conf read from the client.conf at path;
// whatever opts.Conf held is replaced. It is how a program outside this
// module connects with the same file the sluice command uses.
func NewFromFile(path string, opts Options) (*Client, error) {
	conf, err := config.Load(path)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	opts.Conf = conf
	return New(opts)
}

// Package nfsexport is the NFS gateway's export table: what /etc/exports
// says on a Linux server, parsed strictly, and the one decision every
// MOUNT and NFS call goes through: does this export admit this caller,
// and as whom does the call act.
//
// An export is a path and the client networks it is exported to, each
// with its options:
//
//	/proj 10.0.0.0/8(rw) 192.168.1.7(ro,all_squash,anonuid=1000,anongid=1000)
//
// The defaults are the safe ones, as in Linux: ro, root_squash, secure
// (calls from ports below 1024 only), anonuid and anongid 65534. The
// decision is pure (no sockets, no clock) and tested from a table
// (testdata/).
package nfsexport

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Squash says which callers' identities an export replaces by its
// anonymous one.
type Squash uint8

const (
	RootSquash   Squash = iota // uid 0, gid 0 and group 0 become anonymous (the default)
	NoRootSquash               // every identity is taken as it comes
	AllSquash                  // every caller is anonymous
)

// Nobody is the default anonymous uid and gid (Linux's nobody/nogroup).
const Nobody = 65534

// Options are one client entry's options.
type Options struct {
	ReadWrite bool // rw; default ro
	Squash    Squash
	Insecure  bool // insecure: calls from any port; default secure (below 1024)
	AnonUID   uint32
	AnonGID   uint32
}

// DefaultOptions are an entry's options when it names none.
func DefaultOptions() Options { return Options{AnonUID: Nobody, AnonGID: Nobody} }

// Client is an export's entry for a network: "*" is every address, v4
// and v6.
type Client struct {
	Any  bool
	Net  netip.Prefix // when !Any
	Opts Options
}

// Export is a path and the clients it is exported to.
type Export struct {
	Path    string
	Clients []Client
}

// Default is the export table of a gateway given none: the whole
// namespace, read-write, to this machine only, squashing root and
// from reserved ports only.
func Default() []Export {
	rw := DefaultOptions()
	rw.ReadWrite = true
	return []Export{{Path: "/", Clients: []Client{
		{Net: netip.MustParsePrefix("127.0.0.1/32"), Opts: rw},
		{Net: netip.MustParsePrefix("::1/128"), Opts: rw},
	}}}
}

// Caller is who makes a call: the peer address the transport saw (for
// RPC over the fabric, the fabric connection's peer) and the
// credential's identity; AuthNone for AUTH_NONE calls.
type Caller struct {
	Peer     netip.AddrPort
	AuthNone bool
	Who      metaapi.Who
}

// Access is what an admitted call may do: act as Who, and change
// things only if ReadWrite.
type Access struct {
	Who       metaapi.Who
	ReadWrite bool
	Client    *Client // the entry that admitted it
}

// Refusals of Admit. A refused call does nothing.
var (
	// ErrNotExported: no entry of the export covers the caller's address
	// (NFS3ERR_ACCES; MOUNT: MNT3ERR_ACCES).
	ErrNotExported = errors.New("not exported to this address")
	// ErrInsecurePort: the entry is secure and the call came from port
	// 1024 or above (NFS3ERR_PERM, as knfsd; MOUNT: MNT3ERR_ACCES).
	ErrInsecurePort = errors.New("call from an unprivileged port (1024 or above) to a secure export")
)

// Admit decides whether e admits caller and as whom the call acts. The
// entry is the most specific network containing the caller's address
// ("*" last), as a single host beats a network in Linux's exports(5).
// root_squash maps uid 0 to anonuid and gid 0, and group 0 among the
// supplementary groups, to anongid, as knfsd does; all_squash maps every
// caller; AUTH_NONE is always anonymous.
func (e *Export) Admit(c Caller) (Access, error) {
	addr := c.Peer.Addr().Unmap()
	var best *Client
	for i := range e.Clients {
		cl := &e.Clients[i]
		if !cl.Any && !cl.Net.Contains(addr) {
			continue
		}
		if best == nil || specificity(cl) > specificity(best) {
			best = cl
		}
	}
	if best == nil || !addr.IsValid() {
		return Access{}, ErrNotExported
	}
	o := best.Opts
	if !o.Insecure && c.Peer.Port() >= 1024 {
		return Access{}, ErrInsecurePort
	}
	anon := metaapi.Who{UID: o.AnonUID, GID: o.AnonGID}
	who := c.Who
	switch {
	case c.AuthNone || o.Squash == AllSquash:
		who = anon
	case o.Squash == RootSquash:
		if who.UID == 0 {
			who.UID = o.AnonUID
		}
		if who.GID == 0 {
			who.GID = o.AnonGID
		}
		if slices.Contains(who.GIDs, 0) { // a copy: the caller's stays as it came
			gids := slices.Clone(who.GIDs)
			for i, g := range gids {
				if g == 0 {
					gids[i] = o.AnonGID
				}
			}
			who.GIDs = gids
		}
	}
	if len(who.GIDs) == 0 {
		who.GIDs = nil
	}
	return Access{Who: who, ReadWrite: o.ReadWrite, Client: best}, nil
}

// specificity orders entries: longer prefixes first, "*" last.
func specificity(c *Client) int {
	if c.Any {
		return -1
	}
	return c.Net.Bits()
}

// Find returns the export a MOUNT of p from caller mounts: the deepest
// export whose path is p or one of its ancestors and which has an entry
// for the caller's address (as Linux's mountd looks), with the access
// it gives. With none, the error says why: ErrNotExported, or the
// deepest such export's refusal.
func Find(exports []Export, p string, c Caller) (*Export, Access, error) {
	var best *Export
	var acc Access
	err := fmt.Errorf("%s: %w", p, errNoExport)
	for i := range exports {
		e := &exports[i]
		if !Contains(e.Path, p) || (best != nil && len(best.Path) >= len(e.Path)) {
			continue
		}
		a, aerr := e.Admit(c)
		if errors.Is(aerr, ErrNotExported) {
			continue
		}
		best, acc, err = e, a, aerr
	}
	if err != nil {
		return nil, Access{}, err
	}
	return best, acc, nil
}

// errNoExport: no export covers the path for the caller's address.
var errNoExport = fmt.Errorf("not exported: %w", ErrNotExported)

// Contains reports whether path p is dir or lies below it (both clean
// and absolute).
func Contains(dir, p string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

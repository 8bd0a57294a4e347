package metaapi

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicefs/sluice/internal/ids"
)

// Principals: who may call meta. Each client.conf holds one principal's
// credential; meta maps the uids a principal's requests claim, confines it
// to its path and gates administration on its Admin right (docs/security.md).

// Operations on principals (admin only) and the caller's own identity.
const (
	OpAuthAdd    = "AuthAdd"
	OpAuthList   = "AuthList"
	OpAuthRotate = "AuthRotate"
	OpAuthRemove = "AuthRemove"
	OpWhoami     = "Whoami"
)

// Squash says which claimed identities a principal's requests are mapped
// to the anonymous user (AnonUID/AnonGID), as NFS exports do.
type Squash string

const (
	SquashNone Squash = ""     // act as the uids claimed (within UIDs)
	SquashRoot Squash = "root" // uid 0 acts as nobody; gid 0 is dropped
	SquashAll  Squash = "all"  // every request acts as nobody
)

// The anonymous identity squashed requests act as.
const (
	AnonUID = 65534
	AnonGID = 65534
)

// MaxPrincipalName bounds a principal's name.
const MaxPrincipalName = 64

// IDRange is an inclusive range of uids or gids.
type IDRange struct {
	Lo uint32 `json:"lo"`
	Hi uint32 `json:"hi"`
}

func (r IDRange) String() string {
	if r.Lo == r.Hi {
		return strconv.FormatUint(uint64(r.Lo), 10)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// IDRanges is a set of id ranges; empty means any id.
type IDRanges []IDRange

// Contains reports whether id is in one of the ranges (or rs is empty).
func (rs IDRanges) Contains(id uint32) bool {
	if len(rs) == 0 {
		return true
	}
	for _, r := range rs {
		if id >= r.Lo && id <= r.Hi {
			return true
		}
	}
	return false
}

func (rs IDRanges) String() string {
	if len(rs) == 0 {
		return "any"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// MaxIDRanges bounds the ranges of one principal.
const MaxIDRanges = 64

// ParseIDRanges parses "1000-1999,2500" (as the CLI takes it).
func ParseIDRanges(s string) (IDRanges, error) {
	var out IDRanges
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		l, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("id range %q: %q is not a number from 0 to 4294967295", part, lo)
		}
		h := l
		if isRange {
			if h, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return nil, fmt.Errorf("id range %q: %q is not a number from 0 to 4294967295", part, hi)
			}
		}
		if h < l {
			return nil, fmt.Errorf("id range %q: ends before it starts", part)
		}
		out = append(out, IDRange{uint32(l), uint32(h)})
	}
	return out, out.Validate()
}

// Validate checks the ranges are well formed and few.
func (rs IDRanges) Validate() error {
	if len(rs) > MaxIDRanges {
		return fmt.Errorf("%d id ranges, at most %d allowed", len(rs), MaxIDRanges)
	}
	for _, r := range rs {
		if r.Hi < r.Lo {
			return fmt.Errorf("id range %d-%d ends before it starts", r.Lo, r.Hi)
		}
	}
	return nil
}

// Rights are what a principal may do.
type Rights struct {
	// Path is the directory the principal is confined to: it sees it as
	// "/" and can reach nothing outside. "/" (or empty) is everything.
	Path     string   `json:"path,omitempty"`
	ReadOnly bool     `json:"read_only,omitempty"`
	Squash   Squash   `json:"squash,omitempty"`
	UIDs     IDRanges `json:"uids,omitempty"` // uids it may act as (empty: any)
	GIDs     IDRanges `json:"gids,omitempty"` // gids it may act with (empty: as UIDs if set, else any)
	Admin    bool     `json:"admin,omitempty"`
}

// Principal describes a principal (never its credential).
type Principal struct {
	ID      ids.ClientID `json:"id"`
	Name    string       `json:"name"`
	Rights  Rights       `json:"rights"`
	Root    ids.Ino      `json:"root"`    // the directory Path named when it was added
	Created int64        `json:"created"` // unix ns
	Rotated int64        `json:"rotated,omitempty"`
}

type AuthAddReq struct {
	Name   string `json:"name"`
	Rights Rights `json:"rights"`
}

// AuthCredResp returns a principal and its new credential, the only time
// meta ever shows it (it keeps a hash).
type AuthCredResp struct {
	Principal  Principal `json:"principal"`
	Credential string    `json:"credential"`
}

type AuthNameReq struct {
	Name string `json:"name"`
}

type AuthListResp struct {
	Principals []Principal `json:"principals"`
}

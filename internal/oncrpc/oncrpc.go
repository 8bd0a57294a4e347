// Package oncrpc is ONC RPC version 2 (RFC 5531) over TCP with record
// marking (RFC 5531 §11), the transport under the NFSv3 gateway: call and
// reply headers with AUTH_NONE and AUTH_SYS credentials, a Server that runs
// a connection's calls concurrently and answers retransmitted
// non-idempotent calls from a duplicate-request cache, and a Client that
// keeps many calls in flight on one connection.
//
// Everything read from the network is hostile: records are bounded by the
// reader's limit and their buffers grow only as bytes arrive, credentials
// by RFC 5531's 400 bytes, and malformed input is an error, never a panic.
package oncrpc

import (
	"errors"
	"fmt"

	"github.com/sluicefs/sluice/internal/xdr"
)

// Authentication flavors (RFC 5531 §8.2). Only these two are accepted.
const (
	AuthNone uint32 = 0
	AuthSys  uint32 = 1
)

// AcceptStat is the status of a call the server accepted (RFC 5531 §9).
type AcceptStat uint32

const (
	Success      AcceptStat = 0 // results follow the header
	ProgUnavail  AcceptStat = 1 // program not served here
	ProgMismatch AcceptStat = 2 // program served, not that version
	ProcUnavail  AcceptStat = 3 // no such procedure
	GarbageArgs  AcceptStat = 4 // the arguments do not decode
	SystemErr    AcceptStat = 5 // the server failed (e.g. out of memory)
)

var acceptNames = [...]string{"success", "program unavailable", "program version mismatch",
	"procedure unavailable", "garbage arguments", "system error"}

func (s AcceptStat) String() string {
	if int(s) < len(acceptNames) {
		return acceptNames[s]
	}
	return fmt.Sprintf("accept_stat(%d)", uint32(s))
}

// Wire constants of RFC 5531 §9.
const (
	rpcVersion  = 2
	msgCall     = 0
	msgReply    = 1
	msgAccepted = 0
	msgDenied   = 1
	rpcMismatch = 0 // reject_stat
	authError   = 1 // reject_stat
	authBadCred = 1 // auth_stat AUTH_BADCRED

	maxAuthBody    = 400 // opaque_auth body<400>
	maxMachineName = 255 // authsys_parms machinename<255>
	maxGIDs        = 16  // authsys_parms gids<16>
)

// Errors of ParseCall. The server answers ErrRPCVersion and ErrBadCred
// with a denied reply and drops everything else (it cannot tell what the
// sender meant to call).
var (
	ErrNotCall    = errors.New("oncrpc: not a call message")
	ErrRPCVersion = errors.New("oncrpc: RPC version is not 2")
	ErrBadCred    = errors.New("oncrpc: bad credential")
)

// AuthSysCred is an AUTH_SYS credential (RFC 5531 appendix A): machine
// name at most 255 bytes, at most 16 gids.
type AuthSysCred struct {
	Stamp   uint32
	Machine string
	UID     uint32
	GID     uint32
	GIDs    []uint32
}

// Call is a decoded call header.
type Call struct {
	XID, Prog, Vers, Proc uint32
	CredFlavor            uint32
	Cred                  AuthSysCred // meaningful when CredFlavor == AuthSys
	Remote                string      // the caller's address (set by the server)
}

// ParseCall decodes a call message from r, leaving r at the procedure's
// arguments. Its distinct errors are ErrNotCall (a reply or garbage
// message type), ErrRPCVersion (rpcvers != 2) and ErrBadCred (a flavor
// other than AUTH_NONE and AUTH_SYS, a malformed or truncated AUTH_SYS
// body, a credential or verifier body over 400 bytes or running past the
// message). A message that ends inside the six-word header is another
// error, wrapping xdr.ErrShort. The xid is set in c whenever the message
// holds one; c.Remote is kept, every other field is overwritten.
func ParseCall(r *xdr.Reader, c *Call) error {
	*c = Call{Remote: c.Remote}
	c.XID = r.Uint32()
	mtype := r.Uint32()
	if err := r.Err(); err != nil {
		return fmt.Errorf("oncrpc: call header: %w", err)
	}
	if mtype != msgCall {
		return fmt.Errorf("%w: message type %d", ErrNotCall, mtype)
	}
	// The RPC version comes before anything whose layout it could change.
	if v := r.Uint32(); r.Err() == nil && v != rpcVersion {
		return fmt.Errorf("%w: %d", ErrRPCVersion, v)
	}
	c.Prog = r.Uint32()
	c.Vers = r.Uint32()
	c.Proc = r.Uint32()
	if err := r.Err(); err != nil {
		return fmt.Errorf("oncrpc: call header: %w", err)
	}

	c.CredFlavor = r.Uint32()
	cred := r.Opaque(maxAuthBody)
	// The verifier of AUTH_NONE and AUTH_SYS calls carries nothing we
	// check; its body is only bounded and skipped.
	r.Uint32()
	r.Opaque(maxAuthBody)
	if err := r.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadCred, err)
	}
	switch c.CredFlavor {
	case AuthNone:
		// RFC 5531 §10.1: the AUTH_NONE body is undefined, so any is taken.
	case AuthSys:
		if err := parseAuthSys(cred, &c.Cred); err != nil {
			return fmt.Errorf("%w: AUTH_SYS: %w", ErrBadCred, err)
		}
	default:
		return fmt.Errorf("%w: flavor %d", ErrBadCred, c.CredFlavor)
	}
	return nil
}

// parseAuthSys decodes an authsys_parms body, which must be exactly the
// opaque it came in.
func parseAuthSys(body []byte, c *AuthSysCred) error {
	r := xdr.NewReader(body)
	c.Stamp = r.Uint32()
	c.Machine = r.String(maxMachineName)
	c.UID = r.Uint32()
	c.GID = r.Uint32()
	if n := r.Count(maxGIDs, 4); n > 0 {
		c.GIDs = make([]uint32, n)
		for i := range c.GIDs {
			c.GIDs[i] = r.Uint32()
		}
	}
	if err := r.Err(); err != nil {
		return err
	}
	if r.Len() != 0 {
		return fmt.Errorf("%d bytes after the credential", r.Len())
	}
	return nil
}

// AppendAuthSys appends c as an opaque_auth of flavor AUTH_SYS (the flavor,
// then the encoded authsys_parms as opaque data). It encodes c as it is:
// a machine name over 255 bytes or more than 16 gids make a credential
// servers reject.
func AppendAuthSys(w *xdr.Writer, c *AuthSysCred) {
	w.Uint32(AuthSys)
	off := w.Reserve(4)
	w.Uint32(c.Stamp)
	w.String(c.Machine)
	w.Uint32(c.UID)
	w.Uint32(c.GID)
	w.Uint32(uint32(len(c.GIDs)))
	for _, g := range c.GIDs {
		w.Uint32(g)
	}
	w.Put32(off, uint32(len(w.B)-off-4))
}

// AppendCall appends a call header; AUTH_NONE when cred is nil. The
// verifier is always AUTH_NONE, as AUTH_SYS prescribes.
func AppendCall(w *xdr.Writer, xid, prog, vers, proc uint32, cred *AuthSysCred) {
	w.Uint32(xid)
	w.Uint32(msgCall)
	w.Uint32(rpcVersion)
	w.Uint32(prog)
	w.Uint32(vers)
	w.Uint32(proc)
	if cred == nil {
		w.Uint32(AuthNone)
		w.Uint32(0)
	} else {
		AppendAuthSys(w, cred)
	}
	w.Uint32(AuthNone)
	w.Uint32(0)
}

func appendReply(w *xdr.Writer, xid, stat uint32) {
	w.Uint32(xid)
	w.Uint32(msgReply)
	w.Uint32(stat)
}

// AppendAccepted appends an accepted reply header with an empty AUTH_NONE
// verifier. For Success the caller appends the results after it; for
// ProgMismatch use AppendProgMismatch, which adds the versions served.
func AppendAccepted(w *xdr.Writer, xid uint32, stat AcceptStat) {
	appendReply(w, xid, msgAccepted)
	w.Uint32(AuthNone)
	w.Uint32(0)
	w.Uint32(uint32(stat))
}

// AppendProgMismatch appends a PROG_MISMATCH reply: versions low..high of
// the program are served.
func AppendProgMismatch(w *xdr.Writer, xid, low, high uint32) {
	AppendAccepted(w, xid, ProgMismatch)
	w.Uint32(low)
	w.Uint32(high)
}

// AppendRPCMismatch appends a denied reply saying only RPC version 2 is
// spoken.
func AppendRPCMismatch(w *xdr.Writer, xid uint32) {
	appendReply(w, xid, msgDenied)
	w.Uint32(rpcMismatch)
	w.Uint32(rpcVersion)
	w.Uint32(rpcVersion)
}

// AppendAuthError appends a denied reply for an authentication failure;
// stat is an auth_stat (1 AUTH_BADCRED, 2 AUTH_REJECTEDCRED, 3
// AUTH_BADVERF, 4 AUTH_REJECTEDVERF, 5 AUTH_TOOWEAK, ...).
func AppendAuthError(w *xdr.Writer, xid uint32, stat uint32) {
	appendReply(w, xid, msgDenied)
	w.Uint32(authError)
	w.Uint32(stat)
}

// AcceptError is an accepted reply whose status is not Success. Low and
// High are the versions served, for ProgMismatch.
type AcceptError struct {
	Stat      AcceptStat
	Low, High uint32
}

func (e *AcceptError) Error() string {
	if e.Stat == ProgMismatch {
		return fmt.Sprintf("oncrpc: %v (versions %d to %d served)", e.Stat, e.Low, e.High)
	}
	return "oncrpc: " + e.Stat.String()
}

// RejectError is a denied reply: an RPC version mismatch (Low..High are
// the versions the server speaks) or an authentication error (AuthStat).
type RejectError struct {
	RPCMismatch bool
	AuthStat    uint32
	Low, High   uint32
}

func (e *RejectError) Error() string {
	if e.RPCMismatch {
		return fmt.Sprintf("oncrpc: call denied: RPC version mismatch (versions %d to %d spoken)", e.Low, e.High)
	}
	return fmt.Sprintf("oncrpc: call denied: authentication error %d", e.AuthStat)
}

// errBadReply is a reply the client cannot decode.
var errBadReply = errors.New("oncrpc: malformed reply")

// parseReply decodes a reply record and returns its results (aliasing
// rec) for Success, or the error it reports.
func parseReply(rec []byte) ([]byte, error) {
	r := xdr.NewReader(rec)
	if err := ReadReply(r); err != nil {
		return nil, err
	}
	return r.Rest(), nil
}

// ReadReply decodes a reply's header from r, leaving r at the results
// for Success, or returns the error the reply reports (*AcceptError,
// *RejectError, or a malformed reply).
func ReadReply(r *xdr.Reader) error {
	_, err := readReply(r)
	return err
}

func readReply(r *xdr.Reader) ([]byte, error) {
	r.Uint32() // xid, matched by the caller
	if mtype := r.Uint32(); r.Err() == nil && mtype != msgReply {
		return nil, fmt.Errorf("%w: message type %d", errBadReply, mtype)
	}
	switch stat := r.Uint32(); {
	case r.Err() != nil:
	case stat == msgAccepted:
		r.Uint32() // verifier flavor
		r.Opaque(maxAuthBody)
		as := AcceptStat(r.Uint32())
		switch {
		case r.Err() != nil:
		case as == Success:
			return nil, nil
		case as == ProgMismatch:
			e := &AcceptError{Stat: as, Low: r.Uint32(), High: r.Uint32()}
			if r.Err() == nil {
				return nil, e
			}
		default:
			return nil, &AcceptError{Stat: as}
		}
	case stat == msgDenied:
		switch rs := r.Uint32(); {
		case r.Err() != nil:
		case rs == rpcMismatch:
			e := &RejectError{RPCMismatch: true, Low: r.Uint32(), High: r.Uint32()}
			if r.Err() == nil {
				return nil, e
			}
		case rs == authError:
			e := &RejectError{AuthStat: r.Uint32()}
			if r.Err() == nil {
				return nil, e
			}
		default:
			return nil, fmt.Errorf("%w: reject_stat %d", errBadReply, rs)
		}
	default:
		return nil, fmt.Errorf("%w: reply_stat %d", errBadReply, stat)
	}
	return nil, fmt.Errorf("%w: %w", errBadReply, r.Err())
}

package admit

import "errors"

// Sentinel errors: the kinds of refusal. The store re-exports the first
// five under its own names, so callers match either with errors.Is.
var (
	// ErrBusy: another write on the chunk is open, or one this write
	// follows has not arrived yet. Retryable.
	ErrBusy = errors.New("chunk busy")
	// ErrStale: the write's version does not follow the chunk's.
	ErrStale = errors.New("stale version")
	// ErrInDoubt: an earlier write may have reached only some replicas,
	// and this head write neither retries nor covers it (Doubt).
	ErrInDoubt = errors.New("unresolved write")
	// ErrFenced: the write was planned on an epoch below the chunk's fence.
	ErrFenced = errors.New("fenced")
	// ErrDeleted: the chunk has a tombstone: nothing may write it again.
	ErrDeleted = errors.New("chunk deleted")
	// ErrRange: versions that cannot describe a write.
	ErrRange = errors.New("out of range")
	// ErrMismatch: a request names a reservation it does not hold.
	ErrMismatch = errors.New("reservation mismatch")
)

// refusal is an error whose text is exactly msg (as the nodes have always
// worded it) and whose kind is one of the sentinels.
type refusal struct {
	msg  string
	kind error
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.kind }

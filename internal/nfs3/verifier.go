package nfs3

import (
	"encoding/binary"
	"sync"
)

// verifier is the gateway's write verifier (RFC 1813 §3.3.7): random at
// every start, and changed whenever writes answered UNSTABLE may have
// been lost, so that clients send them again. One for the whole gateway,
// as the RFC has it ("consistent during a single instance" of the
// server): BSD and macOS clients keep one per mount and rewrite every
// uncommitted buffer when it changes, so verifiers per file would make
// them rewrite at every reply that alternates between files. What makes
// a loss rare instead is that a removed file's buffered writes are not
// one (see Gateway.forgetGone).
type verifier struct {
	mu sync.Mutex
	v  uint64
}

func (v *verifier) get() [8]byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v.v)
	return b
}

func (v *verifier) lost() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.v++
}

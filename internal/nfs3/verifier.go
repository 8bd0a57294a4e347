package nfs3

import (
	"encoding/binary"
	"sync"

	"github.com/sluicefs/sluice/internal/ids"
)

// verifiers are the gateway's write verifiers (RFC 1813 §3.3.7), one per
// file. A client compares the verifier of its UNSTABLE WRITEs to a file
// with that of the COMMIT of the file, and sends the writes again if they
// differ; so a loss of buffered writes need change only that file's. One
// verifier for the whole gateway made every client resend all its
// uncommitted writes to every file whenever any file lost some, which a
// temporary file removed before its writes were sent is enough for.
//
// A file's verifier is the gateway's random start-up value plus
// gen<<32 plus the file's losses in this gen. Losses are counted per file
// in a bounded table; when it is full, or a count would reach 1<<32, gen
// goes up and the table is emptied: every file's verifier changes (as
// with one verifier) and none ever returns to a value it had.
type verifiers struct {
	mu     sync.Mutex
	base   uint64
	gen    uint64
	losses map[ids.Ino]uint32
	max    int // bound on len(losses)
}

// maxLossEntries bounds the files whose losses are remembered apart.
const maxLossEntries = 1 << 16

func newVerifiers(base uint64, max int) *verifiers {
	return &verifiers{base: base, losses: map[ids.Ino]uint32{}, max: max}
}

// get returns ino's current verifier.
func (v *verifiers) get(ino ids.Ino) [8]byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v.base+v.gen<<32+uint64(v.losses[ino]))
	return b
}

// lost changes ino's verifier: writes to it answered UNSTABLE may not
// have reached the cluster.
func (v *verifiers) lost(ino ids.Ino) {
	v.mu.Lock()
	defer v.mu.Unlock()
	n, known := v.losses[ino]
	if n == 1<<32-1 || (!known && len(v.losses) >= v.max) {
		v.gen++
		clear(v.losses)
		return
	}
	v.losses[ino] = n + 1
}

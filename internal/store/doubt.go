package store

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/admit"
	"github.com/sluicefs/sluice/internal/ids"
)

// Doubt is a write the head replica aborted after some replica below it
// may have committed it (see admit.Doubt for what the head then admits).
type Doubt = admit.Doubt

// doubts is the in-memory copy of the durable doubt records, so a head
// write need not read the index to learn there is none.
type doubts struct {
	mu sync.Mutex
	m  map[ids.ChunkID]Doubt
}

func (ds *doubts) get(id ids.ChunkID) (Doubt, bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	d, ok := ds.m[id]
	return d, ok
}

func (ds *doubts) set(id ids.ChunkID, d Doubt) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.m == nil {
		ds.m = map[ids.ChunkID]Doubt{}
	}
	ds.m[id] = d
}

func (ds *doubts) clear(id ids.ChunkID) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	delete(ds.m, id)
}

// Doubt returns id's unresolved write, if any.
func (s *Store) Doubt(id ids.ChunkID) (Doubt, bool) { return s.doubts.get(id) }

func doubtKey(id ids.ChunkID) []byte { return chunkKey(kindDoubt, id) }

func encodeDoubt(d Doubt) []byte {
	v := make([]byte, 40)
	binary.BigEndian.PutUint64(v, d.Base)
	binary.BigEndian.PutUint64(v[8:], d.Version)
	binary.BigEndian.PutUint64(v[16:], d.Tag)
	binary.BigEndian.PutUint64(v[24:], uint64(d.Off))
	binary.BigEndian.PutUint64(v[32:], uint64(d.End))
	return v
}

func decodeDoubt(v []byte) (Doubt, error) {
	if len(v) != 40 {
		return Doubt{}, fmt.Errorf("doubt value of %d bytes: %w", len(v), ErrCorrupt)
	}
	d := Doubt{
		Base:    binary.BigEndian.Uint64(v),
		Version: binary.BigEndian.Uint64(v[8:]),
		Tag:     binary.BigEndian.Uint64(v[16:]),
		Off:     int64(binary.BigEndian.Uint64(v[24:])),
		End:     int64(binary.BigEndian.Uint64(v[32:])),
	}
	if d.Version <= d.Base || d.Off < 0 || d.End < d.Off {
		return Doubt{}, fmt.Errorf("doubt %+v: %w", d, ErrCorrupt)
	}
	return d, nil
}

// loadDoubts reads every doubt record into memory at open.
func (s *Store) loadDoubts() error {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{kindDoubt},
		UpperBound: []byte{kindDoubt + 1},
	})
	if err != nil {
		return fmt.Errorf("scan doubt records: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		id, err := chunkIDFromKey(it.Key())
		if err == nil {
			var d Doubt
			if d, err = decodeDoubt(it.Value()); err == nil {
				s.doubts.set(id, d)
			}
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("scan doubt records: %w", err)
		}
	}
	return it.Close()
}

// AbortInDoubt aborts a head write that some replica below may have
// committed, first recording the doubt durably so no later write is given
// one of its versions (see Doubt). Only a write opened with BeginHead may
// be aborted this way. If the record cannot be written the doubt is still
// kept in memory, so this process refuses conflicting writes; the error
// is returned.
func (w *Write) AbortInDoubt() error {
	if w.state != writeOpen {
		return nil
	}
	next, dec := admit.Step(w.view(), admit.Abort{InDoubt: true})
	if dec.Err != nil {
		w.Abort()
		return fmt.Errorf("store: abort %v v%d in doubt: %w", w.id, w.version, dec.Err)
	}
	d := next.Doubt
	w.s.doubts.set(w.id, d)
	defer w.Abort()
	if !w.s.gate.enter() {
		return fmt.Errorf("store: abort %v v%d in doubt: not recorded: %w", w.id, w.version, ErrClosed)
	}
	defer w.s.gate.exit()
	if err := w.s.db.Set(doubtKey(w.id), encodeDoubt(d), pebble.Sync); err != nil {
		return fmt.Errorf("store: abort %v v%d in doubt: record it: %w", w.id, w.version, err)
	}
	return nil
}

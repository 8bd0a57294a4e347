package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestDirectPlacementRoundTrip writes large appends through the mapped
// region (mixed with copied packets) and checks content and checksums.
func TestDirectPlacementRoundTrip(t *testing.T) {
	s := openStore(t, Options{BlockSize: 16384, MaxChunkSize: 64 << 20})
	rng := rand.New(rand.NewPCG(21, 22))
	m := newModel()
	const id = ids.ChunkID(7)
	for i := 0; i < 12; i++ {
		L := int64(len(m.data[id]))
		off := L + rng.Int64N(3)*rng.Int64N(100000) // append, sometimes past a hole
		if i%4 == 3 && L > 0 {
			off = rng.Int64N(L) // overwrite straddling the end: staged part + direct part
		}
		n := directMin + rng.IntN(2<<20)
		m.mustWrite(t, s, rng, id, off, randBytes(rng, n))
		m.check(t, s, id)
	}
	if _, err := s.Verify(id); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s)
	m.check(t, s, id)
}

// TestDirectAbortWaitsForReceiver: an abort while a packet is still being
// received into the mapping must not tear the mapping down under it; the
// chunk stays locked until the receiver is done, then everything of the
// write is gone.
func TestDirectAbortWaitsForReceiver(t *testing.T) {
	s := openStore(t, Options{BlockSize: 16384, MaxChunkSize: 64 << 20})
	rng := rand.New(rand.NewPCG(5, 6))
	m := newModel()
	const id = ids.ChunkID(9)
	m.mustWrite(t, s, rng, id, 0, randBytes(rng, 100000))

	w, err := s.BeginWrite(id, 100000, 4<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w.direct == nil {
		t.Fatal("no direct placement for a 4 MiB append")
	}
	<-w.direct.populated
	dst := w.DirectBegin(100000, 65536)
	if dst == nil {
		t.Fatal("populated region not handed out")
	}
	w.Abort() // the "fabric" still holds dst
	copy(dst, bytes.Repeat([]byte{0xAB}, len(dst)))
	if _, err := s.BeginWrite(id, 0, 1, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("chunk free while a packet is still being placed: %v", err)
	}
	if again := w.DirectBegin(200000, 10); again != nil {
		t.Fatal("aborted write still hands out its mapping")
	}
	w.DirectEnd() // the receiver finishes: the deferred abort runs now (in the background)
	var w2 *Write
	for deadline := time.Now().Add(2 * time.Second); ; {
		if w2, err = s.BeginWrite(id, 0, 1, 0); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err != nil {
		t.Fatalf("chunk still locked after the receiver finished: %v", err)
	}
	w2.Abort()
	m.check(t, s, id)
}

// TestDirectSyncThenAbort: data made durable in the mapping but never
// committed disappears, and the chunk lock is released.
func TestDirectSyncThenAbort(t *testing.T) {
	s := openStore(t, Options{BlockSize: 16384, MaxChunkSize: 64 << 20})
	rng := rand.New(rand.NewPCG(7, 8))
	m := newModel()
	const id = ids.ChunkID(11)
	m.mustWrite(t, s, rng, id, 0, randBytes(rng, 5000))
	data := randBytes(rng, 3<<20)
	w, err := s.BeginWrite(id, 5000, int64(len(data)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := placeAll(w, rng, 5000, data); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	m.check(t, s, id)
	s = reopen(t, s)
	m.check(t, s, id)
	m.mustWrite(t, s, rng, id, 5000, randBytes(rng, 10))
	m.check(t, s, id)
}

func TestDirectPlaceDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	s := openStore(t, Options{BlockSize: 16384, MaxChunkSize: 64 << 20})
	w, err := s.BeginWrite(3, 0, 32<<20, 0)
	if w != nil && w.direct == nil {
		t.Fatal("no direct placement for a 32 MiB write")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	<-w.direct.populated // the whole region is mapped
	src := make([]byte, 64<<10)
	var off int64
	allocs := testing.AllocsPerRun(100, func() {
		dst := w.DirectBegin(off, len(src))
		copy(dst, src)
		w.DirectEnd()
		if err := w.Place(off, dst); err != nil {
			t.Fatal(err)
		}
		off += int64(len(src))
	})
	if allocs != 0 {
		t.Fatalf("direct place allocates %.1f times per packet", allocs)
	}
}

// TestDirectPopulatorJumpsAheadOfPackets: once packets have outrun the
// populator (and were copied), it does not populate the pages behind
// them — mapping a page costs more than copying it — but starts again a
// step ahead, and only what it populated is handed out.
func TestDirectPopulatorJumpsAheadOfPackets(t *testing.T) {
	size := 8 * directStep
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	const base = 1 << 20
	d := &directMap{base: base, from: base, mem: mem, populated: make(chan struct{}), readyFrom: base}
	d.ready.Store(base)
	w := &Write{direct: d}
	// A packet three steps in is asked for before anything is populated:
	// refused (it will be copied).
	head := int64(base + 3*directStep + 1000)
	if w.DirectBegin(head-65536, 65536) != nil {
		t.Fatal("an unpopulated range was handed out")
	}
	d.populate(0)
	from := int64(base+4*directStep+pageSize) &^ (pageSize - 1)
	if d.readyFrom < head || d.readyFrom > from+pageSize || d.ready.Load() != base+int64(size) {
		t.Fatalf("populated [%d, %d), packets at %d", d.readyFrom, d.ready.Load(), head)
	}
	if w.DirectBegin(head, 65536) != nil {
		t.Fatal("a range behind the populated one was handed out")
	}
	if dst := w.DirectBegin(d.readyFrom, 65536); dst == nil {
		t.Fatal("a populated range was refused")
	} else {
		w.DirectEnd()
	}
}

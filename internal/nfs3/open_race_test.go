package nfs3

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestOpenWaitsForHandleDroppedMeanwhile: between a call's wait for the
// file's dropped handles and its keeping the handle it opened, another
// call opens a handle, buffers writes in it and drops it (a REMOVE of
// another name, a SETATTR). The first call must not keep its handle, whose
// attributes predate those writes, while they are still being sent: they
// would land on top of later writes through it. Before: it kept it at
// once.
func TestOpenWaitsForHandleDroppedMeanwhile(t *testing.T) {
	cl, _ := StartTestCluster(t, 3)
	ctx := context.Background()
	g, err := New(Options{Client: cl, AttrTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f, err := cl.Create(ctx, "/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	ino := f.Attr().Ino
	const mib = 1 << 20
	old := bytes.Repeat([]byte{1}, 9*mib)
	var dropped *openFile
	var inHook atomic.Bool
	g.testHookOpened = func(ids.Ino) {
		if !inHook.CompareAndSwap(false, true) {
			return // the call below
		}
		m, err := g.open(ctx, ino)
		if err != nil {
			t.Error(err)
			return
		}
		if _, _, err := m.b.WriteAtBuffered(ctx, old[:mib], 0); err != nil {
			t.Error(err)
			return
		}
		if _, buffered, err := m.b.WriteAtBuffered(ctx, old[mib:], mib); err != nil || !buffered {
			t.Errorf("second sequential write: buffered %v, %v", buffered, err)
			return
		}
		g.filesMu.Lock()
		dropped = g.files[ino]
		g.filesMu.Unlock()
		g.forget(ino) // its writes now go in the background
	}
	of, err := g.file(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	if dropped == nil {
		t.Fatal("the hook did not run")
	}
	select {
	case <-dropped.closed:
	default:
		t.Fatal("kept a new handle while a dropped one's writes were still being sent")
	}
	// And the consequence: a write through the new handle stays.
	patch := bytes.Repeat([]byte{2}, mib)
	if _, err := of.f.WriteAtContext(ctx, patch, 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := g.waitClosing(ctx, ino); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, mib)
	r, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadAt(got, 4*mib); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, patch) {
		t.Fatal("a write through the new handle was overwritten by the dropped handle's older writes")
	}
}

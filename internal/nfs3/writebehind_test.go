package nfs3_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// writeStable makes one WRITE and returns its status, how it was
// committed and the write verifier.
func (e *env) writeStable(t *testing.T, fh []byte, off uint64, p []byte, stable uint32) (nfs3.Status, uint32, []byte) {
	t.Helper()
	st, r := e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(off)
		w.Uint32(uint32(len(p)))
		w.Uint32(stable)
		w.Opaque(p)
	})
	if st != nfs3.OK {
		return st, 0, nil
	}
	nfs3.SkipWcc(r)
	n, committed, verf := r.Uint32(), r.Uint32(), r.Fixed(8)
	if r.Err() != nil || n != uint32(len(p)) {
		t.Fatalf("WRITE at %d: count %d, %v", off, n, r.Err())
	}
	return st, committed, bytes.Clone(verf)
}

// commit makes a COMMIT and returns its status and verifier.
func (e *env) commit(t *testing.T, fh []byte) (nfs3.Status, []byte) {
	t.Helper()
	st, r := e.call(t, nfs3.ProcCommit, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(0) })
	if st != nfs3.OK {
		return st, nil
	}
	nfs3.SkipWcc(r)
	return st, bytes.Clone(r.Fixed(8))
}

// TestWriteBehindCommit: UNSTABLE WRITEs that continue one another are
// buffered and answered UNSTABLE; other clients see them once COMMIT
// answers, with the verifier the WRITEs had; a FILE_SYNC WRITE is
// durable when answered; READ and GETATTR through the gateway see
// buffered writes at once.
func TestWriteBehindCommit(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "f", 0)
	const mib = 1 << 20
	file := fileData(3, 5*mib+333)
	var verf []byte
	unstable := 0
	for off := 0; off < len(file); off += mib {
		st, committed, v := e.writeStable(t, fh, uint64(off), file[off:min(off+mib, len(file))], nfs3.Unstable)
		if st != nfs3.OK {
			t.Fatalf("WRITE at %d: %d", off, st)
		}
		if verf != nil && !bytes.Equal(v, verf) {
			t.Fatalf("the verifier changed between WRITEs: %x then %x", verf, v)
		}
		verf = v
		if committed == nfs3.Unstable {
			unstable++
		}
	}
	if unstable == 0 {
		t.Fatal("no sequential UNSTABLE WRITE was buffered (all answered FILE_SYNC)")
	}
	if got := e.size(t, fh); got != int64(len(file)) {
		t.Fatalf("GETATTR after buffered writes: size %d, want %d", got, len(file))
	}
	e.checkRead(t, fh, file, 4*mib, mib)
	st, cv := e.commit(t, fh)
	if st != nfs3.OK || !bytes.Equal(cv, verf) {
		t.Fatalf("COMMIT: %d, verifier %x (WRITEs had %x)", st, cv, verf)
	}
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	f, err := other.Open(context.Background(), "/f")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(file)+1)
	if n, _ := f.ReadAt(got, 0); n != len(file) || !bytes.Equal(got[:n], file) {
		t.Fatalf("another client after COMMIT reads %d bytes (want %d; same: %v)", n, len(file), bytes.Equal(got[:n], file))
	}
	// FILE_SYNC: durable when answered.
	if st, committed, _ := e.writeStable(t, fh, uint64(len(file)), []byte("tail"), nfs3.FileSync); st != nfs3.OK || committed != nfs3.FileSync {
		t.Fatalf("FILE_SYNC WRITE: %d, committed %d", st, committed)
	}
	if f, err = other.Open(context.Background(), "/f"); err != nil || f.Size() != int64(len(file)+4) {
		t.Fatalf("after a FILE_SYNC WRITE another client sees size %d (%v), want %d", f.Size(), err, len(file)+4)
	}
}

// TestWriteBehindLostChangesVerifier: when buffered writes cannot be
// sent (the file was removed by another client), COMMIT fails and the
// write verifier changes, so the NFS client knows those UNSTABLE writes
// were not kept.
func TestWriteBehindLostChangesVerifier(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "f", 0)
	_, gfh := e.create(t, root, "g", 0)
	const mib = 1 << 20
	data := fileData(5, 3*mib)
	var verf []byte
	for off := 0; off < len(data); off += mib {
		_, committed, v := e.writeStable(t, fh, uint64(off), data[off:off+mib], nfs3.Unstable)
		verf = v
		if off > 0 && committed != nfs3.Unstable {
			t.Fatalf("sequential UNSTABLE WRITE at %d answered %d", off, committed)
		}
	}
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Remove(context.Background(), "/f"); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.commit(t, fh); st == nfs3.OK {
		t.Fatal("COMMIT of writes to a file removed meanwhile succeeded")
	}
	_, _, v := e.writeStable(t, gfh, 0, []byte("x"), nfs3.FileSync)
	if bytes.Equal(v, verf) {
		t.Fatalf("the write verifier %x did not change after buffered writes were lost", v)
	}
}

// TestReadAheadAcrossReads: sequential READs are read ahead (per file,
// across RPCs), with the block cache off and on (blocks read ahead then
// become cache blocks); a WRITE through the gateway into the range read
// ahead shows in the next READ.
func TestReadAheadAcrossReads(t *testing.T) {
	for _, cache := range []int64{-1, 4 << 20} {
		t.Run(fmt.Sprint("cache", cache), func(t *testing.T) { testReadAhead(t, cache) })
	}
}

func testReadAhead(t *testing.T, cache int64) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour, CacheBytes: cache})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "f", 0)
	const mib = 1 << 20
	file := fileData(7, 12*mib+5)
	e.writeAt(t, fh, 0, file)
	e.checkRead(t, fh, file, 0, mib)
	e.checkRead(t, fh, file, mib, mib) // sequential: read ahead from here
	patch := bytes.Repeat([]byte{0xEE}, 4096)
	if st, _, _ := e.writeStable(t, fh, 5*mib+100, patch, nfs3.FileSync); st != nfs3.OK {
		t.Fatalf("WRITE: %d", st)
	}
	copy(file[5*mib+100:], patch)
	for off := uint64(2 * mib); off < uint64(len(file)); off += mib {
		e.checkRead(t, fh, file, off, mib)
	}
	// And again, from the start: the same data (from the cache, if on).
	for off := uint64(0); off < uint64(len(file)); off += mib {
		e.checkRead(t, fh, file, off, mib)
	}
}

// TestRemoveThroughGatewayKeepsVerifier: a file written UNSTABLE and
// removed through the gateway before its writes were sent (a temporary
// file) is no loss: its buffered writes are dropped, and the write
// verifier, which is one for the whole gateway (RFC 1813), stays, so no
// client resends what it wrote to other files. Renaming over such a file
// likewise. Before: the writes were sent to the removed file, failed,
// and every client saw a new verifier.
func TestRemoveThroughGatewayKeepsVerifier(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	_, gfh := e.create(t, root, "g", 0)
	const mib = 1 << 20
	_, _, verf := e.writeStable(t, gfh, 0, fileData(1, mib), nfs3.Unstable)
	for round, replace := range []bool{false, true} {
		name := fmt.Sprintf("tmp%d", round)
		_, fh := e.create(t, root, name, 0)
		data := fileData(byte(round+2), 6*mib)
		for off := 0; off < len(data); off += mib {
			if st, _, _ := e.writeStable(t, fh, uint64(off), data[off:off+mib], nfs3.Unstable); st != nfs3.OK {
				t.Fatalf("WRITE: %d", st)
			}
		}
		var st nfs3.Status
		if replace { // another file renamed over it
			_, ofh := e.create(t, root, name+"-new", 0)
			_ = ofh
			st, _ = e.call(t, nfs3.ProcRename, func(w *xdr.Writer) {
				w.Opaque(root)
				w.String(name + "-new")
				w.Opaque(root)
				w.String(name)
			})
		} else {
			st, _ = e.call(t, nfs3.ProcRemove, func(w *xdr.Writer) {
				w.Opaque(root)
				w.String(name)
			})
		}
		if st != nfs3.OK {
			t.Fatalf("round %d: %d", round, st)
		}
		if st, cv := e.commit(t, gfh); st != nfs3.OK || !bytes.Equal(cv, verf) {
			t.Fatalf("round %d: COMMIT of g: %d, verifier %x; g's WRITE had %x, and only a removed file's writes were dropped", round, st, cv, verf)
		}
	}
}

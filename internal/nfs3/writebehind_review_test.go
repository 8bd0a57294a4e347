package nfs3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// TestCommitWaitsForForgottenHandle: a REMOVE of another name of a file
// makes the gateway drop its handle of the file, whose buffered writes
// are then sent in the background. A COMMIT of the file right after must
// still answer only once those writes are durable and recorded (else a
// crash of the gateway loses writes a client was told were committed).
func TestCommitWaitsForForgottenHandle(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const mib = 1 << 20
	for round := 0; round < 3; round++ {
		name := "f" + string(rune('a'+round))
		_, fh := e.create(t, root, name, 0)
		// A second name, removed below.
		st, _ := e.call(t, nfs3.ProcLink, func(w *xdr.Writer) {
			w.Opaque(fh)
			w.Opaque(root)
			w.String(name + "2")
		})
		if st != nfs3.OK {
			t.Fatalf("LINK: %d", st)
		}
		data := fileData(byte(round+11), 12*mib)
		var verf []byte
		for off := 0; off < len(data); off += mib {
			st, _, v := e.writeStable(t, fh, uint64(off), data[off:off+mib], nfs3.Unstable)
			if st != nfs3.OK {
				t.Fatalf("WRITE at %d: %d", off, st)
			}
			verf = v
		}
		st, _ = e.call(t, nfs3.ProcRemove, func(w *xdr.Writer) {
			w.Opaque(root)
			w.String(name + "2")
		})
		if st != nfs3.OK {
			t.Fatalf("REMOVE: %d", st)
		}
		st, cv := e.commit(t, fh)
		if st != nfs3.OK || !bytes.Equal(cv, verf) {
			// A new verifier makes the client send again: not a loss.
			continue
		}
		f, err := other.Open(context.Background(), "/"+name)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data)+1)
		n, err := f.ReadAt(got, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		if n != len(data) || !bytes.Equal(got[:n], data) {
			t.Fatalf("round %d: COMMIT answered OK with the WRITEs' verifier, but another client then reads %d of %d bytes (same: %v)", round, n, len(data), bytes.Equal(got[:n], data[:min(n, len(data))]))
		}
	}
}

// TestFailedWriteThroughKeepsVerifier: a WRITE that fails by itself
// (written through, nothing buffered lost: here its file was removed by
// another client) must not change the write verifier, or any client can
// make every other client send all its UNSTABLE writes again, as often
// as it likes.
func TestFailedWriteThroughKeepsVerifier(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	_, gfh := e.create(t, root, "g", 0)
	_, ffh := e.create(t, root, "f", 0)
	const mib = 1 << 20
	data := fileData(9, 3*mib)
	var verf []byte
	for off := 0; off < len(data); off += mib {
		_, _, verf = e.writeStable(t, gfh, uint64(off), data[off:off+mib], nfs3.Unstable)
	}
	// The gateway keeps a handle of f (attributes trusted an hour).
	if st, _, _ := e.writeStable(t, ffh, 0, []byte("x"), nfs3.FileSync); st != nfs3.OK {
		t.Fatalf("WRITE to f: %d", st)
	}
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Remove(context.Background(), "/f"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if st, _, _ := e.writeStable(t, ffh, 0, []byte("x"), nfs3.FileSync); st == nfs3.OK {
			t.Fatal("a WRITE to a removed file succeeded")
		}
	}
	if st, cv := e.commit(t, gfh); st != nfs3.OK || !bytes.Equal(cv, verf) {
		t.Fatalf("COMMIT of g: %d, verifier %x; g's WRITEs had %x and lost nothing", st, cv, verf)
	}
}

// TestWriteAfterForgetNotOverwritten: the gateway drops its handle of a
// file with writes buffered (a REMOVE of another name of it) and sends
// them in the background; a WRITE to the file right after, answered
// FILE_SYNC, must not then be overwritten by those older writes landing
// after it.
func TestWriteAfterForgetNotOverwritten(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const mib = 1 << 20
	for round := 0; round < 3; round++ {
		name := "w" + string(rune('a'+round))
		_, fh := e.create(t, root, name, 0)
		if st, _ := e.call(t, nfs3.ProcLink, func(w *xdr.Writer) {
			w.Opaque(fh)
			w.Opaque(root)
			w.String(name + "2")
		}); st != nfs3.OK {
			t.Fatalf("LINK: %d", st)
		}
		data := fileData(byte(round+21), 12*mib)
		for off := 0; off < len(data); off += mib {
			if st, _, _ := e.writeStable(t, fh, uint64(off), data[off:off+mib], nfs3.Unstable); st != nfs3.OK {
				t.Fatalf("WRITE at %d: %d", off, st)
			}
		}
		if st, _ := e.call(t, nfs3.ProcRemove, func(w *xdr.Writer) {
			w.Opaque(root)
			w.String(name + "2")
		}); st != nfs3.OK {
			t.Fatalf("REMOVE: %d", st)
		}
		patch := bytes.Repeat([]byte{0xAB}, 64<<10)
		const at = 11 * mib
		if st, committed, _ := e.writeStable(t, fh, at, patch, nfs3.FileSync); st != nfs3.OK || committed != nfs3.FileSync {
			t.Fatalf("FILE_SYNC WRITE: %d, committed %d", st, committed)
		}
		if st, _ := e.commit(t, fh); st != nfs3.OK {
			t.Fatalf("COMMIT: %d", st)
		}
		f, err := other.Open(context.Background(), "/"+name)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(patch))
		if _, err := f.ReadAt(got, at); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		if !bytes.Equal(got, patch) {
			t.Fatalf("round %d: a FILE_SYNC WRITE was overwritten by older buffered writes sent after it", round)
		}
	}
}

// TestNoBufferWritesThrough: with no buffer memory (sluice nfs
// --buffer-mib 0) every WRITE, sequential UNSTABLE ones included, is
// durable and recorded when answered, and says so (FILE_SYNC).
func TestNoBufferWritesThrough(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour, BufferBytes: -1})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "f", 0)
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	const piece = 256 << 10
	data := fileData(3, 8*piece)
	for off := 0; off < len(data); off += piece {
		st, committed, _ := e.writeStable(t, fh, uint64(off), data[off:off+piece], nfs3.Unstable)
		if st != nfs3.OK || committed != nfs3.FileSync {
			t.Fatalf("WRITE at %d: %d, committed %d (want FILE_SYNC)", off, st, committed)
		}
		f, err := other.Open(context.Background(), "/f")
		if err != nil {
			t.Fatal(err)
		}
		if f.Size() != int64(off+piece) {
			t.Fatalf("after the WRITE at %d another client sees size %d", off, f.Size())
		}
	}
}

package nfs3

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// rootGateway is testGateway's, exported to root unsquashed (the writer
// of the file, as a COMMIT's caller is).
func rootGateway(t *testing.T, n int) (*Gateway, ids.Ino) {
	t.Helper()
	exports, err := nfsexport.Parse("exports", "/ 127.0.0.1(rw,no_root_squash)")
	if err != nil {
		t.Fatal(err)
	}
	g, ino, _ := testGateway(t, Options{AttrTTL: time.Hour, Exports: exports}, n)
	return g, ino
}

// commitAsync runs COMMIT of ino on g in the background, as root; the
// channel gives its reply.
func commitAsync(g *Gateway, ino ids.Ino) <-chan []byte {
	done := make(chan []byte, 1)
	go func() {
		var args, w xdr.Writer
		args.Opaque(g.Handle("/", ino))
		args.Uint64(0)
		args.Uint32(0)
		c := &oncrpc.Call{Prog: ProgNFS, Vers: Version, Proc: ProcCommit, CredFlavor: oncrpc.AuthSys, Cred: oncrpc.AuthSysCred{Machine: "test"}, Remote: "127.0.0.1:700"}
		g.nfs(context.Background(), c, xdr.NewReader(args.B), &w)
		done <- w.B
	}()
	return done
}

// commitReply decodes a COMMIT reply: status and, if OK, the verifier.
func commitReply(t *testing.T, b []byte) (Status, []byte) {
	t.Helper()
	r := xdr.NewReader(b)
	st := Status(r.Uint32())
	if st != OK {
		return st, nil
	}
	skipWcc(r)
	v := r.Fixed(8)
	if r.Err() != nil {
		t.Fatalf("COMMIT reply %x: %v", b, r.Err())
	}
	return st, bytes.Clone(v)
}

func skipWcc(r *xdr.Reader) {
	if r.Bool() { // pre_op_attr: size, mtime, ctime
		r.Fixed(24)
	}
	SkipPostOp(r)
}

// parkCommits makes COMMITs of ino wait, as for a dropped handle still
// sending its writes: the returned function lets them go on.
func parkCommits(g *Gateway, ino ids.Ino) func() {
	p := &openFile{closed: make(chan struct{})}
	g.filesMu.Lock()
	g.closing[ino] = append(g.closing[ino], p)
	g.filesMu.Unlock()
	return func() { // as closeFile ends
		close(p.closed)
		g.filesMu.Lock()
		defer g.filesMu.Unlock()
		g.closing[ino] = slices.DeleteFunc(g.closing[ino], func(c *openFile) bool { return c == p })
	}
}

// waitParked waits until a call is waiting, in a function named frame
// (a COMMIT in settle by default), for the dropped handles it found (so
// it has looked at them, and read anything it reads before).
func waitParked(t *testing.T, frame ...string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !parked(frame...); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("no call waiting in %v", frame)
		}
	}
}

// parked reports whether a goroutine waits for dropped handles to close,
// called from frames (default: a COMMIT's settle).
func parked(frames ...string) bool {
	if len(frames) == 0 {
		frames = []string{"nfs3.(*Gateway).settle(", "nfs3.(*Gateway).commit("}
	}
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for _, gr := range strings.Split(string(buf[:n]), "\n\n") {
		lines := strings.SplitN(gr, "\n", 3)
		if len(lines) < 3 || !strings.Contains(lines[0], " [select") ||
			!strings.Contains(lines[1], "nfs3.(*Gateway).waitClosing(") && !strings.Contains(lines[1], "nfs3.waitClosed(") {
			continue // not waiting for dropped handles
		}
		all := true
		for _, f := range frames {
			all = all && strings.Contains(gr, f)
		}
		if all {
			return true
		}
	}
	return false
}

// TestCommitSeesHandleDroppedMeanwhile: a handle of the file dropped
// while a COMMIT is under way (a SETATTR, a REMOVE of another name)
// moves from the kept handles to those being closed. A COMMIT that
// looked at the two one after the other found it in neither, and
// answered while writes buffered in it were not yet durable (its close
// not yet under way here): a crash of the gateway then lost writes the
// client had been told were committed, and a failure of their send
// changed the verifier too late.
func TestCommitSeesHandleDroppedMeanwhile(t *testing.T) {
	g, ino := rootGateway(t, 0)
	g.bufOpts.IdleFlush = 0 // buffered writes stay buffered until sent
	ctx := context.Background()
	of, err := g.file(ctx, ino)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 1024)
	if _, buffered, err := of.b.WriteAtBuffered(ctx, data[:8192], 0); err != nil || buffered {
		t.Fatalf("first write: buffered %v, %v", buffered, err)
	}
	if _, buffered, err := of.b.WriteAtBuffered(ctx, data[8192:], 8192); err != nil || !buffered {
		t.Fatalf("second write: buffered %v, %v", buffered, err)
	}

	release := parkCommits(g, ino)
	done := commitAsync(g, ino)
	waitParked(t)
	// The handle dropped, as forget does (its close not yet running).
	g.filesMu.Lock()
	delete(g.files, ino)
	of.closed = make(chan struct{})
	g.closing[ino] = append(g.closing[ino], of)
	g.filesMu.Unlock()
	release()

	var reply []byte
	select {
	case reply = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("COMMIT did not answer")
	}
	if st, _ := commitReply(t, reply); st != OK {
		t.Fatalf("COMMIT: status %d", st)
	}
	if of.b.Pending() {
		t.Fatal("COMMIT answered OK with writes to the file still buffered in a handle dropped meanwhile")
	}
	f, err := g.cl.OpenAttr(of.f.Attr(), "check")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAtContext(ctx, got, 0); (err != nil && !errors.Is(err, io.EOF)) || !bytes.Equal(got[:n], data) {
		t.Fatalf("after COMMIT the file holds %d bytes (%v), not what was written", n, err)
	}
}

// TestCommitVerifierAfterLoss: a loss of the file's buffered writes while
// a COMMIT is under way, whose failure another call took (a READ, a
// GETATTR or another COMMIT that flushed first), leaves this COMMIT
// nothing to flush. It must not answer with the verifier from before the
// loss: the client would take the lost writes, answered UNSTABLE under
// it, for committed. (The loss is stood in for by its effect, g.lost.)
func TestCommitVerifierAfterLoss(t *testing.T) {
	g, ino := rootGateway(t, 4096)
	before := g.verf.get()
	release := parkCommits(g, ino)
	done := commitAsync(g, ino)
	waitParked(t)
	g.lost(ino, errors.New("a send of buffered writes failed"))
	release()

	var reply []byte
	select {
	case reply = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("COMMIT did not answer")
	}
	st, v := commitReply(t, reply)
	if st == OK && bytes.Equal(v, before[:]) {
		t.Fatalf("COMMIT answered OK with the verifier %x from before the loss", v)
	}
}

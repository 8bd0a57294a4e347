package meta

import (
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestTempVerdict(t *testing.T) {
	const grace = time.Minute
	now := int64(100 * time.Minute)
	for _, c := range []struct {
		name        string
		rec         tempRec
		named, live bool
		want        tempAction
	}{
		{"renamed or removed", tempRec{}, false, true, tempForget},
		{"writer alive", tempRec{}, true, true, tempKeep},
		{"writer alive again", tempRec{Lapsed: now - 10}, true, true, tempRevive},
		{"lapse first seen", tempRec{}, true, false, tempNote},
		{"within the grace", tempRec{Lapsed: now - int64(grace) + 1}, true, false, tempKeep},
		{"grace over", tempRec{Lapsed: now - int64(grace)}, true, false, tempRemove},
	} {
		if got := tempVerdict(c.rec, c.named, c.live, now, grace); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// mkTemp creates name in / as a put's temporary of session.
func (f *fixture) mkTemp(name string, session uint64) ids.Ino {
	f.t.Helper()
	r, err := f.s.create(1, metaapi.CreateReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Type: metaapi.TypeFile,
		Mode: 0o644, Exclusive: true, TempSession: session, Who: root})
	if err != nil {
		f.t.Fatalf("create temporary %s: %v", name, err)
	}
	return r.Attr.Ino
}

func (f *fixture) tempFiles() int64 {
	f.t.Helper()
	st, err := f.s.Status()
	if err != nil {
		f.t.Fatal(err)
	}
	return st.TempFiles
}

func TestTempFilesOfLapsedSessions(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.LockLease = 30 * time.Second; o.TempGrace = time.Minute })
	f.addNodes(3)
	f.tree("/plain")
	dead := f.mkTemp(".x.sluice-put-1", 7)
	f.layout("/.x.sluice-put-1", 0, 3*testChunkSize, true) // chunks written, size not committed
	f.mkTemp(".y.sluice-put-2", 8)
	slow := f.mkTemp(".z.sluice-put-3", 9)
	if n := f.tempFiles(); n != 3 {
		t.Fatalf("status counts %d temporary files, want 3", n)
	}
	st, _ := f.s.Status()
	if st.TempBytes != 3*testChunkSize {
		t.Errorf("status: temporary files hold %d bytes, want the %d of the chunks placed", st.TempBytes, 3*testChunkSize)
	}
	// A put that finished: renamed into place, a file like any other.
	if err := f.s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: ".y.sluice-put-2", NewParent: ids.RootIno, NewName: "y", Who: root}); err != nil {
		t.Fatal(err)
	}
	if n := f.tempFiles(); n != 2 {
		t.Fatalf("after the rename, status counts %d temporary files, want 2", n)
	}
	renew := func() {
		t.Helper()
		if _, err := f.s.LockSession(1, metaapi.LockSessionReq{Session: 9}); err != nil {
			t.Fatal(err)
		}
	}
	// Session 7's writer died; session 9's is slow but renews.
	for range 10 {
		f.clk.Advance(20 * time.Second)
		renew()
		f.s.SweepTemps()
	}
	if f.exists("/.x.sluice-put-1") {
		t.Errorf("the dead writer's file is still there 200 s after its last renewal (lease 30 s, grace 1 min)")
	}
	f.wantFreed(dead)
	for _, p := range []string{"/plain", "/y", "/.z.sluice-put-3"} {
		if !f.exists(p) {
			t.Errorf("%s was removed", p)
		}
	}
	// A slow writer whose session lapsed for less than the grace keeps
	// its file once it renews again.
	f.clk.Advance(50 * time.Second)
	f.s.SweepTemps() // lapsed: noted
	f.clk.Advance(30 * time.Second)
	renew()
	f.s.SweepTemps() // live again
	f.clk.Advance(50 * time.Second)
	renew()
	f.s.SweepTemps()
	if !f.exists("/.z.sluice-put-3") || f.ino("/.z.sluice-put-3") != slow {
		t.Errorf("a writer back within the grace lost its file")
	}
	if n := f.tempFiles(); n != 1 {
		t.Errorf("status counts %d temporary files, want 1", n)
	}
	if n := f.countKeys(pTemp); n != 1 {
		t.Errorf("%d temporary file records, want 1", n)
	}
}

func TestTempOnlyForNewFiles(t *testing.T) {
	f := newFixture(t)
	for _, req := range []metaapi.CreateReq{
		{Name: "a", Type: metaapi.TypeFile, TempSession: 1},                      // not exclusive: may be an existing file
		{Name: "d", Type: metaapi.TypeDir, Exclusive: true, TempSession: 1},      // not a file
		{Type: metaapi.TypeFile, Exclusive: true, Tmpfile: true, TempSession: 1}, // no name to remove
	} {
		req.Parent, req.Mode, req.Who = ids.RootIno, 0o644, root
		if _, err := f.s.create(1, req); !metaapi.IsCode(err, metaapi.EINVAL) {
			t.Errorf("create %+v: %v, want EINVAL", req, err)
		}
	}
	// Another client's session is not this one's to name.
	if _, err := f.s.LockSession(2, metaapi.LockSessionReq{Session: 5}); err != nil {
		t.Fatal(err)
	}
	_, err := f.s.create(1, metaapi.CreateReq{Parent: ids.RootIno, Name: "b", Type: metaapi.TypeFile, Exclusive: true, TempSession: 5, Who: root})
	if !metaapi.IsCode(err, metaapi.EPERM) || f.exists("/b") {
		t.Errorf("temporary of another client's session: %v, want EPERM and no file", err)
	}
}

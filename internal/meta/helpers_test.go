package meta

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// testChunkSize keeps layout arithmetic readable in tests.
const testChunkSize = 1 << 20

var (
	root  = metaapi.Who{UID: 0, GID: 0}
	alice = metaapi.Who{UID: 1000, GID: 1000}
	bob   = metaapi.Who{UID: 1001, GID: 1001}
	carol = metaapi.Who{UID: 1002, GID: 1002, GIDs: []uint32{1000}} // in alice's group
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	t   testing.TB
	s   *Service
	clk *fakeClock
	opt Options
}

// newFixture opens a service on an in-memory pebble with a fake clock and
// no background sweeper, and checks its invariants when the test ends.
func newFixture(t testing.TB, mods ...func(*Options)) *fixture {
	t.Helper()
	clk := newClock()
	opts := Options{
		Dir:           t.TempDir(),
		Logger:        testLogger(),
		Now:           clk.Now,
		ChunkSize:     testChunkSize,
		SweepInterval: -1,
		Seed:          1,
		fs:            vfs.NewMem(),
	}
	for _, m := range mods {
		m(&opts)
	}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, s: s, clk: clk, opt: opts}
	t.Cleanup(func() {
		if !s.isClosed() {
			if err := s.Check(); err != nil {
				t.Errorf("invariants broken at end of test:\n%v", err)
			}
			s.Close()
		}
	})
	return f
}

func (s *Service) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

func onDisk(o *Options) { o.fs = nil }

// testLogger discards logs unless SLUICE_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// mk creates name in the directory at parent path, failing the test on
// error. Targets of symlinks follow a "->" in name: "l->target".
func (f *fixture) mk(parent, name string, typ metaapi.FileType, mode uint32, who metaapi.Who) metaapi.Attr {
	f.t.Helper()
	req := metaapi.CreateReq{Parent: f.ino(parent), Name: metaapi.ByteString(name), Type: typ, Mode: mode, Who: who}
	if typ == metaapi.TypeSymlink {
		n, t, _ := strings.Cut(name, "->")
		req.Name, req.Target = metaapi.ByteString(n), metaapi.ByteString(t)
	}
	a, err := f.s.Create(req)
	if err != nil {
		f.t.Fatalf("create %s/%s: %v", parent, name, err)
	}
	return a
}

// tree creates paths as root: "dir/", "file", "link->target", "fifo|".
func (f *fixture) tree(paths ...string) {
	f.t.Helper()
	for _, p := range paths {
		typ := metaapi.TypeFile
		mode := uint32(0o644)
		switch {
		case strings.HasSuffix(p, "/"):
			typ, mode, p = metaapi.TypeDir, 0o755, strings.TrimSuffix(p, "/")
		case strings.Contains(p, "->"):
			typ = metaapi.TypeSymlink
		case strings.HasSuffix(p, "|"):
			typ, p = metaapi.TypeFIFO, strings.TrimSuffix(p, "|")
		}
		dir, name := splitPath(p)
		f.mk(dir, name, typ, mode, root)
	}
}

func splitPath(p string) (dir, name string) {
	arrow := strings.Index(p, "->")
	head := p
	if arrow >= 0 {
		head = p[:arrow]
	}
	i := strings.LastIndexByte(head, '/')
	if i <= 0 {
		return "/", p[i+1:]
	}
	return p[:i], p[i+1:]
}

// attr resolves a path (without following a final symlink).
func (f *fixture) attr(path string) metaapi.Attr {
	f.t.Helper()
	a, err := f.s.Resolve(metaapi.ResolveReq{Path: metaapi.ByteString(path)})
	if err != nil {
		f.t.Fatalf("resolve %s: %v", path, err)
	}
	return a
}

func (f *fixture) ino(path string) ids.Ino { f.t.Helper(); return f.attr(path).Ino }

func (f *fixture) exists(path string) bool {
	_, err := f.s.Resolve(metaapi.ResolveReq{Path: metaapi.ByteString(path)})
	return err == nil
}

func (f *fixture) names(path string) []string {
	f.t.Helper()
	r, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino(path), Who: root})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range r.Entries {
		out = append(out, string(e.Name))
	}
	return out
}

// wantCode fails unless err carries code ("" means success).
func wantCode(t testing.TB, err error, code metaapi.Code) {
	t.Helper()
	switch {
	case code == "" && err != nil:
		t.Fatalf("unexpected error %v", err)
	case code != "" && err == nil:
		t.Fatalf("succeeded, want %s", code)
	case code != "" && !metaapi.IsCode(err, code):
		t.Fatalf("err = %v, want %s", err, code)
	}
}

func ptr[T any](v T) *T { return &v }

func repeat(c string, n int) string { return strings.Repeat(c, n) }

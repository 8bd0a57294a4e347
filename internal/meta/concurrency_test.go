package meta

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestConcurrentMutations hammers two directories with creates, links,
// renames and removes over a small set of colliding names from many
// goroutines (run it with -race), on a real disk so group commit is
// exercised, then checks every invariant: entries and link counts agree,
// directory link counts match their subdirectories, counters match.
func TestConcurrentMutations(t *testing.T) {
	f := newFixture(t, onDisk)
	f.tree("/d/", "/d2/")
	dirs := []ids.Ino{f.ino("/d"), f.ino("/d2")}
	const workers, ops, nnames = 8, 60, 10
	name := func(r *rand.Rand) string { return fmt.Sprintf("n%d", r.IntN(nnames)) }
	allowed := map[metaapi.Code]bool{
		metaapi.ENOENT: true, metaapi.EEXIST: true, metaapi.ENOTEMPTY: true, metaapi.EISDIR: true,
		metaapi.ENOTDIR: true, metaapi.EPERM: true, metaapi.EINVAL: true,
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*ops)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			for i := 0; i < ops; i++ {
				p, q := dirs[r.IntN(2)], dirs[r.IntN(2)]
				var err error
				switch r.IntN(7) {
				case 0:
					_, err = f.s.Create(metaapi.CreateReq{Parent: p, Name: metaapi.ByteString(name(r)), Type: metaapi.TypeFile, Exclusive: r.IntN(2) == 0, Who: root})
				case 1:
					_, err = f.s.Create(metaapi.CreateReq{Parent: p, Name: metaapi.ByteString(name(r)), Type: metaapi.TypeDir, Mode: 0o755, Who: root})
				case 2, 3:
					err = f.s.Rename(metaapi.RenameReq{OldParent: p, OldName: metaapi.ByteString(name(r)), NewParent: q, NewName: metaapi.ByteString(name(r)), NoReplace: r.IntN(4) == 0, Who: root})
				case 4:
					err = f.s.Remove(metaapi.RemoveReq{Parent: p, Name: metaapi.ByteString(name(r)), Dir: r.IntN(2) == 0, Who: root})
				case 5:
					var a metaapi.Attr
					if a, err = f.s.Lookup(metaapi.LookupReq{Parent: p, Name: metaapi.ByteString(name(r))}); err == nil {
						_, err = f.s.Link(metaapi.LinkReq{Ino: a.Ino, NewParent: q, NewName: metaapi.ByteString(name(r)), Who: root})
					}
				case 6: // populate a subdirectory so rmdir and rename-over see non-empty dirs
					var a metaapi.Attr
					if a, err = f.s.Lookup(metaapi.LookupReq{Parent: p, Name: metaapi.ByteString(name(r))}); err == nil {
						_, err = f.s.Create(metaapi.CreateReq{Parent: a.Ino, Name: "x", Type: metaapi.TypeFIFO, Who: root})
					}
				}
				var me *metaapi.Error
				if err != nil {
					if !asMetaErr(err, &me) || !allowed[me.Code] {
						errs <- err
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("unexpected error: %v", err)
	}
	if err := f.s.Check(); err != nil {
		t.Fatalf("invariants broken:\n%v", err)
	}
	// Cross-check link counts against a listing.
	for _, d := range dirs {
		r, err := f.s.Readdir(metaapi.ReaddirReq{Ino: d, Who: root})
		if err != nil {
			t.Fatal(err)
		}
		subdirs := uint32(0)
		for _, e := range r.Entries {
			if e.Type == metaapi.TypeDir {
				subdirs++
			}
		}
		a, _ := f.s.GetAttr(metaapi.GetAttrReq{Ino: d})
		if a.Nlink != 2+subdirs {
			t.Fatalf("dir %d: nlink %d with %d subdirectories", d, a.Nlink, subdirs)
		}
	}
	// Everything acknowledged is durable: a restart sees the same state.
	st := f.s.Status2()
	f.reopen()
	if st2 := f.s.Status2(); st2.Files != st.Files || st2.Dirs != st.Dirs {
		t.Fatalf("after reopen %+v, before %+v", st2, st)
	}
	if err := f.s.Check(); err != nil {
		t.Fatal(err)
	}
}

func asMetaErr(err error, me **metaapi.Error) bool {
	e, ok := err.(*metaapi.Error)
	*me = e
	return ok
}

// BenchmarkCreateParallel measures durable creates from many goroutines
// on a real disk; group commit lets them share WAL fsyncs.
func BenchmarkCreateParallel(b *testing.B) {
	f := newFixture(b, onDisk)
	var n atomicCounter
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			name := fmt.Sprintf("f%d", n.next())
			if _, err := f.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Who: root}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCounter) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}

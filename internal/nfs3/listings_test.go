package nfs3

import (
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestListingsBoundedByBytes: listings of long names are evicted, least
// recently used first, once their entries' memory passes the bound; the
// listing being extended is kept.
func TestListingsBoundedByBytes(t *testing.T) {
	var l listings
	l.init()
	l.maxBytes = 10_000
	long := strings.Repeat("n", 255)
	page := make([]metaapi.Dirent, 10) // about 3 KB
	for i := range page {
		page[i] = metaapi.Dirent{Name: metaapi.ByteString(long), Ino: 1}
	}
	var verfs []uint64
	for i := range 5 {
		v, ls := l.start(1)
		verfs = append(verfs, v)
		ls.mu.Lock()
		l.add(ls, page, true)
		ls.mu.Unlock()
		if l.bytes > l.maxBytes {
			t.Fatalf("listing %d: %d bytes held, bound %d", i, l.bytes, l.maxBytes)
		}
	}
	if l.get(verfs[0], 1) != nil || l.get(verfs[4], 1) == nil {
		t.Fatal("not the oldest listing evicted")
	}
	// One listing larger than the bound is kept while it is extended.
	v, ls := l.start(2)
	for range 5 {
		ls.mu.Lock()
		l.add(ls, page, false)
		ls.mu.Unlock()
	}
	if l.get(v, 2) == nil || len(l.m) != 1 {
		t.Fatalf("the listing being extended was evicted (%d held)", len(l.m))
	}
	if want := entriesBytes(ls.ents); l.bytes != want {
		t.Fatalf("%d bytes counted, want %d", l.bytes, want)
	}
}

package fusefs

import (
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestDirAttrs(t *testing.T) {
	now := time.Unix(1000, 0)
	d := dirAttrs{ttl: time.Second, now: func() time.Time { return now }}
	dir := metaapi.Attr{Ino: 7, Type: metaapi.TypeDir, Nlink: 3, Mtime: 42}
	file := metaapi.Attr{Ino: 8, Type: metaapi.TypeFile}
	if _, _, ok := d.get(7); ok {
		t.Fatal("empty cache answered")
	}
	d.note([]metaapi.Attr{dir, file})
	if a, left, ok := d.get(7); !ok || a != dir || left != time.Second {
		t.Fatalf("get after note: %+v, %v left, %v", a, left, ok)
	}
	if _, _, ok := d.get(8); ok {
		t.Fatal("a file's attributes were kept")
	}
	now = now.Add(999 * time.Millisecond)
	if _, left, ok := d.get(7); !ok || left != time.Millisecond {
		t.Fatalf("at 999ms: %v left, %v; want 1ms left", left, ok)
	}
	now = now.Add(time.Millisecond)
	if _, _, ok := d.get(7); ok {
		t.Fatal("answered at the timeout")
	}
	d.note([]metaapi.Attr{dir})
	d.forget(7)
	if _, _, ok := d.get(7); ok {
		t.Fatal("answered after forget")
	}
	for i := 0; i < 3*maxDirAttrs; i++ {
		d.note([]metaapi.Attr{{Ino: ids.Ino(100 + i), Type: metaapi.TypeDir}})
	}
	if len(d.m) > maxDirAttrs {
		t.Fatalf("%d entries, bound %d", len(d.m), maxDirAttrs)
	}
	off := dirAttrs{ttl: 0, now: time.Now}
	off.note([]metaapi.Attr{dir})
	if _, _, ok := off.get(7); ok {
		t.Fatal("attribute timeout 0 cached")
	}
}

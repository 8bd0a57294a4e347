package sdk_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/sdk"
)

// TestNamesAreBytes: the SDK's path and inode calls carry names, symlink
// targets and attribute names byte for byte, whatever the bytes (every
// value but NUL and '/'); two names that differ only in bytes that are
// not UTF-8 are two files.
func TestNamesAreBytes(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	var names []string
	for b := 1; b < 256; b++ {
		if b != '/' && b != '.' {
			names = append(names, string([]byte{byte(b)}))
		}
	}
	names = append(names, "caf\xe9.txt", "caf\xe8.txt", "caf\ufffd.txt", "\xc0\xaf", "\xed\xa0\x80", strings.Repeat("\xfe", 255))
	slices.Sort(names)
	for _, d := range []string{"/d", "/l"} {
		if err := cl.Mkdir(ctx, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		if _, err := cl.Put(ctx, "/d/"+n, strings.NewReader(n), 0o644); err != nil {
			t.Fatalf("put %q: %v", n, err)
		}
		if err := cl.Symlink(ctx, "../d/"+n, "/l/"+n); err != nil {
			t.Fatalf("symlink %q: %v", n, err)
		}
	}
	list := func(p string) []string {
		t.Helper()
		ents, err := cl.ReadDir(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range ents {
			got = append(got, string(e.Name))
		}
		return got
	}
	if got := list("/d"); !slices.Equal(got, names) {
		t.Fatalf("readdir: %q\nwant %q", got, names)
	}
	dir, err := cl.Stat(ctx, "/d")
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		var got bytes.Buffer
		if _, err := cl.Get(ctx, "/l/"+n, &got); err != nil || got.String() != n {
			t.Fatalf("get through symlink %q: %q, %v", n, got.String(), err)
		}
		l, err := cl.Lstat(ctx, "/l/"+n)
		if err != nil || string(l.Target) != "../d/"+n {
			t.Fatalf("symlink %q: target %q, %v", n, l.Target, err)
		}
		a, err := cl.Lookup(ctx, dir.Ino, n)
		if err != nil {
			t.Fatalf("lookup %q: %v", n, err)
		}
		x := "user." + n[:min(len(n), 200)]
		if err := cl.SetXattr(ctx, a.Ino, x, []byte(n), 0); err != nil {
			t.Fatalf("setxattr %q: %v", x, err)
		}
		if xs, err := cl.ListXattr(ctx, a.Ino); err != nil || !slices.Equal(xs, []string{x}) {
			t.Fatalf("listxattr of %q: %q, %v", n, xs, err)
		}
		if v, err := cl.GetXattr(ctx, a.Ino, x); err != nil || string(v) != n {
			t.Fatalf("getxattr %q: %q, %v", x, v, err)
		}
		// One page after each name holds the next.
		page, _, err := cl.ReadDirPage(ctx, dir.Ino, n)
		if err != nil || (i+1 < len(names)) != (len(page) > 0) || len(page) > 0 && string(page[0].Name) != names[i+1] {
			t.Fatalf("readdir after %q: %d entries, %v", n, len(page), err)
		}
	}
	renamed := func(n string) string { return "\xff" + n[:min(len(n), 254)] } // none of names is \xff and more
	for _, n := range names {
		if err := cl.Rename(ctx, "/d/"+n, "/d/"+renamed(n)); err != nil {
			t.Fatalf("rename %q: %v", n, err)
		}
	}
	for _, n := range names {
		var got bytes.Buffer
		if _, err := cl.Get(ctx, "/d/"+renamed(n), &got); err != nil || got.String() != n {
			t.Fatalf("get %q after rename: %q, %v", renamed(n), got.String(), err)
		}
		if err := cl.Remove(ctx, "/d/"+renamed(n)); err != nil {
			t.Fatalf("remove %q: %v", renamed(n), err)
		}
	}
	if got := list("/d"); len(got) != 0 {
		t.Fatalf("left after removing every name: %q", got)
	}
}

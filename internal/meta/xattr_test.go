package meta

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestXattrs(t *testing.T) {
	f := newFixture(t)
	f.mk("/", "pub", metaapi.TypeDir, 0o777, root)
	file := f.mk("/pub", "f", metaapi.TypeFile, 0o644, alice)
	set := func(name, val string, flags uint32, who metaapi.Who) error {
		return f.s.SetXattr(metaapi.SetXattrReq{Ino: file.Ino, Name: metaapi.ByteString(name), Value: []byte(val), Flags: flags, Who: who})
	}
	get := func(name string, who metaapi.Who) (string, error) {
		r, err := f.s.GetXattr(metaapi.XattrReq{Ino: file.Ino, Name: metaapi.ByteString(name), Who: who})
		return string(r.Value), err
	}
	list := func(who metaapi.Who) []string {
		t.Helper()
		r, err := f.s.ListXattr(metaapi.ListXattrReq{Ino: file.Ino, Who: who})
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, n := range r.Names {
			names = append(names, string(n))
		}
		return names
	}

	f.clk.Advance(time.Second)
	if err := set("user.a", "1", 0, alice); err != nil {
		t.Fatal(err)
	}
	if a := f.attr("/pub/f"); a.Ctime != f.clk.Now().UnixNano() {
		t.Fatal("setting an attribute did not change ctime")
	}
	if v, err := get("user.a", bob); err != nil || v != "1" {
		t.Fatalf("get by a reader: %q, %v", v, err)
	}
	wantCode(t, set("user.a", "2", metaapi.XattrCreate, alice), metaapi.EEXIST)
	wantCode(t, set("user.b", "2", metaapi.XattrReplace, alice), metaapi.ENODATA)
	// Both flags: nothing qualifies, as on Linux.
	wantCode(t, set("user.b", "2", metaapi.XattrCreate|metaapi.XattrReplace, alice), metaapi.ENODATA)
	wantCode(t, set("user.a", "2", metaapi.XattrCreate|metaapi.XattrReplace, alice), metaapi.EEXIST)
	wantCode(t, set("user.b", "2", 4, alice), metaapi.EINVAL)
	if err := set("user.a", "2", metaapi.XattrReplace, alice); err != nil {
		t.Fatal(err)
	}
	if err := set("user.empty", "", 0, alice); err != nil {
		t.Fatal(err)
	}
	if v, err := get("user.empty", alice); err != nil || v != "" {
		t.Fatalf("empty value: %q, %v", v, err)
	}
	// Permissions: write permission for user attributes, root for the
	// others; trusted ones are invisible to others.
	wantCode(t, set("user.x", "1", 0, bob), metaapi.EACCES)
	wantCode(t, set("trusted.t", "1", 0, alice), metaapi.EPERM)
	wantCode(t, set("security.s", "1", 0, alice), metaapi.EPERM)
	if err := set("trusted.t", "secret", 0, root); err != nil {
		t.Fatal(err)
	}
	if err := set("security.s", "label", 0, root); err != nil {
		t.Fatal(err)
	}
	_, err := get("trusted.t", alice)
	wantCode(t, err, metaapi.ENODATA)
	if v, err := get("security.s", bob); err != nil || v != "label" {
		t.Fatalf("security attribute read by another user: %q, %v", v, err)
	}
	if got, want := list(alice), []string{"security.s", "user.a", "user.empty"}; !slices.Equal(got, want) {
		t.Fatalf("list as alice: %v, want %v", got, want)
	}
	if got := list(root); len(got) != 4 || got[1] != "trusted.t" {
		t.Fatalf("list as root: %v", got)
	}
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: file.Ino, Mode: ptr(uint32(0o600)), Who: alice}); err != nil {
		t.Fatal(err)
	}
	_, err = get("user.a", bob)
	wantCode(t, err, metaapi.EACCES)
	// Listing needs no read permission; getting does.
	if got := list(bob); !slices.Contains(got, "user.a") || slices.Contains(got, "trusted.t") {
		t.Fatalf("list by a user without read permission: %v", got)
	}
	// Names and sizes.
	for _, tc := range []struct {
		name string
		code metaapi.Code
	}{
		{"", metaapi.ERANGE},
		{"user." + strings.Repeat("n", metaapi.MaxXattrName), metaapi.ERANGE},
		{"user.", metaapi.EINVAL},
		{"user.a\x00b", metaapi.EINVAL},
		{"system.posix_acl_access", metaapi.ENOTSUP},
		{metaapi.XattrCaps, metaapi.ENOTSUP},
		{"os2.x", metaapi.ENOTSUP},
	} {
		wantCode(t, set(tc.name, "v", 0, root), tc.code)
		_, err := get(tc.name, root)
		wantCode(t, err, tc.code)
	}
	wantCode(t, set("user.big", strings.Repeat("v", metaapi.MaxXattrValue+1), 0, alice), metaapi.E2BIG)
	if err := set("user.big", strings.Repeat("v", metaapi.MaxXattrValue), 0, alice); err != nil {
		t.Fatal(err)
	}
	full := 0
	for i := 0; ; i++ {
		err := set("user.fill"+string(rune('a'+i%26))+strings.Repeat("x", i/26), strings.Repeat("v", metaapi.MaxXattrValue), 0, alice)
		if err != nil {
			wantCode(t, err, metaapi.ENOSPC)
			break
		}
		full++
		if full > 10 {
			t.Fatal("no per-inode bound on attributes")
		}
	}
	// Remove; then the inode's removal takes the rest with it.
	if err := f.s.RemoveXattr(metaapi.XattrReq{Ino: file.Ino, Name: "user.a", Who: alice}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.s.RemoveXattr(metaapi.XattrReq{Ino: file.Ino, Name: "user.a", Who: alice}), metaapi.ENODATA)
	wantCode(t, f.s.RemoveXattr(metaapi.XattrReq{Ino: file.Ino, Name: "trusted.t", Who: alice}), metaapi.EPERM)
	if err := f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/pub"), Name: "f", Who: alice}); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := scan(f.s.db, []byte{pXattr}, []byte{pXattr + 1}, func(k, v []byte) (bool, error) { n++; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d attributes left after the file was removed", n)
	}
	if err := f.s.Check(); err != nil {
		t.Fatal(err)
	}
}

// The names of one inode's attributes fit what listxattr(2) can return.
func TestXattrNamesBounded(t *testing.T) {
	f := newFixture(t)
	file := f.mk("/", "f", metaapi.TypeFile, 0o644, root)
	n := 0
	for ; ; n++ {
		name := fmt.Sprintf("user.%03d%s", n, strings.Repeat("n", 240))
		err := f.s.SetXattr(metaapi.SetXattrReq{Ino: file.Ino, Name: metaapi.ByteString(name), Who: root})
		if err != nil {
			wantCode(t, err, metaapi.ENOSPC)
			break
		}
	}
	r, err := f.s.ListXattr(metaapi.ListXattrReq{Ino: file.Ino, Who: root})
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	for _, name := range r.Names {
		size += len(name) + 1
	}
	if len(r.Names) != n || size > metaapi.MaxXattrList || size < metaapi.MaxXattrList-260 {
		t.Fatalf("%d names of %d bytes after %d sets", len(r.Names), size, n)
	}
}

func TestXattrsOnOtherTypes(t *testing.T) {
	f := newFixture(t)
	f.mk("/", "pub", metaapi.TypeDir, 0o777, root)
	dir := f.mk("/pub", "d", metaapi.TypeDir, 0o1777, alice)
	link, err := f.s.Create(metaapi.CreateReq{Parent: f.ino("/pub"), Name: "l", Type: metaapi.TypeSymlink, Target: "d", Who: alice})
	if err != nil {
		t.Fatal(err)
	}
	// A directory takes user attributes; in a sticky one, only its owner.
	if err := f.s.SetXattr(metaapi.SetXattrReq{Ino: dir.Ino, Name: "user.d", Value: []byte("x"), Who: alice}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.s.SetXattr(metaapi.SetXattrReq{Ino: dir.Ino, Name: "user.d", Value: []byte("y"), Who: bob}), metaapi.EPERM)
	// A symlink takes none: EPERM to set, ENODATA to get.
	wantCode(t, f.s.SetXattr(metaapi.SetXattrReq{Ino: link.Ino, Name: "user.l", Value: []byte("x"), Who: alice}), metaapi.EPERM)
	_, err = f.s.GetXattr(metaapi.XattrReq{Ino: link.Ino, Name: "user.l", Who: alice})
	wantCode(t, err, metaapi.ENODATA)
	if err := f.s.SetXattr(metaapi.SetXattrReq{Ino: link.Ino, Name: "trusted.l", Value: []byte("x"), Who: root}); err != nil {
		t.Fatal(err)
	}
	r, err := f.s.GetXattr(metaapi.XattrReq{Ino: link.Ino, Name: "trusted.l", Who: root})
	if err != nil || !bytes.Equal(r.Value, []byte("x")) {
		t.Fatalf("trusted attribute of a symlink: %q, %v", r.Value, err)
	}
	_, err = f.s.GetXattr(metaapi.XattrReq{Ino: 999999, Name: "user.x", Who: root})
	wantCode(t, err, metaapi.ENOENT)
}

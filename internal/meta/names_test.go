package meta

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// byteNames are names that are valid to Linux but not UTF-8 (or are, but
// look alike once bytes are replaced): every byte value but NUL and '/'
// alone and between others, truncated, overlong and surrogate sequences,
// and the longest name allowed.
func byteNames() []string {
	var names []string
	for b := 1; b < 256; b++ {
		if b == '/' {
			continue
		}
		if b != '.' {
			names = append(names, string([]byte{byte(b)}))
		}
		names = append(names, "caf"+string([]byte{byte(b)})+".txt")
	}
	return append(names,
		"\ufffd", "caf\ufffd.txt", "\xe9\xe8", "\xe8\xe9", "..\xff", ".\xfe",
		"\xc0\xaf", "\xe0\x80\xaf", "\xf0\x80\x80\xaf", // overlong '/'
		"\xed\xa0\x80", "\xed\xb3\xa9", "\xed\xa0\xbd\xed\xb8\x80", // surrogates as bytes
		"\xf4\x90\x80\x80", "\xe2\x82", "a\x80\x80b", `\udce9`, "{\"base64\":\"6Q==\"}",
		strings.Repeat("\xff", metaapi.MaxNameLen),
	)
}

// httpFixture serves the fixture's service over HTTP, as meta does, and
// calls it with metaapi.Client: names cross JSON both ways. The server
// follows the fixture across reopen.
func httpFixture(t *testing.T) (*fixture, func(op string, req, resp any) error) {
	f := newFixture(t)
	srv := tlsServer(t, f, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.s.Handler().ServeHTTP(w, r) }))
	c := client(t, srv, metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)))
	return f, func(op string, req, resp any) error { return c.Call(context.Background(), op, req, resp) }
}

// TestNamesAreBytes: every name Linux allows round-trips byte for byte
// through meta's API and its records — create, lookup, resolve, readdir
// (paged, the cursor a name too), rename, link, symlink targets and
// extended attribute names — and two names that differ only in bytes
// that are not UTF-8 are two files.
func TestNamesAreBytes(t *testing.T) {
	f, call := httpFixture(t)
	mkdir := func(name string) ids.Ino {
		var r metaapi.AttrResp
		if err := call(metaapi.OpCreate, metaapi.CreateReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Type: metaapi.TypeDir, Mode: 0o755, Who: root}, &r); err != nil {
			t.Fatal(err)
		}
		return r.Attr.Ino
	}
	dir, moved, links, syms := mkdir("d"), mkdir("moved\xe9"), mkdir("links\xe8"), mkdir("syms\xff")
	names := byteNames()
	inos := map[string]ids.Ino{}
	seen := map[ids.Ino]string{}
	for _, name := range names {
		var r metaapi.AttrResp
		if err := call(metaapi.OpCreate, metaapi.CreateReq{Parent: dir, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Mode: 0o644, Exclusive: true, Who: root}, &r); err != nil {
			t.Fatalf("create %q: %v", name, err)
		}
		if other, dup := seen[r.Attr.Ino]; dup {
			t.Fatalf("%q and %q are one file", other, name)
		}
		inos[name], seen[r.Attr.Ino] = r.Attr.Ino, name
		if err := call(metaapi.OpSetXattr, metaapi.SetXattrReq{Ino: r.Attr.Ino, Name: metaapi.ByteString("user." + name[:min(len(name), 200)]), Value: []byte(name), Who: root}, nil); err != nil {
			t.Fatalf("setxattr on %q: %v", name, err)
		}
	}
	check := func(stage string, dir ids.Ino, path string, want []string) {
		t.Helper()
		if got := readdirAll(t, call, dir); !slices.Equal(got, want) {
			t.Fatalf("%s: readdir differs from the names created:\n got %q\nwant %q", stage, got, want)
		}
		for _, name := range want {
			var r metaapi.AttrResp
			if err := call(metaapi.OpLookup, metaapi.LookupReq{Parent: dir, Name: metaapi.ByteString(name), Who: root}, &r); err != nil || r.Attr.Ino != inos[name] {
				t.Fatalf("%s: lookup %q = %d, %v; want %d", stage, name, r.Attr.Ino, err, inos[name])
			}
			if err := call(metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(path + "/" + name)}, &r); err != nil || r.Attr.Ino != inos[name] {
				t.Fatalf("%s: resolve %q = %d, %v; want %d", stage, path+"/"+name, r.Attr.Ino, err, inos[name])
			}
		}
	}
	sorted := slices.Sorted(slices.Values(names))
	check("created", dir, "/d", sorted)

	// Extended attribute names.
	for _, name := range names {
		xname := "user." + name[:min(len(name), 200)]
		var l metaapi.ListXattrResp
		if err := call(metaapi.OpListXattr, metaapi.ListXattrReq{Ino: inos[name], Who: root}, &l); err != nil || len(l.Names) != 1 || string(l.Names[0]) != xname {
			t.Fatalf("listxattr of %q = %q, %v; want [%q]", name, l.Names, err, xname)
		}
		var v metaapi.XattrResp
		if err := call(metaapi.OpGetXattr, metaapi.XattrReq{Ino: inos[name], Name: metaapi.ByteString(xname), Who: root}, &v); err != nil || string(v.Value) != name {
			t.Fatalf("getxattr %q of %q = %q, %v", xname, name, v.Value, err)
		}
	}

	// Symlinks named by each name, pointing through the others.
	for _, name := range names {
		target := "../moved\xe9/" + name
		var r metaapi.AttrResp
		if err := call(metaapi.OpCreate, metaapi.CreateReq{Parent: syms, Name: metaapi.ByteString(name), Type: metaapi.TypeSymlink, Target: metaapi.ByteString(target), Who: root}, &r); err != nil {
			t.Fatalf("symlink %q: %v", name, err)
		}
		if string(r.Attr.Target) != target || r.Attr.Size != int64(len(target)) {
			t.Fatalf("symlink %q: target %q size %d, want %q", name, r.Attr.Target, r.Attr.Size, target)
		}
	}

	// Rename every file into another directory, then link it back.
	for _, name := range names {
		if err := call(metaapi.OpRename, metaapi.RenameReq{OldParent: dir, OldName: metaapi.ByteString(name), NewParent: moved, NewName: metaapi.ByteString(name), Who: root}, nil); err != nil {
			t.Fatalf("rename %q: %v", name, err)
		}
		if err := call(metaapi.OpLink, metaapi.LinkReq{Ino: inos[name], NewParent: links, NewName: metaapi.ByteString(name), Who: root}, nil); err != nil {
			t.Fatalf("link %q: %v", name, err)
		}
	}
	check("renamed", moved, "/moved\xe9", sorted)
	check("linked", links, "/links\xe8", sorted)
	check("renamed away", dir, "/d", nil)

	// Symlink targets come back from meta's records, also after a restart,
	// and resolution follows them to the right file.
	for _, stage := range []string{"before restart", "after restart"} {
		if stage == "after restart" {
			f.reopen()
		}
		for _, name := range names {
			var r metaapi.AttrResp
			if err := call(metaapi.OpLookup, metaapi.LookupReq{Parent: syms, Name: metaapi.ByteString(name), Who: root}, &r); err != nil {
				t.Fatalf("%s: lookup symlink %q: %v", stage, name, err)
			}
			if want := "../moved\xe9/" + name; string(r.Attr.Target) != want {
				t.Fatalf("%s: symlink %q reads %q, want %q", stage, name, r.Attr.Target, want)
			}
			if err := call(metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString("/syms\xff/" + name), Follow: true}, &r); err != nil || r.Attr.Ino != inos[name] {
				t.Fatalf("%s: resolving through symlink %q = %d, %v; want %d", stage, name, r.Attr.Ino, err, inos[name])
			}
		}
		check(stage, moved, "/moved\xe9", sorted)
	}

	// Remove by each name: exactly that file goes.
	for i, name := range sorted {
		if err := call(metaapi.OpRemove, metaapi.RemoveReq{Parent: links, Name: metaapi.ByteString(name), Who: root}, nil); err != nil {
			t.Fatalf("remove %q: %v", name, err)
		}
		if i%50 == 0 {
			check("removing", links, "/links\xe8", sorted[i+1:])
		}
	}
	check("removed", links, "/links\xe8", nil)
}

// readdirAll lists a directory a few entries a page, so that cursors
// are names too.
func readdirAll(t *testing.T, call func(op string, req, resp any) error, dir ids.Ino) []string {
	t.Helper()
	var names []string
	var after metaapi.ByteString
	for {
		var r metaapi.ReaddirResp
		if err := call(metaapi.OpReaddir, metaapi.ReaddirReq{Ino: dir, After: after, Limit: 7, Who: root}, &r); err != nil {
			t.Fatalf("readdir %d after %q: %v", dir, after, err)
		}
		for _, e := range r.Entries {
			names = append(names, string(e.Name))
		}
		if !r.More || len(r.Entries) == 0 {
			return names
		}
		after = r.Entries[len(r.Entries)-1].Name
	}
}

// TestNamesDifferingInInvalidBytes is the case: caf\xe9.txt and
// caf\xe8.txt are two files, and opening one with O_CREAT (what
// open(O_TRUNC) sends) finds that one, never the other.
func TestNamesDifferingInInvalidBytes(t *testing.T) {
	_, call := httpFixture(t)
	create := func(name string, exclusive bool) (metaapi.Attr, error) {
		var r metaapi.AttrResp
		err := call(metaapi.OpCreate, metaapi.CreateReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Mode: 0o644, Exclusive: exclusive, Who: root}, &r)
		return r.Attr, err
	}
	e9, err := create("caf\xe9.txt", true)
	if err != nil {
		t.Fatal(err)
	}
	e8, err := create("caf\xe8.txt", true)
	if err != nil {
		t.Fatalf("creating caf\\xe8.txt beside caf\\xe9.txt: %v", err)
	}
	again, err := create("caf\xe8.txt", false)
	if err != nil || again.Ino != e8.Ino || e8.Ino == e9.Ino {
		t.Fatalf("reopening caf\\xe8.txt found inode %d (%v); caf\\xe8.txt is %d, caf\\xe9.txt %d", again.Ino, err, e8.Ino, e9.Ino)
	}
	if _, err := create("caf\ufffd.txt", true); err != nil {
		t.Fatalf("caf\\ufffd.txt is a third name: %v", err)
	}
}

// TestValidName: a name is any bytes but NUL and '/', not "." or "..",
// 1 to 255 of them.
func TestValidName(t *testing.T) {
	for b := 1; b < 256; b++ {
		name := string([]byte{byte(b)})
		err := validName(name)
		switch b {
		case '/':
			if !metaapi.IsCode(err, metaapi.EINVAL) {
				t.Errorf("validName(%q) = %v, want EINVAL", name, err)
			}
		case '.':
			if !metaapi.IsCode(err, metaapi.EINVAL) {
				t.Errorf("validName(%q) = %v, want EINVAL", name, err)
			}
		default:
			if err != nil {
				t.Errorf("validName(%q) = %v", name, err)
			}
		}
		if err := validName("a" + name + "\xff"); (err == nil) == (b == '/') {
			t.Errorf("validName(%q) = %v", "a"+name+"\xff", err)
		}
	}
	for name, want := range map[string]metaapi.Code{
		"": metaapi.EINVAL, ".": metaapi.EINVAL, "..": metaapi.EINVAL, "\x00": metaapi.EINVAL, "a\x00b": metaapi.EINVAL,
		"a/b": metaapi.EINVAL, "/": metaapi.EINVAL, strings.Repeat("\xe9", 256): metaapi.ENAMETOOLONG,
		"...": "", ".\xff": "", "\xff.": "", strings.Repeat("\xe9", 255): "",
	} {
		if err := validName(name); want == "" && err != nil || want != "" && !metaapi.IsCode(err, want) {
			t.Errorf("validName(%q) = %v, want %q", name, err, want)
		}
	}
}

// TestRecordsKeepTheirFormat: a symlink whose target is UTF-8 is stored
// as before (a plain JSON string, so records from earlier versions read
// the same), one whose target is not keeps its bytes in base64.
func TestRecordsKeepTheirFormat(t *testing.T) {
	f := newFixture(t)
	utf := f.mk("/", "l->../café", metaapi.TypeSymlink, 0o777, root)
	raw := f.mk("/", "m->../caf\xe9", metaapi.TypeSymlink, 0o777, root)
	record := func(ino ids.Ino) map[string]any {
		b, found, err := getRaw(f.s.db, inodeKey(ino))
		if err != nil || !found {
			t.Fatalf("inode %d: %v", ino, err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if got := record(utf.Ino)["target"]; got != "../café" {
		t.Errorf("UTF-8 target stored as %#v, want the plain string", got)
	}
	if got, ok := record(raw.Ino)["target"].(map[string]any); !ok || got["base64"] != "Li4vY2Fm6Q==" {
		t.Errorf("target ../caf\\xe9 stored as %#v", record(raw.Ino)["target"])
	}
	// An old record, as a version with plain strings wrote it, loads.
	old := bytes.Replace(mustJSON(record(utf.Ino)), []byte(`"../café"`), []byte(`"../old\u00e9"`), 1)
	if err := f.s.db.Set(inodeKey(utf.Ino), old, nil); err != nil {
		t.Fatal(err)
	}
	if a, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: utf.Ino}); err != nil || a.Target != "../oldé" {
		t.Fatalf("old record read as %+v, %v", a, err)
	}
}

// TestInexactNamesRefused: a request whose JSON cannot stand for the
// bytes of a name (raw bytes that are not UTF-8, an unpaired surrogate
// escape such as Python's surrogateescape writes) is refused with
// EINVAL; nothing is created under a name with U+FFFD in it.
func TestInexactNamesRefused(t *testing.T) {
	f, srv := newHTTP(t)
	auth := metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1))
	for _, body := range []string{
		`{"parent":1,"name":"caf\udce9.txt","type":"file","mode":420}`,
		"{\"parent\":1,\"name\":\"caf\xe9.txt\",\"type\":\"file\",\"mode\":420}",
		`{"parent":1,"name":"l","type":"symlink","target":"../caf\udce9"}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/"+metaapi.OpCreate, strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		resp, err := httpsClient(srv).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var me metaapi.Error
		json.NewDecoder(resp.Body).Decode(&me)
		resp.Body.Close()
		if me.Code != metaapi.EINVAL || !strings.Contains(me.Message, "base64") {
			t.Errorf("%q: HTTP %d %+v, want EINVAL pointing to base64", body, resp.StatusCode, me)
		}
	}
	r, err := f.s.Readdir(metaapi.ReaddirReq{Ino: ids.RootIno, Who: root})
	if err != nil || len(r.Entries) != 0 {
		t.Fatalf("root holds %+v, %v; want nothing", r.Entries, err)
	}
}

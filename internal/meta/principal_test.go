package meta

import (
	"context"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestMapWho(t *testing.T) {
	r := func(lo, hi uint32) metaapi.IDRanges { return metaapi.IDRanges{{Lo: lo, Hi: hi}} }
	anon := metaapi.Who{UID: metaapi.AnonUID, GID: metaapi.AnonGID}
	for _, tc := range []struct {
		name   string
		rights metaapi.Rights
		in     metaapi.Who
		want   metaapi.Who
		code   metaapi.Code
	}{
		{"unrestricted root", metaapi.Rights{}, metaapi.Who{UID: 0, GID: 0, GIDs: []uint32{0, 5}}, metaapi.Who{UID: 0, GID: 0, GIDs: []uint32{0, 5}}, ""},
		{"root squashed", metaapi.Rights{Squash: metaapi.SquashRoot}, metaapi.Who{UID: 0, GID: 0, GIDs: []uint32{0, 5}}, anon, ""},
		{"root squash drops gid 0", metaapi.Rights{Squash: metaapi.SquashRoot}, metaapi.Who{UID: 7, GID: 0, GIDs: []uint32{0, 5}}, metaapi.Who{UID: 7, GID: metaapi.AnonGID, GIDs: []uint32{5}}, ""},
		{"all squashed", metaapi.Rights{Squash: metaapi.SquashAll}, metaapi.Who{UID: 1000, GID: 1000}, anon, ""},
		{"uid in range", metaapi.Rights{UIDs: r(1000, 1999)}, metaapi.Who{UID: 1500, GID: 1500}, metaapi.Who{UID: 1500, GID: 1500}, ""},
		{"uid 0 outside range refused", metaapi.Rights{UIDs: r(1000, 1999)}, metaapi.Who{UID: 0, GID: 1000}, metaapi.Who{}, metaapi.EPERM},
		{"uid 0 outside range squashed", metaapi.Rights{UIDs: r(1000, 1999), Squash: metaapi.SquashRoot}, metaapi.Who{UID: 0, GID: 0}, anon, ""},
		{"other uid outside range refused", metaapi.Rights{UIDs: r(1000, 1999)}, metaapi.Who{UID: 2000, GID: 1000}, metaapi.Who{}, metaapi.EPERM},
		{"gid outside uid ranges refused", metaapi.Rights{UIDs: r(1000, 1999)}, metaapi.Who{UID: 1000, GID: 0}, metaapi.Who{}, metaapi.EPERM},
		{"groups outside dropped", metaapi.Rights{UIDs: r(1000, 1999)}, metaapi.Who{UID: 1000, GID: 1000, GIDs: []uint32{0, 1001, 42}}, metaapi.Who{UID: 1000, GID: 1000, GIDs: []uint32{1001}}, ""},
		{"explicit gids", metaapi.Rights{UIDs: r(1000, 1000), GIDs: r(100, 100)}, metaapi.Who{UID: 1000, GID: 100}, metaapi.Who{UID: 1000, GID: 100}, ""},
		{"too many groups", metaapi.Rights{}, metaapi.Who{UID: 1, GID: 1, GIDs: make([]uint32, maxGroups+1)}, metaapi.Who{}, metaapi.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := newPrincipal(principalRec{Principal: metaapi.Principal{Name: "p", Rights: tc.rights}, Hash: hashCredential("x")})
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.mapWho(tc.in)
			wantCode(t, err, tc.code)
			if tc.code != "" {
				return
			}
			if got.UID != tc.want.UID || got.GID != tc.want.GID || len(got.GIDs) != len(tc.want.GIDs) {
				t.Fatalf("mapWho(%+v) = %+v, want %+v", tc.in, got, tc.want)
			}
			for i := range got.GIDs {
				if got.GIDs[i] != tc.want.GIDs[i] {
					t.Fatalf("mapWho(%+v) = %+v, want %+v", tc.in, got, tc.want)
				}
			}
		})
	}
}

// TestPrincipalsOverHTTP is the attacker's view: each principal tries
// what its rights forbid, through the real HTTP layer.
func TestPrincipalsOverHTTP(t *testing.T) {
	f, srv := newHTTP(t)
	f.addNodes(3)
	ctx := context.Background()
	f.tree("/proj/", "/other/", "/other/secret", "/proj/in")
	f.mk("/", "rootonly", metaapi.TypeFile, 0o600, root)
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/proj"), Mode: ptr[uint32](0o777), Who: root}); err != nil {
		t.Fatal(err)
	}
	// A file in /proj that also has a name outside, and one only outside.
	if _, err := f.s.Link(metaapi.LinkReq{Ino: f.ino("/proj/in"), NewParent: f.ino("/other"), NewName: "in2", Who: root}); err != nil {
		t.Fatal(err)
	}
	creds := map[string]metaapi.AuthCredResp{}
	add := func(name string, r metaapi.Rights) *metaapi.Client {
		t.Helper()
		resp, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: name, Rights: r})
		if err != nil {
			t.Fatalf("adding %s: %v", name, err)
		}
		creds[name] = resp
		return client(t, srv, metaapi.ClientAuth(uint64(resp.Principal.ID), resp.Credential))
	}
	alice := add("alice", metaapi.Rights{Path: "/proj", UIDs: metaapi.IDRanges{{Lo: 1000, Hi: 1999}}, Squash: metaapi.SquashRoot})
	reader := add("reader", metaapi.Rights{ReadOnly: true})
	eve := add("eve", metaapi.Rights{UIDs: metaapi.IDRanges{{Lo: 1000, Hi: 1000}}})
	u1000 := metaapi.Who{UID: 1000, GID: 1000}
	// One principal's credential under another's id, or the admin's id.
	for _, id := range []ids.ClientID{creds["reader"].Principal.ID, AdminID, SystemID} {
		forged := client(t, srv, metaapi.ClientAuth(uint64(id), creds["alice"].Credential))
		wantCode(t, forged.Call(ctx, metaapi.OpStatus, struct{}{}, nil), metaapi.EAUTH)
	}

	var a metaapi.AttrResp
	// alice sees /proj as "/", and ".." does not leave it.
	wantCode(t, alice.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: "/"}, &a), "")
	if a.Attr.Ino != f.ino("/proj") {
		t.Fatalf("alice's / is %d, want /proj %d", a.Attr.Ino, f.ino("/proj"))
	}
	wantCode(t, alice.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: "/../../other/secret"}, &a), metaapi.ENOENT)
	wantCode(t, alice.Call(ctx, metaapi.OpLookup, metaapi.LookupReq{Parent: f.ino("/proj"), Name: "..", Who: u1000}, &a), "")
	if a.Attr.Ino != f.ino("/proj") {
		t.Fatalf("alice's / .. is %d", a.Attr.Ino)
	}
	// Nothing outside by inode number.
	outside := []struct {
		op  string
		req any
	}{
		{metaapi.OpGetAttr, metaapi.GetAttrReq{Ino: f.ino("/other/secret")}},
		{metaapi.OpGetAttr, metaapi.GetAttrReq{Ino: ids.RootIno}},
		{metaapi.OpLayout, metaapi.LayoutReq{Ino: f.ino("/rootonly"), Len: 1, Who: u1000}},
		{metaapi.OpCreate, metaapi.CreateReq{Parent: ids.RootIno, Name: "x", Type: metaapi.TypeFile, Mode: 0o644, Who: u1000}},
		{metaapi.OpCreate, metaapi.CreateReq{Parent: f.ino("/other"), Name: "x", Type: metaapi.TypeFile, Mode: 0o644, Who: u1000}},
		{metaapi.OpLink, metaapi.LinkReq{Ino: f.ino("/other/secret"), NewParent: f.ino("/proj"), NewName: "stolen", Who: u1000}},
		{metaapi.OpRename, metaapi.RenameReq{OldParent: f.ino("/other"), OldName: "secret", NewParent: f.ino("/proj"), NewName: "stolen", Who: u1000}},
		{metaapi.OpReaddir, metaapi.ReaddirReq{Ino: ids.RootIno, Who: u1000}},
		{metaapi.OpSetAttr, metaapi.SetAttrReq{Ino: f.ino("/other/secret"), Mode: ptr[uint32](0o777), Who: u1000}},
		{metaapi.OpGetXattr, metaapi.XattrReq{Ino: f.ino("/other"), Name: "user.x", Who: u1000}},
	}
	for _, o := range outside {
		if err := alice.Call(ctx, o.op, o.req, nil); !metaapi.IsCode(err, metaapi.EACCES) {
			t.Errorf("alice %s %+v outside /proj: %v, want EACCES", o.op, o.req, err)
		}
	}
	if f.exists("/proj/stolen") || !f.exists("/other/secret") {
		t.Fatal("a refused call changed the namespace")
	}
	// A file with one name inside is reachable, whatever its other names.
	wantCode(t, alice.Call(ctx, metaapi.OpGetAttr, metaapi.GetAttrReq{Ino: f.ino("/proj/in")}, nil), "")
	// Inside: as uid 1000 it creates; as root it acts as nobody; as uid 0
	// without squash (eve) or another uid it is refused.
	wantCode(t, alice.Call(ctx, metaapi.OpCreate, metaapi.CreateReq{Parent: f.ino("/proj"), Name: "mine", Type: metaapi.TypeFile, Mode: 0o600, Who: u1000}, &a), "")
	if a.Attr.UID != 1000 {
		t.Fatalf("alice's file owned by %d", a.Attr.UID)
	}
	wantCode(t, alice.Call(ctx, metaapi.OpCreate, metaapi.CreateReq{Parent: f.ino("/proj"), Name: "asroot", Type: metaapi.TypeFile, Mode: 0o600, Who: root}, &a), "")
	if a.Attr.UID != metaapi.AnonUID {
		t.Fatalf("alice as root created a file owned by %d, want nobody", a.Attr.UID)
	}
	wantCode(t, alice.Call(ctx, metaapi.OpCreate, metaapi.CreateReq{Parent: f.ino("/proj"), Name: "u5", Type: metaapi.TypeFile, Mode: 0o600, Who: metaapi.Who{UID: 5000, GID: 1000}}, nil), metaapi.EPERM)
	wantCode(t, eve.Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: f.ino("/rootonly"), Len: 1, Who: root}, nil), metaapi.EPERM)
	wantCode(t, eve.Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: f.ino("/rootonly"), Len: 1, Who: metaapi.Who{UID: 1000, GID: 1000}}, nil), metaapi.EACCES)
	// Administration needs the admin right.
	for _, c := range []*metaapi.Client{alice, reader, eve} {
		wantCode(t, c.Call(ctx, metaapi.OpDrain, metaapi.DrainReq{Node: 1}, nil), metaapi.EPERM)
		wantCode(t, c.Call(ctx, metaapi.OpAuthAdd, metaapi.AuthAddReq{Name: "mallory", Rights: metaapi.Rights{Admin: true}}, nil), metaapi.EPERM)
		wantCode(t, c.Call(ctx, metaapi.OpAuthList, struct{}{}, nil), metaapi.EPERM)
	}
	// A read-only principal reads and changes nothing.
	wantCode(t, reader.Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: f.ino("/proj/in"), Len: 1, Who: root}, nil), "")
	wantCode(t, reader.Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: f.ino("/proj/in"), Len: 1, Write: true, Who: root}, nil), metaapi.EROFS)
	wantCode(t, reader.Call(ctx, metaapi.OpCreate, metaapi.CreateReq{Parent: ids.RootIno, Name: "ro", Type: metaapi.TypeFile, Mode: 0o644, Who: root}, nil), metaapi.EROFS)
	wantCode(t, reader.Call(ctx, metaapi.OpRemove, metaapi.RemoveReq{Parent: ids.RootIno, Name: "rootonly", Who: root}, nil), metaapi.EROFS)

	// Rotation and removal take effect at once.
	rot, err := f.s.RotatePrincipal("eve")
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, eve.Call(ctx, metaapi.OpStatus, struct{}{}, nil), metaapi.EAUTH)
	wantCode(t, client(t, srv, metaapi.ClientAuth(uint64(rot.Principal.ID), rot.Credential)).Call(ctx, metaapi.OpStatus, struct{}{}, nil), "")
	if err := f.s.RemovePrincipal("alice"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, alice.Call(ctx, metaapi.OpStatus, struct{}{}, nil), metaapi.EAUTH)
	wantCode(t, f.s.RemovePrincipal(AdminName), metaapi.EPERM) // the last admin
}

func TestPrincipalsPersist(t *testing.T) {
	f := newFixture(t)
	f.tree("/proj/")
	added, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "alice", Rights: metaapi.Rights{Path: "/proj", ReadOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, func() error { _, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "alice"}); return err }(), metaapi.EEXIST)
	wantCode(t, func() error { _, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "a/b"}); return err }(), metaapi.EINVAL)
	wantCode(t, func() error {
		_, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "b", Rights: metaapi.Rights{Path: "/nope"}})
		return err
	}(), metaapi.ENOENT)
	f.reopen()
	got, ok := f.s.principalSet().byName["alice"]
	if !ok || !got.matches(added.Credential) || got.rec.Root != f.ino("/proj") || !got.rec.Rights.ReadOnly {
		t.Fatalf("after restart: %+v", got)
	}
	next, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "bob"})
	if err != nil || next.Principal.ID != added.Principal.ID+1 {
		t.Fatalf("id after restart: %+v %v", next, err)
	}
	if !f.s.AdminCredentialDerived() {
		t.Fatal("the operator's credential should still be the derived one")
	}
}

// TestLinkIndexBuiltOnUpgrade opens a database from before the link
// index (schema 2): the index is built, and scope checks work on it.
func TestLinkIndexBuiltOnUpgrade(t *testing.T) {
	f := newFixture(t, onDisk)
	f.tree("/proj/", "/proj/f", "/g")
	if err := f.s.db.DeleteRange([]byte{pLink}, []byte{pLink + 1}, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.s.db.Set(keySchema, []byte("2"), nil); err != nil {
		t.Fatal(err)
	}
	f.reopen()
	for path, want := range map[string]bool{"/proj/f": true, "/g": false} {
		err := f.s.read(func(v view) error {
			ok, err := within(v, f.ino(path), f.ino("/proj"), nil, 0)
			if err == nil && ok != want {
				t.Errorf("%s within /proj: %v, want %v", path, ok, want)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterSecretGrantsNoPrincipal: the cluster secret (which storage
// nodes held) derives no credential meta accepts, and a database whose
// operator credential was derived from it gets a new one at open.
func TestClusterSecretGrantsNoPrincipal(t *testing.T) {
	f, srv := newHTTP(t)
	ctx := context.Background()
	legacy := func(id ids.ClientID) *metaapi.Client {
		return client(t, srv, metaapi.ClientAuth(uint64(id), f.s.Secret().ClientCredential(uint64(id))))
	}
	for _, id := range []ids.ClientID{AdminID, SystemID} {
		wantCode(t, legacy(id).Call(ctx, metaapi.OpStatus, struct{}{}, nil), metaapi.EAUTH)
	}
	// An operator principal from before: its hash is of the legacy
	// credential.
	rec := f.s.principalSet().byID[AdminID].rec
	rec.Hash = hashCredential(f.s.Secret().ClientCredential(uint64(AdminID)))
	if err := f.s.db.Set(principalKey(AdminID), mustJSON(&rec), nil); err != nil {
		t.Fatal(err)
	}
	f.reopen()
	if p := f.s.principalSet().byID[AdminID]; p.matches(f.s.Secret().ClientCredential(uint64(AdminID))) || !f.s.AdminCredentialDerived() {
		t.Fatal("the legacy operator credential survived a restart")
	}
}

// TestPanicContained: a bug that panics inside a read or a mutation is an
// internal error for that call; meta's lock is released and nothing of
// the mutation is applied.
func TestPanicContained(t *testing.T) {
	f := newFixture(t)
	if err := f.s.read(func(view) error { panic("a bug") }); err == nil {
		t.Fatal("a panicking read returned no error")
	}
	err := f.s.update(func(tx *txn) error {
		tx.b.Set([]byte("zz-half"), nil, nil)
		panic("a bug")
	})
	if err == nil {
		t.Fatal("a panicking mutation returned no error")
	}
	f.tree("/after") // would wait forever on a lock left held
	if _, found, _ := getRaw(f.s.db, []byte("zz-half")); found {
		t.Fatal("half of a panicking mutation was applied")
	}
}

package meta

import (
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
)

func ring(k int) metaapi.Policy {
	return metaapi.Policy{Replicas: k, Strategy: plan.Plan{Strategy: plan.Ring}}
}

func (f *fixture) policy(path string) metaapi.PolicyResp {
	f.t.Helper()
	p, err := f.s.GetPolicy(metaapi.GetPolicyReq{Ino: f.ino(path)})
	if err != nil {
		f.t.Fatalf("GetPolicy %s: %v", path, err)
	}
	return p
}

func (f *fixture) setPolicy(path string, p metaapi.Policy) {
	f.t.Helper()
	if _, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino(path), Policy: p, Who: root}); err != nil {
		f.t.Fatalf("SetPolicy %s: %v", path, err)
	}
}

func TestPolicyInheritance(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 2 })
	f.tree("/a/", "/a/b/", "/a/b/c/", "/x/", "/x/y/")

	if p := f.policy("/"); p.Policy != ring(2) || p.From != ids.RootIno {
		t.Fatalf("root policy %+v, want replicas=2 from root", p)
	}
	if p := f.policy("/a/b/c"); p.Policy != ring(2) || p.From != ids.RootIno {
		t.Fatalf("deep dir policy %+v, want inherited from root", p)
	}

	f.setPolicy("/a", ring(1))
	for _, path := range []string{"/a", "/a/b", "/a/b/c"} {
		if p := f.policy(path); p.Policy != ring(1) || p.From != f.ino("/a") {
			t.Fatalf("%s: policy %+v, want replicas=1 from /a", path, p)
		}
	}
	if p := f.policy("/x/y"); p.Policy != ring(2) {
		t.Fatalf("/x/y policy %+v changed by a sibling's", p)
	}

	// New files copy the effective policy and keep it.
	f.tree("/a/b/c/old")
	if a := f.attr("/a/b/c/old"); a.Policy == nil || *a.Policy != ring(1) {
		t.Fatalf("file policy %+v, want replicas=1", a.Policy)
	}
	f.setPolicy("/a/b", ring(4))
	f.tree("/a/b/c/new")
	if a := f.attr("/a/b/c/new"); *a.Policy != ring(4) {
		t.Fatalf("new file policy %+v, want replicas=4", a.Policy)
	}
	if a := f.attr("/a/b/c/old"); *a.Policy != ring(1) {
		t.Fatalf("old file policy changed to %+v", a.Policy)
	}
	if p := f.policy("/a/b/c/old"); p.Policy != ring(1) || p.From != f.ino("/a/b/c/old") {
		t.Fatalf("GetPolicy(file) = %+v, want its own policy", p)
	}

	// Moving a directory changes what it inherits.
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/a/b"), OldName: "c", NewParent: f.ino("/x"), NewName: "c", Who: root}), "")
	if p := f.policy("/x/c"); p.Policy != ring(2) || p.From != ids.RootIno {
		t.Fatalf("moved dir policy %+v, want inherited from root", p)
	}
	f.tree("/x/c/after-move")
	if a := f.attr("/x/c/after-move"); *a.Policy != ring(2) {
		t.Fatalf("file in moved dir has %+v", a.Policy)
	}
	// Root's policy can change too.
	f.setPolicy("/", ring(5))
	if p := f.policy("/x/c"); p.Policy != ring(5) {
		t.Fatalf("after root change: %+v", p)
	}
}

func TestPolicyErrors(t *testing.T) {
	f := newFixture(t)
	f.tree(stdTree...)
	for _, tc := range []struct {
		name string
		ino  ids.Ino
		p    metaapi.Policy
		want metaapi.Code
	}{
		{"file", f.ino("/f"), ring(2), metaapi.ENOTDIR},
		{"symlink", f.ino("/l"), ring(2), metaapi.ENOTDIR},
		{"missing", 999, ring(2), metaapi.ENOENT},
		{"zero replicas", f.ino("/d"), ring(0), metaapi.EINVAL},
		{"too many replicas", f.ino("/d"), ring(17), metaapi.EINVAL},
		{"unknown strategy", f.ino("/d"), metaapi.Policy{Replicas: 2, Strategy: plan.Plan{Strategy: 99}}, metaapi.EINVAL},
	} {
		_, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: tc.ino, Policy: tc.p, Who: root})
		if !metaapi.IsCode(err, tc.want) {
			t.Errorf("SetPolicy %s: %v, want %s", tc.name, err, tc.want)
		}
	}
	_, err := f.s.GetPolicy(metaapi.GetPolicyReq{Ino: f.ino("/l")})
	wantCode(t, err, metaapi.EINVAL)
	_, err = f.s.GetPolicy(metaapi.GetPolicyReq{Ino: 999})
	wantCode(t, err, metaapi.ENOENT)
	if p := f.policy("/d"); p.Policy != ring(3) {
		t.Fatalf("failed SetPolicy changed the policy: %+v", p)
	}
}

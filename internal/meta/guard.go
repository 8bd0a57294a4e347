package meta

import (
	"reflect"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// The guard applies a client's principal to each request before the
// Service sees it: the uids it claims are mapped (squashed or refused),
// every inode it names must lie within the principal's path, a read-only
// principal changes nothing, and administration needs the admin right.
// Service methods themselves know nothing of principals: what reaches
// them is a request the caller was allowed to make, as someone it may be.

// writeOps change the namespace or file data: refused to a read-only
// principal. (Layout is one when it asks to write.)
var writeOps = map[string]bool{
	metaapi.OpCreate: true, metaapi.OpLink: true, metaapi.OpRemove: true, metaapi.OpRename: true,
	metaapi.OpSetXattr: true, metaapi.OpRmXattr: true, metaapi.OpSetAttr: true, metaapi.OpSetPolicy: true,
	metaapi.OpCommit: true, metaapi.OpDegraded: true,
	// Release frees a removed file kept open, or keeps it; Reconcile
	// makes a repair happen.
	metaapi.OpRelease: true, metaapi.OpReconcile: true,
}

// adminOps need a principal with the admin right.
var adminOps = map[string]bool{
	metaapi.OpDrain: true, metaapi.OpRevokeNode: true, metaapi.OpRemoveNode: true, metaapi.OpListDeg: true, metaapi.OpCheck: true, metaapi.OpStrays: true,
	metaapi.OpAuthAdd: true, metaapi.OpAuthList: true, metaapi.OpAuthRotate: true, metaapi.OpAuthRemove: true,
}

// admitOp checks what the op's name alone decides.
func (s *Service) admitOp(c caller, name string) error {
	if c.kind != callerClient {
		return nil
	}
	if adminOps[name] {
		if err := s.requireAdmin(c); err != nil {
			return err
		}
	}
	if writeOps[name] && c.p.rec.Rights.ReadOnly {
		return metaapi.Errorf(metaapi.EROFS, "principal %q may only read", c.p.rec.Name)
	}
	return nil
}

// reqShape is where a request type keeps its identity and inode numbers.
type reqShape struct {
	who  []int // fields of type metaapi.Who
	inos []int // fields of type ids.Ino sent by the caller
}

func shapeOf(t reflect.Type) reqShape {
	var sh reqShape
	if t.Kind() != reflect.Struct {
		return sh
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("json") == "-" {
			continue // set by meta, not the caller
		}
		switch f.Type {
		case reflect.TypeFor[metaapi.Who]():
			sh.who = append(sh.who, i)
		case reflect.TypeFor[ids.Ino]():
			sh.inos = append(sh.inos, i)
		}
	}
	return sh
}

// admitReq maps and checks a decoded request (req points to it).
func (s *Service) admitReq(c caller, sh reqShape, req any) error {
	if c.kind != callerClient {
		return nil
	}
	if err := s.current(c); err != nil {
		return err
	}
	p := c.p
	v := reflect.ValueOf(req).Elem()
	for _, i := range sh.who {
		w := v.Field(i).Addr().Interface().(*metaapi.Who)
		mapped, err := p.mapWho(*w)
		if err != nil {
			return err
		}
		*w = mapped
	}
	switch r := req.(type) {
	case *metaapi.ResolveReq:
		r.Root = p.root()
	case *metaapi.LookupReq:
		r.Root = p.root()
	case *metaapi.LayoutReq:
		if r.Write && p.rec.Rights.ReadOnly {
			return metaapi.Errorf(metaapi.EROFS, "principal %q may only read", p.rec.Name)
		}
	case *metaapi.LockReq:
		// A POSIX write lock needs a descriptor open for writing, which
		// a read-only mount cannot have.
		if !r.Flock && r.Type == metaapi.LockWrite && p.rec.Rights.ReadOnly {
			return metaapi.Errorf(metaapi.EROFS, "principal %q may only read", p.rec.Name)
		}
	case *metaapi.ReconcileReq:
		// Rebuilding whole members or the gather baseline are benchmarks'.
		if len(r.Rebuild) > 0 || r.Gather {
			if err := s.requireAdmin(c); err != nil {
				return err
			}
		}
	}
	if !p.scoped() || len(sh.inos) == 0 {
		return nil
	}
	root := p.root()
	return s.read(func(vw view) error {
		gen := s.scopeGen.Load() // stable: moves happen under the write lock
		for _, i := range sh.inos {
			ino := ids.Ino(v.Field(i).Uint())
			if ino == 0 {
				continue
			}
			ok, err := within(vw, ino, root, p.scope, gen)
			if err != nil {
				return err
			}
			if !ok {
				return metaapi.Errorf(metaapi.EACCES, "inode %d is outside principal %q's path %s", ino, p.rec.Name, p.rec.Rights.Path)
			}
		}
		return nil
	})
}

// current refuses a client whose principal was rotated or removed since
// its credential was checked: a request's body may arrive long after its
// headers, and what it asks must not be done for a credential no longer
// valid. Calls that mint capabilities check again under meta's lock.
func (s *Service) current(c caller) error {
	if c.kind != callerClient || c.p == nil {
		return nil
	}
	if s.principalSet().byID[c.client] != c.p {
		return metaapi.Errorf(metaapi.EAUTH, "principal %q was rotated or removed during the call", c.p.rec.Name)
	}
	return nil
}

// clampToRoot names a confined caller's root instead of a directory above
// it (where a policy it inherits was set): it sees nothing outside.
func (s *Service) clampToRoot(c caller, ino ids.Ino) (ids.Ino, error) {
	if c.kind != callerClient || !c.p.scoped() {
		return ino, nil
	}
	var ok bool
	err := s.read(func(v view) error {
		var err error
		ok, err = within(v, ino, c.p.root(), c.p.scope, s.scopeGen.Load())
		return err
	})
	if err != nil || ok {
		return ino, err
	}
	return c.p.root(), nil
}

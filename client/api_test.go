package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const self = "github.com/sluicefs/sluice/client"

// exported type-checks this package's exported API from the compiler's
// export data (`go list -export`), as a program importing it sees it.
func exported(t *testing.T) *types.Package {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool: %v", err)
	}
	cmd := exec.Command(gotool, "list", "-export", "-deps", "-json=ImportPath,Export", self)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	files := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list: %v", err)
		}
		files[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	pkg, err := imp.Import(self)
	if err != nil {
		t.Fatalf("importing %s: %v", self, err)
	}
	return pkg
}

// internalTypes lists the types from internal packages that a user of t
// would have to name but cannot. A type named through an alias this
// package declares (Conf, Who) is nameable; its fields are still checked.
// Types this package declares are checked where they are declared, so
// they are not followed here.
func internalTypes(t types.Type, seen map[types.Type]bool) []string {
	if seen[t] {
		return nil
	}
	seen[t] = true
	switch t := t.(type) {
	case *types.Alias:
		if t.Obj().Pkg() != nil && t.Obj().Pkg().Path() == self {
			return fieldsOf(t.Rhs().Underlying(), seen)
		}
		return internalTypes(t.Rhs(), seen)
	case *types.Named:
		p := t.Obj().Pkg()
		switch {
		case p == nil || p.Path() == self:
			return nil
		case strings.Contains(p.Path()+"/", "/internal/"):
			return []string{p.Path() + "." + t.Obj().Name()}
		}
		return nil // the standard library's, nameable
	case *types.Pointer:
		return internalTypes(t.Elem(), seen)
	case *types.Slice:
		return internalTypes(t.Elem(), seen)
	case *types.Array:
		return internalTypes(t.Elem(), seen)
	case *types.Chan:
		return internalTypes(t.Elem(), seen)
	case *types.Map:
		return append(internalTypes(t.Key(), seen), internalTypes(t.Elem(), seen)...)
	case *types.Signature:
		var out []string
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for v := range tup.Variables() {
				out = append(out, internalTypes(v.Type(), seen)...)
			}
		}
		return out
	case *types.Struct:
		return fieldsOf(t, seen)
	}
	return nil
}

// fieldsOf checks the exported fields of a struct (nothing for other
// types).
func fieldsOf(t types.Type, seen map[types.Type]bool) []string {
	s, ok := t.(*types.Struct)
	if !ok {
		return nil
	}
	var out []string
	for f := range s.Fields() {
		if f.Exported() {
			out = append(out, internalTypes(f.Type(), seen)...)
		}
	}
	return out
}

// apiUses maps each exported name of pkg ("New", "Client.Put",
// "Options.Link") to the internal types it makes a user name.
func apiUses(pkg *types.Package) map[string][]string {
	uses := map[string][]string{}
	add := func(name string, ts []string) {
		if len(ts) > 0 {
			sort.Strings(ts)
			uses[name] = ts
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Func:
			add(name, internalTypes(obj.Type(), map[types.Type]bool{}))
		case *types.Var, *types.Const:
			add(name, internalTypes(obj.Type(), map[types.Type]bool{}))
		case *types.TypeName:
			if obj.IsAlias() {
				add(name, internalTypes(obj.Type(), map[types.Type]bool{}))
				continue
			}
			if s, ok := obj.Type().Underlying().(*types.Struct); ok {
				for f := range s.Fields() {
					if f.Exported() {
						add(name+"."+f.Name(), internalTypes(f.Type(), map[types.Type]bool{}))
					}
				}
			}
			if named, ok := obj.Type().(*types.Named); ok {
				for m := range named.Methods() {
					if m.Exported() {
						add(name+"."+m.Name(), internalTypes(m.Type(), map[types.Type]bool{}))
					}
				}
			}
		}
	}
	return uses
}

// declared reports whether pkg exports name ("New", "Client.Put").
func declared(pkg *types.Package, name string) bool {
	typ, member, ok := strings.Cut(name, ".")
	obj := pkg.Scope().Lookup(typ)
	if obj == nil || !obj.Exported() || !ok {
		return obj != nil && obj.Exported()
	}
	m, _, _ := types.LookupFieldOrMethod(types.NewPointer(obj.Type()), true, pkg, member)
	return m != nil && m.Exported()
}

// TestPublicAPI: nothing this package exports names a type of an
// internal package, which a program outside this module could not
// import (a type it names through an alias declared here, such as Conf,
// is nameable; that type's fields are checked in turn). The SDK the
// front ends and tools in this module use, with its inode-level and
// administrative calls, is internal/sdk. And what a program needs to
// connect with a client.conf and use the file system is there.
func TestPublicAPI(t *testing.T) {
	pkg := exported(t)
	core := []string{
		"New", "NewFromFile", "Options", "Conf", "Who", "WithWho",
		"Client.Close", "Client.Put", "Client.Get", "Client.Open", "Client.Create",
		"Client.Mkdir", "Client.MkdirAll", "Client.Remove", "Client.RemoveAll", "Client.Rename",
		"Client.Stat", "Client.Lstat", "Client.ReadDir", "Client.Symlink",
		"Client.SetPolicy", "Client.GetPolicy", "Policy", "ErasureCode",
		"File.ReadAt", "File.WriteAt", "File.ReadAtContext", "File.WriteAtContext",
		"File.Close", "File.Size", "File.Truncate", "File.Stat",
		"PathError", "NodeError", "IsExist", "IsNotExist",
	}
	for _, name := range core {
		if !declared(pkg, name) {
			t.Errorf("%s is not exported", name)
		}
	}
	var bad []string
	for use, ts := range apiUses(pkg) {
		bad = append(bad, use+": "+strings.Join(ts, ", "))
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("%s: an external module cannot name it", b)
	}
}

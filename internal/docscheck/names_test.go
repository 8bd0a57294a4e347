package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The write path in docs/architecture.md names functions so a reader can
// follow it in the code; a rename must not leave it pointing at nothing.
func TestWritePathNamesExist(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatalf("reading docs/architecture.md: %v", err)
	}
	section, ok := section(string(b), "### Function by function")
	if !ok {
		t.Fatal(`docs/architecture.md has no "### Function by function" section`)
	}
	declared := declaredNames(t, root)
	names := codeNames(section)
	if len(names) < 20 {
		t.Fatalf("found only %d names in the write path: %q", len(names), names)
	}
	for _, n := range names {
		if !declared[n] {
			t.Errorf("docs/architecture.md's write path names `%s`, which no Go file declares", n)
		}
	}
	files := goFiles.FindAllStringSubmatch(section, -1)
	if len(files) < 10 {
		t.Fatalf("found only %d file paths in the write path", len(files))
	}
	for _, m := range files {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(m[1]))); err != nil {
			t.Errorf("docs/architecture.md's write path names file %s, which does not exist", m[1])
		}
	}
}

// goFiles is a code span naming a Go file by its path in the module.
var goFiles = regexp.MustCompile("`((?:[\\w.-]+/)+[\\w.-]+\\.go)`")

// section returns the text from the heading to the next heading of the
// same or a higher level.
func section(text, heading string) (string, bool) {
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		return "", false
	}
	rest := text[i+len(heading)+2:]
	level := strings.Count(strings.Fields(heading)[0], "#")
	for _, l := range []string{"\n# ", "\n## ", "\n### "}[:level] {
		if j := strings.Index(rest, l); j >= 0 {
			rest = rest[:j]
		}
	}
	return rest, true
}

// codeIdent is a code span holding one Go name: fn, Type.Method,
// pkg.Name or pkg.Type.Method, with an optional call suffix.
var codeIdent = regexp.MustCompile("`([A-Za-z_]\\w*(?:\\.[A-Za-z_]\\w*){0,2})(?:\\([^`]*\\))?(?:\\.[A-Za-z_]\\w*\\(\\))?`")

func codeNames(text string) []string {
	var out []string
	for _, m := range codeIdent.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// declaredNames is every name the module's non-test Go files declare,
// under each spelling the docs use: name, pkg.name, Type.name,
// pkg.Type.name (methods and struct fields), for functions, types,
// constants and variables.
func declaredNames(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	add := func(pkg, recv, name string) {
		out[name] = true
		out[pkg+"."+name] = true
		if recv != "" {
			out[recv+"."+name] = true
			out[pkg+"."+recv+"."+name] = true
		}
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				add(pkg, recvName(d), d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						add(pkg, "", s.Name.Name)
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fld := range st.Fields.List {
								for _, n := range fld.Names {
									add(pkg, s.Name.Name, n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(pkg, "", n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("parsing the module's Go files: %v", err)
	}
	return out
}

func recvName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	e := d.Recv.List[0].Type
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.IndexExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			return id.Name
		}
	case *ast.IndexListExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			return id.Name
		}
	}
	return ""
}

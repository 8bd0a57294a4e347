package docscheck

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

// The checker itself must catch what it is for.
func TestLinkCheckerCatches(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := root + "/" + name
		if err := writeFile(p, text); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("docs/a.md", "# A title\n\n## `sluice bench nfs` (seed 001 §7)\n\n## Twice\n\n## Twice\n")
	f := write("README.md", "[ok](docs/a.md) [ok](docs/a.md#a-title) [ok](docs/a.md#sluice-bench-nfs-seed-001-7)\n"+
		"[ok](docs/a.md#twice-1) [web](https://example.com/x) `[code](../../x)`\n"+
		"```\n[fenced](../../y)\n```\n"+
		"[up](../shared/DESIGN.md) [gone](docs/b.md) [anchor](docs/a.md#nope) [abs](/etc/passwd)\n")
	got := linkProblems(root, f, readFile(t, f), map[string]map[string]bool{})
	want := []string{
		"mentions ../shared, which is outside the repository",
		`link "../shared/DESIGN.md" leaves the repository`,
		`link "docs/b.md": docs/b.md does not exist`,
		`link "docs/a.md#nope": no heading makes the anchor #nope`,
		`link "/etc/passwd" is an absolute path: links are relative to the file`,
	}
	sort.Strings(got)
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n got %q\nwant %q", got, want)
	}
}

func writeFile(p, text string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(text), 0o644)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

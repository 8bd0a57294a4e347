package docscheck

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// maxREADMELines keeps the README a user's page (issue 18): design and
// results belong in docs/.
const maxREADMELines = 250

// repoRoot is the directory holding go.mod, found upwards from the test's
// working directory (its package directory).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("working directory: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func TestREADMEIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatalf("reading README: %v", err)
	}
	if n := bytes.Count(b, []byte("\n")); n > maxREADMELines {
		t.Errorf("README.md has %d lines, at most %d: move design, results and details into docs/", n, maxREADMELines)
	}
}

func TestArchitectureNamesEveryPackage(t *testing.T) {
	root := repoRoot(t)
	arch, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatalf("reading docs/architecture.md: %v", err)
	}
	mod := runGo(t, root, "list", "-m")
	pkgs := strings.Fields(runGo(t, root, "list", "./..."))
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed no packages")
	}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, strings.TrimSpace(mod)), "/")
		if !bytes.Contains(arch, []byte("`"+rel+"`")) {
			t.Errorf("docs/architecture.md does not name package `%s` (with its role)", rel)
		}
	}
}

func runGo(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func TestMarkdownLinksStayInside(t *testing.T) {
	root := repoRoot(t)
	files := markdownFiles(t, root)
	if len(files) == 0 {
		t.Fatal("no markdown files found")
	}
	anchors := map[string]map[string]bool{} // file -> heading slugs, filled lazily
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("reading %s: %v", f, err)
		}
		for _, p := range linkProblems(root, f, string(text), anchors) {
			rel, _ := filepath.Rel(root, f)
			t.Errorf("%s: %s", rel, p)
		}
	}
}

// markdownFiles lists the repository's markdown files, leaving out hidden
// directories (.git) and what `sluice up` writes (sluice-data).
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "sluice-data") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return out
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
)

// linkProblems returns what is wrong with the links of one markdown file:
// a target outside the repository, a relative target that does not
// exist, or an anchor no heading of its file makes.
func linkProblems(root, file, text string, anchors map[string]map[string]bool) []string {
	var out []string
	if strings.Contains(text, "../shared") {
		out = append(out, "mentions ../shared, which is outside the repository")
	}
	for _, target := range links(text) {
		if p := checkLink(root, file, target, anchors); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// links returns the targets of a markdown text's inline and reference
// links, outside fenced code blocks and code spans.
func links(text string) []string {
	var out []string
	fenced := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "code")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
		}
	}
	return out
}

func checkLink(root, file, target string, anchors map[string]map[string]bool) string {
	lower := strings.ToLower(target)
	if strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") || strings.HasPrefix(lower, "mailto:") {
		return ""
	}
	if strings.Contains(target, "://") {
		return fmt.Sprintf("link %q: only http(s) and relative links", target)
	}
	path, anchor, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		if filepath.IsAbs(path) {
			return fmt.Sprintf("link %q is an absolute path: links are relative to the file", target)
		}
		dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
		rel, err := filepath.Rel(root, dest)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return fmt.Sprintf("link %q leaves the repository", target)
		}
		if _, err := os.Stat(dest); err != nil {
			return fmt.Sprintf("link %q: %s does not exist", target, rel)
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	slugs, ok := anchors[dest]
	if !ok {
		b, err := os.ReadFile(dest)
		if err != nil {
			return fmt.Sprintf("link %q: %v", target, err)
		}
		slugs = headingSlugs(string(b))
		anchors[dest] = slugs
	}
	if !slugs[anchor] {
		return fmt.Sprintf("link %q: no heading makes the anchor #%s", target, anchor)
	}
	return ""
}

// headingSlugs returns the anchors GitHub makes for a file's headings:
// lower case, punctuation dropped, spaces turned into hyphens, and a
// repeated slug numbered (-1, -2, ...).
func headingSlugs(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

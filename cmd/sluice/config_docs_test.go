package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/sluicefs/sluice/internal/daemonconf"
)

// TestConfigDocsExamples applies each example file in docs/config.md to
// the command it is for: the documented keys and values must be ones
// the daemons accept.
func TestConfigDocsExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	// An example is a ```toml block after a line naming its file.
	re := regexp.MustCompile("(?s)`(?:/etc/sluice/|sluice up --config )(\\w+)\\.toml[^\n]*\n+```toml\n(.*?)```")
	blocks := re.FindAllSubmatch(doc, -1)
	if len(blocks) != 5 {
		t.Fatalf("found %d examples in docs/config.md, want 5 (meta, node, mount, nfs, up)", len(blocks))
	}
	for _, b := range blocks {
		name, body := string(b[1]), b[2]
		a := &app{stdout: os.Stdout, stderr: os.Stderr}
		cmd, _, err := a.rootCmd().Find([]string{name})
		if err != nil || cmd.Name() != name {
			t.Fatalf("example %s.toml: no command %q (%v)", name, name, err)
		}
		if err := cmd.ParseFlags(nil); err != nil { // merges the global flags
			t.Fatal(err)
		}
		if err := daemonconf.Apply(cmd.Flags(), name+".toml", body, false); err != nil {
			t.Errorf("docs/config.md example for sluice %s: %v", name, err)
		}
	}
}

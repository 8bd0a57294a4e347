package repairplan

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestPlans runs the cases in testdata/plans. Each member is written
// VERSION/LENGTH followed by flags — f fresh, c corrupt, d in doubt — or
// "-" for a member that did not answer. recorded=N is the version meta
// recorded a commit of (0 if not given). Members to drop are listed
// only when there are some.
func TestPlans(t *testing.T) {
	datadriven.RunTest(t, "testdata/plans", func(t *testing.T, d *datadriven.TestData) string {
		ms, err := parseMembers(d.Input)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		var p Plan
		var recorded uint64
		d.MaybeScanArgs(t, "recorded", &recorded)
		switch d.Cmd {
		case "replicated":
			p, err = Replicated(ms, recorded)
		case "striped":
			var k int
			d.ScanArgs(t, "k", &k)
			p, err = Striped(ms, k, recorded)
		default:
			d.Fatalf(t, "unknown command %s", d.Cmd)
		}
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		drop := ""
		if len(p.Drop) > 0 {
			drop = fmt.Sprintf(" drop=%v", p.Drop)
		}
		out := fmt.Sprintf("version=%d length=%d sources=%v targets=%v heal=%v resolve=%v%s done=%v\n",
			p.Version, p.Length, p.Sources, p.Targets, p.Heal, p.Resolve, drop, p.Done())
		return strings.ReplaceAll(out, "[]", "-")
	})
}

func parseMembers(s string) ([]Member, error) {
	var ms []Member
	for _, f := range strings.Fields(s) {
		if f == "-" {
			ms = append(ms, Member{})
			continue
		}
		m := Member{Answered: true}
		vl, flags, _ := strings.Cut(strings.TrimRight(f, "fcd")+"|"+f[len(strings.TrimRight(f, "fcd")):], "|")
		v, l, ok := strings.Cut(vl, "/")
		if !ok {
			return nil, fmt.Errorf("member %q is not VERSION/LENGTH[flags]", f)
		}
		var err error
		if m.Version, err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, err
		}
		if m.Length, err = strconv.ParseInt(l, 10, 64); err != nil {
			return nil, err
		}
		m.Fresh, m.Corrupt, m.Doubt = strings.Contains(flags, "f"), strings.Contains(flags, "c"), strings.Contains(flags, "d")
		ms = append(ms, m)
	}
	return ms, nil
}

func TestSortByMargin(t *testing.T) {
	type ch struct {
		name      string
		live, min int
	}
	items := []ch{{"a", 3, 1}, {"b", 1, 1}, {"c", 4, 3}, {"d", 2, 1}, {"e", 1, 1}}
	SortByMargin(items, func(c ch) int { return Margin(c.live, c.min) })
	var got []string
	for _, c := range items {
		got = append(got, c.name)
	}
	if want := []string{"b", "e", "c", "d", "a"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

package nfsexport

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestExports runs the cases in testdata/:
//
//	parse: the input is an exports file; the output is each export in
//	canonical form (every option spelt out), or the error.
//
//	admit path=P peer=ADDR:PORT [uid=N] [gid=N] [gids=N,N] [none]: the
//	input is an exports file; the output is the export a MOUNT of P
//	from the caller finds and the identity the caller acts as, or the
//	refusal. none is an AUTH_NONE call. Every export that admits the
//	caller is also asked directly (as each NFS call's re-check does), and
//	must agree.
func TestExports(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			exports, err := Parse("exports", d.Input)
			switch d.Cmd {
			case "parse":
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				var b strings.Builder
				for _, e := range exports {
					b.WriteString(e.String() + "\n")
					// The canonical form reads back as the same export.
					again, err := ParseLine(e.String())
					if err != nil || again.String() != e.String() {
						t.Fatalf("%s: read back as %s (%v)", e, again, err)
					}
				}
				return b.String()
			case "admit":
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				var p, peer, gids string
				var uid, gid uint64
				d.ScanArgs(t, "path", &p)
				d.ScanArgs(t, "peer", &peer)
				d.MaybeScanArgs(t, "uid", &uid)
				d.MaybeScanArgs(t, "gid", &gid)
				d.MaybeScanArgs(t, "gids", &gids)
				c := Caller{AuthNone: d.HasArg("none")}
				if c.Peer, err = netip.ParseAddrPort(peer); err != nil {
					d.Fatalf(t, "%v", err)
				}
				c.Who.UID, c.Who.GID = uint32(uid), uint32(gid)
				for _, g := range strings.FieldsFunc(gids, func(r rune) bool { return r == ',' }) {
					n, err := strconv.ParseUint(g, 10, 32)
					if err != nil {
						d.Fatalf(t, "%v", err)
					}
					c.Who.GIDs = append(c.Who.GIDs, uint32(n))
				}
				e, acc, err := Find(exports, p, c)
				if err != nil {
					return "refused: " + err.Error() + "\n"
				}
				// Each call re-checks against the handle's export: the
				// same decision.
				again, aerr := e.Admit(c)
				if aerr != nil || fmt.Sprint(again) != fmt.Sprint(acc) {
					t.Fatalf("Admit disagrees with Find: %v %v", again, aerr)
				}
				mode := "ro"
				if acc.ReadWrite {
					mode = "rw"
				}
				return fmt.Sprintf("export %s via %s: uid=%d gid=%d gids=%v %s\n", e.Path, hostString(*acc.Client), acc.Who.UID, acc.Who.GID, acc.Who.GIDs, mode)
			}
			d.Fatalf(t, "unknown command %s", d.Cmd)
			return ""
		})
	})
}

package nfsexport

import (
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// FuzzParse: any text either parses or is an error naming a line; what
// parses reads back from its canonical form as the same exports, and
// the decision on it never panics and never gives more than asked.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/parse", "testdata/admit"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f.Add(line, uint16(800), uint32(0))
		}
	}
	f.Add("/ 127.0.0.1(rw)\n/a\\\n 10.0.0.0/8(ro) # c", uint16(40000), uint32(1000))
	f.Fuzz(func(t *testing.T, text string, port uint16, uid uint32) {
		exports, err := Parse("f", text)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f:") {
				t.Fatalf("error without its line: %v", err)
			}
			return
		}
		for _, e := range exports {
			again, err := ParseLine(e.String())
			if err != nil || !reflect.DeepEqual(again, e) {
				t.Fatalf("%q: canonical form %q reads back as %v (%v)", text, e.String(), again, err)
			}
			for _, peer := range []string{"127.0.0.1", "10.1.2.3", "::1", "::ffff:10.0.0.1"} {
				c := Caller{Peer: netip.AddrPortFrom(netip.MustParseAddr(peer), port), Who: metaapi.Who{UID: uid, GID: uid, GIDs: []uint32{0, uid}}}
				acc, err := e.Admit(c)
				if err != nil {
					continue
				}
				o := acc.Client.Opts
				switch {
				case port >= 1024 && !o.Insecure:
					t.Fatalf("%s admitted port %d", e, port)
				case o.Squash != NoRootSquash && (acc.Who.UID == 0 && o.AnonUID != 0 || acc.Who.GID == 0 && o.AnonGID != 0):
					t.Fatalf("%s: root not squashed: %+v", e, acc.Who)
				case o.Squash == AllSquash && (acc.Who.UID != o.AnonUID || len(acc.Who.GIDs) > 0):
					t.Fatalf("%s: all_squash gave %+v", e, acc.Who)
				}
			}
		}
	})
}

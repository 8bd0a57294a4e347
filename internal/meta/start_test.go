package meta

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/repairplan"
)

// idleRepairer is a Repairer for a cluster with nothing to repair; it
// records being closed.
type idleRepairer struct{ closed bool }

func (r *idleRepairer) FenceMembers(context.Context, *metaapi.ChunkLayout, uint64) ([]repairplan.Member, []error) {
	return nil, nil
}
func (r *idleRepairer) CopyReplica(context.Context, *metaapi.ChunkLayout, int, []int, uint64, int64, bool) error {
	return errors.New("nothing to repair")
}
func (r *idleRepairer) RebuildUnits(context.Context, *metaapi.ChunkLayout, []int, []int, uint64, int64, bool, bool) error {
	return errors.New("nothing to repair")
}
func (r *idleRepairer) DropMembers(context.Context, *metaapi.ChunkLayout, []int, []uint64) error {
	return errors.New("nothing to repair")
}
func (r *idleRepairer) Close() error { r.closed = true; return nil }

// Start serves TLS at the advertised address's certificate, writes the
// operator's client.conf naming that address, hands the repair worker
// meta's own credentials, and Close closes the worker after the service.
func TestStartServesAndWritesConf(t *testing.T) {
	dir := t.TempDir()
	rep := &idleRepairer{}
	var repConf config.ClientConf
	srv, err := Start(StartOptions{Options: Options{Dir: dir, Logger: testLogger()}, Listen: "127.0.0.1:0", Advertise: "127.0.0.1",
		RepairParallel: 2, NewRepairer: func(c config.ClientConf) (Repairer, io.Closer, error) { repConf = c; return rep, rep, nil }})
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(srv.ListenAddr.String())
	if want := net.JoinHostPort("127.0.0.1", port); srv.Addr != want {
		t.Errorf("advertised %s, want %s (the listen port)", srv.Addr, want)
	}
	if want := filepath.Join(dir, config.FileName); srv.ConfPath != want {
		t.Errorf("client config at %s, want %s", srv.ConfPath, want)
	}
	conf, err := config.Load(srv.ConfPath)
	if err != nil {
		t.Fatal(err)
	}
	if conf.Meta != srv.Addr || conf.ClientID != uint64(AdminID) {
		t.Errorf("client.conf names meta %s as client %d, want %s as the admin", conf.Meta, conf.ClientID, srv.Addr)
	}
	if repConf.ClientID != uint64(SystemID) || repConf.Meta != srv.Addr {
		t.Errorf("repair worker is client %d of %s, want the system principal of %s", repConf.ClientID, repConf.Meta, srv.Addr)
	}
	st, err := srv.Service.Status()
	if err != nil || st.MetaAddr != srv.Addr {
		t.Errorf("status reports meta at %q (%v), want %s", st.MetaAddr, err, srv.Addr)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(conf.CA))
	tc, err := tls.Dial("tcp", srv.ListenAddr.String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("TLS to meta: %v", err)
	}
	tc.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-srv.Err(); err != nil {
		t.Errorf("serving ended with %v after Close, want nil", err)
	}
	if !rep.closed {
		t.Error("repair worker left open")
	}
}

// An address no other host can reach meta at is refused before anything
// is made.
func TestStartBadAdvertiseMakesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "meta")
	_, err := Start(StartOptions{Options: Options{Dir: dir, Logger: testLogger()}, Listen: "127.0.0.1:0", Advertise: "0.0.0.0"})
	if err == nil {
		t.Fatal("advertising 0.0.0.0 accepted")
	}
	if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("after %v, the data directory exists (%v)", err, serr)
	}
}

func TestResolveAdvertise(t *testing.T) {
	ln := &net.TCPAddr{IP: net.IPv4zero, Port: 7700}
	for _, c := range []struct{ advertise, want string }{
		{"", "127.0.0.1:7700"},
		{"meta.example", "meta.example:7700"},
		{"10.0.0.5:0", "10.0.0.5:7700"},
		{"10.0.0.5:9000", "10.0.0.5:9000"},
		{"::1", "[::1]:7700"},
		{"0.0.0.0", ""},
		{"[::]:7700", ""},
		{"a b", ""},
		{"a/b:1", ""},
	} {
		got, err := ResolveAdvertise(c.advertise, ln)
		if c.want == "" {
			if err == nil {
				t.Errorf("ResolveAdvertise(%q) = %s, want an error", c.advertise, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ResolveAdvertise(%q) = %s, %v; want %s", c.advertise, got, err, c.want)
		}
	}
}

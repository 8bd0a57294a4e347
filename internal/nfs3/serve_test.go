package nfs3_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabricrpc"
	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// Listen and Serve put NFS on TCP and the fabric transport and the stats
// program beside them, counting each transport's calls; Serve returns
// nil when its context ends and stops answering.
func TestServeTransportsAndStats(t *testing.T) {
	cl, _ := nfs3.StartTestCluster(t, 1)
	srv, err := nfs3.Listen(nfs3.ServeOptions{Options: nfs3.Options{Client: cl}, Listen: "127.0.0.1:0", FabricListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		<-served
	}()

	call, cancelCall := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCall()
	rc, err := oncrpc.Dial(call, srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.Call(call, nfs3.ProgNFS, nfs3.Version, 0, nil, nil); err != nil {
		t.Fatalf("NFS NULL over TCP: %v", err)
	}
	if srv.FabricAddr() == nil {
		t.Fatal("no fabric transport address")
	}
	fc, err := fabricrpc.Dial(call, srv.FabricAddr().String(), fabricrpc.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	if _, err := fc.Call(call, nfs3.ProgNFS, nfs3.Version, 0, nil, &xdr.Writer{}, nil); err != nil {
		t.Fatalf("NFS NULL over the fabric: %v", err)
	}

	res, err := rc.Call(call, nfs3.StatsProg, 1, 1, nil, nil)
	if err != nil {
		t.Fatalf("stats program: %v", err)
	}
	r := xdr.NewReader(res)
	b := r.Opaque(1 << 20)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	var st nfs3.Stats
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("stats %q: %v", b, err)
	}
	if st.TCP.Calls < 1 || st.Fabric.Calls < 1 {
		t.Errorf("stats count %d calls over TCP and %d over the fabric, want each's NULL", st.TCP.Calls, st.Fabric.Calls)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve ended with %v when its context did, want nil", err)
		}
		served <- nil // for the deferred wait
	case <-time.After(time.Minute):
		t.Fatal("Serve still running a minute after its context ended")
	}
	if _, err := rc.Call(call, nfs3.ProgNFS, nfs3.Version, 0, nil, nil); err == nil {
		t.Error("NFS still answered over TCP after Serve returned")
	}
}

// The handle key depends on the credential alone: every gateway of a
// cluster, and the same one after a restart, make the same handles.
func TestHandleKey(t *testing.T) {
	if !bytes.Equal(nfs3.HandleKey("cred-a"), nfs3.HandleKey("cred-a")) {
		t.Error("the same credential gave two keys")
	}
	if bytes.Equal(nfs3.HandleKey("cred-a"), nfs3.HandleKey("cred-b")) {
		t.Error("two credentials gave one key")
	}
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestDeployOnHosts follows docs/deploy.md on hosts that are network
// namespaces on a Linux bridge this test makes: meta, five storage nodes,
// a FUSE mount and an NFS gateway, each in a namespace of its own with
// its own address, every daemon listening on 0.0.0.0 on the ports the
// guide names, meta told its address with --advertise, nodes joining
// with tokens in $SLUICE_JOIN_TOKEN, and client.conf copied to the client
// hosts. The test's own namespace is the operator's workstation on the
// bridge. A file written through the mount reads back through the
// gateway; then one node's link goes down: status shows the node down,
// and files are written and read (replicas 3 of 5 nodes) while it is;
// the link comes back and so does the node.
func TestDeployOnHosts(t *testing.T) {
	requireFUSE(t)
	began := time.Now()
	stage := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	br := newNetBridge(t)
	dir := baseDir(t)
	metaHost := br.addHost(t, "meta", 10)
	nodes := make([]*netHost, 5)
	for i := range nodes {
		nodes[i] = br.addHost(t, fmt.Sprintf("n%d", i+1), 11+i)
	}
	mntHost := br.addHost(t, "mnt", 20)
	nfsHost := br.addHost(t, "nfs", 21)
	start := func(h *netHost, name string, env []string, args ...string) *proc {
		bin, all := h.run(env, args...)
		return startCmd(t, dir, name, nil, bin, all...)
	}

	// The meta host.
	metaDir := filepath.Join(dir, "meta")
	mp := start(metaHost, "meta", nil, "meta", "--data", metaDir, "--listen", "0.0.0.0:7700", "--advertise", metaHost.ip, "--node-timeout", "3s")
	metaAddr := metaHost.ip + ":7700"
	if got := mp.waitLine(t, reMetaListen, 20*time.Second)[1]; got != metaAddr {
		t.Fatalf("meta says it is at %s, want %s", got, metaAddr)
	}
	// client.conf, copied to the client hosts (and this workstation).
	raw, err := os.ReadFile(filepath.Join(metaDir, "client.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "client", "client.conf")
	if err := os.MkdirAll(filepath.Dir(conf), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, raw, 0o600); err != nil {
		t.Fatal(err)
	}

	// The storage node hosts: a token each, in the environment.
	for i, h := range nodes {
		tok := strings.TrimSpace(string(mustRun(t, conf, nil, "join-token", "--ttl", "10m").stdout))
		p := start(h, h.name, []string{"SLUICE_JOIN_TOKEN=" + tok}, "node", "--data", filepath.Join(dir, h.name), "--meta", metaAddr, "--listen", "0.0.0.0:7701")
		m := p.waitLine(t, reNodeListen, 30*time.Second)
		if m[1] != fmt.Sprintf("n%d", i+1) {
			t.Fatalf("host %s joined as %s", h.name, m[1])
		}
	}
	st := waitNodesUp(t, conf, 5, 30*time.Second)
	stage("five nodes up")
	hostOf := map[ids.NodeID]*netHost{}
	for _, n := range st.Nodes {
		h := nodes[n.ID-1]
		if want := h.ip + ":7701"; n.Addr != want {
			t.Errorf("node %v registered at %s, want its host's address %s", n.ID, n.Addr, want)
		}
		hostOf[n.ID] = h
	}
	if t.Failed() {
		t.FailNow()
	}
	if out := string(mustRun(t, conf, nil, "policy", "get", "/").stdout); !strings.Contains(out, "replicas=3") {
		t.Fatalf("root policy: %q, want replicas=3", out)
	}

	// The client hosts: a FUSE mount and an NFS gateway.
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	mountProc := start(mntHost, "mount", nil, "mount", mnt, "--conf", conf)
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	mountProc.waitLine(t, reMounted, 30*time.Second)
	np := start(nfsHost, "nfs", nil, "nfs", "--conf", conf, "--listen", "0.0.0.0:2049", "--export", "/ "+br.subnet+".0/24(rw)")
	np.waitLine(t, reNFSListen, 30*time.Second)
	gateway := nfsHost.ip + ":2049"
	stage("mounted, gateway serving")

	write := func(name string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatalf("writing %s through the mount: %v", name, err)
		}
	}
	// readBack reads a file through the gateway (from this workstation)
	// and with a fresh CLI, which has no cache to answer from.
	readBack := func(name string, want []byte) {
		t.Helper()
		if got := mustRun(t, conf, nil, "nfs-get", "--server", gateway, "/"+name, "-").stdout; !bytes.Equal(got, want) {
			t.Fatalf("%s through the NFS gateway: %d bytes (%s), want %d (%s)", name, len(got), sum(got), len(want), sum(want))
		}
		if got := mustRun(t, conf, nil, "get", "/"+name, "-").stdout; !bytes.Equal(got, want) {
			t.Fatalf("%s with sluice get: %d bytes (%s), want %d (%s)", name, len(got), sum(got), len(want), sum(want))
		}
	}
	before := randomBytes(t, 3<<20+777)
	write("before", before)
	readBack("before", before)
	// One the gateway has not read yet: after the cut, it reads it from
	// the replicas, over connections it has to every node.
	unread := randomBytes(t, 3<<20+555)
	write("unread", unread)
	stage("written and read back")
	// Cut off a node holding a replica of the file.
	_, chunks := layoutOf(t, metaClient(t, conf), "/before")
	victim := chunks[0].Replicas[0].Node
	cut := hostOf[victim]
	t.Logf("cutting node %v (%s) off", victim, cut.ip)
	cut.setLink(t, false)
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := status(t, conf)
		return nodeStates(st)[victim] == metaapi.NodeDown, fmt.Sprintf("node %v %s", victim, nodeStates(st)[victim])
	})
	if out := string(mustRun(t, conf, nil, "status").stdout); !regexp.MustCompile(`(?m)^` + fmt.Sprint(uint32(victim)) + `\s+` + regexp.QuoteMeta(cut.ip) + `:7701\s+\S*\s*down\b`).MatchString(out) {
		t.Errorf("status does not show node %v at %s:7701 down:\n%s", victim, cut.ip, out)
	}
	stage("node down")
	during := randomBytes(t, 2<<20+99)
	write("during", during)
	stage("written during")
	readBack("during", during)
	stage("read back during")
	readBack("before", before)
	readBack("unread", unread)
	stage("read and written with the node cut off")

	// The link comes back, and so does the node.
	cut.setLink(t, true)
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := status(t, conf)
		return nodeStates(st)[victim] == metaapi.NodeUp, fmt.Sprintf("node %v %s", victim, nodeStates(st)[victim])
	})
	stage("node up again")
	after := randomBytes(t, 1<<20)
	write("after", after)
	readBack("after", after)
	if got, err := os.ReadFile(filepath.Join(mnt, "during")); err != nil || !bytes.Equal(got, during) {
		t.Fatalf("during through the mount: %d bytes, %v", len(got), err)
	}
}

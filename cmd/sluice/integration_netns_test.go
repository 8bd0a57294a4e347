package main

// Network namespaces for the tests that need real networks: a partition
// (a namespace on a veth pair) and a deployment (namespaces as hosts on a
// Linux bridge). Every name carries a random tag, and every interface and
// namespace is removed when the test ends, however it ends.

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
)

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// requireRoot fails the test where it cannot create network namespaces:
// the issue asks for a real partition, so it must not pass silently.
func requireRoot(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("id", "-u").Output(); err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Fatalf("the partition test needs root (network namespaces): id -u = %q, %v", out, err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("network namespace tests need ip (iproute2; scripts/test installs it): %v", err)
	}
}

// netTag is a random tag for interface and namespace names (at most 15
// bytes with their prefixes).
func netTag() string { return fmt.Sprintf("%04x", rand.IntN(1<<16)) }

// addNetns creates namespace ns with its loopback up, deleted (with the
// interfaces in it) when the test ends.
func addNetns(t *testing.T, ns string) {
	t.Helper()
	ipCmd(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
}

// vethInto makes a veth pair: outer stays here, its peer goes into ns as
// inner with address ip/24, up. The pair is deleted when the test ends.
func vethInto(t *testing.T, outer, ns, inner, ip string) {
	t.Helper()
	ipCmd(t, "link", "add", outer, "type", "veth", "peer", "name", inner)
	t.Cleanup(func() { exec.Command("ip", "link", "del", outer).Run() })
	ipCmd(t, "link", "set", inner, "netns", ns)
	ipCmd(t, "-n", ns, "addr", "add", ip+"/24", "dev", inner)
	ipCmd(t, "-n", ns, "link", "set", inner, "up")
}

// netBridge is a Linux bridge this test made, with the test's own
// namespace on it at .1 of a /24 and hosts (namespaces) added at other
// addresses.
type netBridge struct {
	tag, name, subnet string
}

// newNetBridge creates the bridge on a 10.214.N.0/24 no interface here
// uses yet (tests running at once must not share a subnet).
func newNetBridge(t *testing.T) *netBridge {
	t.Helper()
	requireRoot(t)
	b := &netBridge{tag: netTag()}
	b.name = "slbr" + b.tag
	out, err := exec.Command("ip", "-o", "addr", "show").Output()
	if err != nil {
		t.Fatalf("ip addr show: %v", err)
	}
	for tries := 0; b.subnet == ""; tries++ {
		s := fmt.Sprintf("10.214.%d", 1+rand.IntN(250))
		if !strings.Contains(string(out), " "+s+".") {
			b.subnet = s
		} else if tries > 100 {
			t.Fatal("no free 10.214.N.0/24 for the test's bridge")
		}
	}
	ipCmd(t, "link", "add", b.name, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", b.name).Run() })
	ipCmd(t, "addr", "add", b.ip(1)+"/24", "dev", b.name)
	ipCmd(t, "link", "set", b.name, "up")
	return b
}

func (b *netBridge) ip(i int) string { return fmt.Sprintf("%s.%d", b.subnet, i) }

// netHost is a namespace on a netBridge: a host with one interface.
type netHost struct {
	name, ns, link, ip string // link: its veth's end on the bridge
}

// addHost puts a new namespace on the bridge at address .i.
func (b *netBridge) addHost(t *testing.T, name string, i int) *netHost {
	t.Helper()
	h := &netHost{name: name, ns: fmt.Sprintf("sl%s-%s", b.tag, name), link: fmt.Sprintf("slv%s%d", b.tag, i), ip: b.ip(i)}
	addNetns(t, h.ns)
	vethInto(t, h.link, h.ns, fmt.Sprintf("slh%s%d", b.tag, i), h.ip)
	ipCmd(t, "link", "set", h.link, "master", b.name)
	ipCmd(t, "link", "set", h.link, "up")
	return h
}

// setLink takes the host's link to the bridge down (cut off) or up.
func (h *netHost) setLink(t *testing.T, up bool) {
	t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	ipCmd(t, "link", "set", h.link, state)
}

// run is the command line that runs sluice with args on the host: in
// its network namespace only (nsenter), so a FUSE mount made there is
// seen here, unlike under `ip netns exec`, which makes a mount namespace
// of its own. env are NAME=VALUE settings.
func (h *netHost) run(env []string, args ...string) (string, []string) {
	all := append([]string{"--net=/run/netns/" + h.ns, "env"}, env...)
	return "nsenter", append(append(all, sluiceBin), args...)
}

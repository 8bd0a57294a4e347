package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/secret"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestCapKeysRotateUnderLoad: writes and reads run without a pause while
// meta's capability key rotates twice — from separate `sluice put` and
// `sluice get` processes (fresh layouts each) and from one long-lived
// client whose cached capabilities, minted under a key, are used after
// the next one took over. No operation may fail.
func TestCapKeysRotateUnderLoad(t *testing.T) {
	// The client uses a cached capability until a quarter of its
	// lifetime before it expires (3 s): some stay in use across each
	// rotation.
	const ttl, period = 12 * time.Second, 14 * time.Second
	// Nodes are not declared down for a slow heartbeat on a loaded
	// machine: a put finding too few nodes up is not what this tests.
	c := threeNodes(t, []string{"--cap-ttl", ttl.String(), "--cap-key-rotate", period.String(), "--node-timeout", "15s"}, nil)
	cc, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sdk.New(sdk.Options{Conf: cc})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	f, err := cl.Create(ctx, "/held", 0o644)
	if err != nil {
		t.Fatal(err)
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		stop    bool
		sdkOps  int
		sdkErrs []error
	)
	stopped := func() bool { mu.Lock(); defer mu.Unlock(); return stop }
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf, got := make([]byte, 256<<10), make([]byte, 256<<10)
		for i := 0; !stopped(); i++ {
			for j := range buf {
				buf[j] = byte(i + j*7)
			}
			err := func() error {
				if _, err := f.WriteAt(buf, 0); err != nil {
					return fmt.Errorf("write %d: %w", i, err)
				}
				if _, err := f.ReadAt(got, 0); err != nil {
					return fmt.Errorf("read %d: %w", i, err)
				}
				if !bytes.Equal(got, buf) {
					return fmt.Errorf("read %d: other bytes than written", i)
				}
				return nil
			}()
			mu.Lock()
			sdkOps++
			if err != nil {
				sdkErrs = append(sdkErrs, err)
			}
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()

	mc := metaClient(t, c.conf)
	keyOf := func(path string) uint32 {
		_, ls := layoutOf(t, mc, path)
		var cp capability.Capability
		if _, err := capability.Decode(ls[0].Cap, &cp); err != nil {
			t.Fatal(err)
		}
		return cp.KeyID
	}
	var seen []uint32
	cliOps := 0
	deadline := time.Now().Add(3*period + time.Minute) // two rotations, and startup, on a loaded machine
	for i := 0; len(seen) < 3 || cliOps < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("keys %v seen in %d put/get rounds by the deadline; want three (two rotations)", seen, cliOps)
		}
		data := randomBytes(t, 64<<10+i)
		path := fmt.Sprintf("/p%d", i%8)
		mustRun(t, c.conf, bytes.NewReader(data), "put", "-", path)
		if r := mustRun(t, c.conf, nil, "get", path, "-"); !bytes.Equal(r.stdout, data) {
			t.Fatalf("get %s: %d bytes, not the %d put", path, len(r.stdout), len(data))
		}
		if k := keyOf(path); !slices.Contains(seen, k) {
			seen = append(seen, k)
			cliOps = 0
			t.Logf("capabilities signed with key %d", k)
		}
		cliOps++
	}
	mu.Lock()
	stop = true
	mu.Unlock()
	wg.Wait()
	if len(sdkErrs) > 0 {
		t.Fatalf("%d of %d writes and reads of the long-lived client failed, first: %v", len(sdkErrs), sdkOps, sdkErrs[0])
	}
	if !slices.IsSorted(seen) || seen[0] != 1 {
		t.Errorf("keys used in order %v, want 1, 2, 3", seen)
	}
	t.Logf("keys %v; %d writes+reads by the long-lived client", seen, sdkOps)

	// Every node knows the current key and the one announced next, and
	// keeps them for a restart.
	cur := seen[len(seen)-1]
	for id, n := range c.nodes {
		eventually(t, 15*time.Second, 100*time.Millisecond, func() (bool, string) {
			raw, err := os.ReadFile(filepath.Join(n.dir, "capkeys.json"))
			if err != nil {
				return false, err.Error()
			}
			var ck metaapi.CapKeys
			if err := json.Unmarshal(raw, &ck); err != nil {
				return false, err.Error()
			}
			return slices.Contains(ck.IDs(), cur) && slices.Contains(ck.IDs(), cur+1),
				fmt.Sprintf("node %v accepts %v; the current key is %d", id, ck.IDs(), cur)
		})
	}
}

// TestAuthRmRevokesCapabilities: a capability meta minted for a principal
// before `sluice auth rm` is refused by the storage nodes within seconds
// (as expired), not for the rest of its lifetime; the admin's are not.
func TestAuthRmRevokesCapabilities(t *testing.T) {
	c := threeNodes(t, nil, nil)
	carol := filepath.Join(c.dir, "carol.conf")
	mustRun(t, c.conf, nil, "auth", "add", "carol", "--conf-out", carol)
	mustRun(t, carol, bytes.NewReader(randomBytes(t, 64<<10)), "put", "-", "/c")
	_, carolLayout := layoutOf(t, metaClient(t, carol), "/c")
	_, adminLayout := layoutOf(t, metaClient(t, c.conf), "/c")
	// stat reads nothing (zero bytes) of the chunk with a capability.
	stat := func(l metaapi.ChunkLayout) (wire.Status, string) {
		r := dialRaw(t, l.Replicas[0].Addr)
		defer r.c.Close()
		h, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: l.Chunk, Cap: l.Cap})
		if err != nil {
			t.Fatal(err)
		}
		r.packet(pkSend, flFirst|flLast, 1, h)
		rep, msg := r.reply(1)
		return rep.Status, msg
	}
	if s, msg := stat(carolLayout[0]); s != wire.StatusOK {
		t.Fatalf("carol's capability before the removal: %v %s", s, msg)
	}

	start := time.Now()
	mustRun(t, c.conf, nil, "auth", "rm", "carol")
	eventually(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		s, msg := stat(carolLayout[0])
		return s == wire.StatusAuth && strings.Contains(msg, "expired: revoked"), fmt.Sprintf("carol's capability: %v %s", s, msg)
	})
	t.Logf("a node refused the removed principal's capability %s after `sluice auth rm` began", time.Since(start).Round(time.Millisecond))
	if s, msg := stat(adminLayout[0]); s != wire.StatusOK {
		t.Fatalf("the admin's capability after carol's removal: %v %s", s, msg)
	}
}

// nodeKeyring is the keyring the storage node with data directory dir
// last heard of from meta (its capkeys.json): tests mint capabilities the
// node accepts with it, as only meta or the node's owner could.
func nodeKeyring(t *testing.T, dir string) *capability.Keyring {
	t.Helper()
	var ck metaapi.CapKeys
	eventually(t, 15*time.Second, 50*time.Millisecond, func() (bool, string) {
		raw, err := os.ReadFile(filepath.Join(dir, "capkeys.json"))
		if err == nil {
			err = json.Unmarshal(raw, &ck)
		}
		return err == nil, fmt.Sprintf("%s: capability keys: %v", dir, err)
	})
	a, err := ck.Accepted()
	if err != nil {
		t.Fatal(err)
	}
	k := capability.NewKeyring()
	if err := k.Set(a); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestNodesHoldNoClusterSecret: a joined node's data directory holds
// neither the cluster secret nor anything an earlier version saved of
// it, and whoever holds the secret (meta's disk, or a node's disk before)
// cannot compute a capability a node accepts.
func TestNodesHoldNoClusterSecret(t *testing.T) {
	c := threeNodes(t, nil, nil)
	data := randomBytes(t, 64<<10)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	raw, err := os.ReadFile(c.secretFile)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := secret.Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	hexSec := strings.TrimSpace(string(raw))
	for id, n := range c.nodes {
		err := filepath.WalkDir(n.dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if d.Name() == "cluster.secret" {
				t.Errorf("node %v: %s", id, p)
			}
			b, err := os.ReadFile(p)
			if err == nil && bytes.Contains(b, []byte(hexSec)) {
				t.Errorf("node %v: %s holds the cluster secret", id, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// A capability under a key derived from the secret (as every key was)
	// is refused for its MAC; the same under the node's real key is not.
	_, layout := layoutOf(t, metaClient(t, c.conf), "/f")
	l := layout[0]
	var n *nodeProc
	for _, p := range c.nodes {
		if p.id == l.Replicas[0].Node {
			n = p
		}
	}
	real := nodeKeyring(t, n.dir)
	stat := func(keys *capability.Keyring) (wire.Status, string) {
		var cp capability.Capability
		if _, err := capability.Decode(l.Cap, &cp); err != nil {
			t.Fatal(err)
		}
		r := dialRaw(t, n.addr)
		defer r.c.Close()
		h, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: l.Chunk, Cap: keys.Mint(&cp)})
		if err != nil {
			t.Fatal(err)
		}
		r.packet(pkSend, flFirst|flLast, 1, h)
		rep, msg := r.reply(1)
		return rep.Status, msg
	}
	if s, msg := stat(real); s != wire.StatusOK {
		t.Fatalf("under the node's own key: %v %s", s, msg)
	}
	for _, id := range real.Accepted().Keys {
		derived := capability.Key{ID: id.ID}
		copy(derived.MAC[:], sec.Derive(secret.PurposeCapability, uint64(id.ID)))
		if s, msg := stat(capability.NewKeyring(derived)); s != wire.StatusAuth || !strings.Contains(msg, "MAC") {
			t.Errorf("under key %d derived from the cluster secret: %v %s, want a MAC refusal", id.ID, s, msg)
		}
	}

	// A node an earlier version joined kept the secret: it is deleted at
	// start, and the node works on.
	n.proc.stop(t, 10*time.Second)
	old := filepath.Join(n.dir, "cluster.secret")
	if err := os.WriteFile(old, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	again := c.startNodeIn(t, "again", n.dir)
	if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after a restart: %v", old, err)
	}
	if !strings.Contains(again.proc.stderrText(), "removed the cluster secret") {
		t.Errorf("no log line of the removal: %s", again.proc.stderrText())
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; !bytes.Equal(got, data) {
		t.Fatal("read back differs after the restart")
	}
}

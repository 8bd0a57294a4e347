package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// mounted is a running `sluice mount`.
type mounted struct {
	dir  string
	proc *proc
}

var reMounted = regexp.MustCompile(`^sluice: mounted at (\S+)$`)

// requireFUSE fails the test where FUSE cannot work: the issue asks for
// real mounts, so a machine without them must not pass silently.
func requireFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("FUSE tests need /dev/fuse: %v", err)
	}
}

// mountAt runs `sluice mount` of the cluster conf names at a fresh
// directory and waits until it is mounted. The mount is detached when the
// test ends, whatever state the process is in.
func mountAt(t *testing.T, conf, name string, extra ...string) *mounted {
	t.Helper()
	requireFUSE(t)
	base := filepath.Dir(filepath.Dir(conf))
	dir := filepath.Join(base, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"mount", dir, "--conf", conf}, extra...)
	p := startDaemon(t, base, "mount-"+name, args...)
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	if r := p.waitReady(t, 20*time.Second); r.Mount != dir {
		t.Errorf("the mount's ready file names %s, want %s", r.Mount, dir)
	}
	p.waitLine(t, reMounted, 5*time.Second)
	return &mounted{dir: dir, proc: p}
}

// fuseCluster starts a 3-node cluster (replicas 3 by default) and mounts
// it.
func fuseCluster(t *testing.T) (*upCluster, *mounted) {
	t.Helper()
	requireFUSE(t)
	c := startUp(t, filepath.Join(baseDir(t), "data"), 3)
	return c, mountAt(t, c.conf, "mnt")
}

// TestFUSEPosixSuite runs go-fuse's POSIX conformance suite (posixtest,
// which includes ports of xfstests cases) on a real mount, each case in a
// fresh directory.
func TestFUSEPosixSuite(t *testing.T) {
	_, m := fuseCluster(t)
	unsupported := map[string]string{
		// Two descriptors of one process never conflict under POSIX
		// record locks; tmpfs and ext4 fail this case too.
		"FcntlFlockLocksFile": "expects locks to conflict within one process, which POSIX does not",
	}
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := unsupported[name]; ok {
				t.Skip(why)
			}
			dir := filepath.Join(m.dir, "posix-"+strings.ToLower(name))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixtest.All[name](t, dir)
		})
	}
}

// TestFUSEUpMount: `sluice up --mount` starts a cluster and mounts it in
// one step; a file written through the mount is what the CLI reads, and
// `sluice umount` ends the mount and the cluster with it.
func TestFUSEUpMount(t *testing.T) {
	requireFUSE(t)
	base := baseDir(t)
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	c := startUp(t, filepath.Join(base, "data"), 3, "--mount", mnt)
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	c.proc.waitLine(t, reMounted, 20*time.Second)
	want := randomBytes(t, 3<<20+17)
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0o644); err != nil {
		t.Fatalf("writing through the mount: %v", err)
	}
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; !bytes.Equal(got, want) {
		t.Fatalf("the CLI reads %d bytes, the mount wrote %d (or different bytes)", len(got), len(want))
	}
	mustRun(t, c.conf, nil, "umount", mnt)
	select {
	case <-c.proc.done:
	case <-time.After(15 * time.Second):
		t.Fatal("sluice up --mount still running 15s after its mount was unmounted")
	}
	if code := c.proc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("sluice up exited %d after the unmount", code)
	}
	if b, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(b), mnt) {
		t.Fatalf("%s is still mounted", mnt)
	}
}

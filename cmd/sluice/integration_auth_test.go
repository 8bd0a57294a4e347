package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// setOwner sets a path's mode and owner as the admin.
func setOwner(t *testing.T, mc *metaapi.Client, path string, mode, uid, gid uint32) {
	t.Helper()
	var ar metaapi.AttrResp
	ctx := context.Background()
	if err := mc.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(path)}, &ar); err != nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	req := metaapi.SetAttrReq{Ino: ar.Attr.Ino, Mode: &mode, UID: &uid, GID: &gid}
	if err := mc.Call(ctx, metaapi.OpSetAttr, req, nil); err != nil {
		t.Fatalf("setattr %s: %v", path, err)
	}
}

// userCmd runs bin as uid:gid with HOME=home.
func userCmd(uid, gid uint32, home string, bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid}}}
	return cmd
}

// TestPrincipalsAsAnAttacker: principals tried as their holders would
// abuse them, on a real cluster, with a real FUSE mount made by an
// unprivileged user with their own principal.
func TestPrincipalsAsAnAttacker(t *testing.T) {
	requireFUSE(t)
	base := baseDir(t)
	c := startUp(t, filepath.Join(base, "data"), 3)
	admin := c.conf
	mc := metaClient(t, admin)
	mustRun(t, admin, strings.NewReader("root's secret\n"), "put", "-", "/secret")
	setOwner(t, mc, "/secret", 0o600, 0, 0)
	mustRun(t, admin, nil, "mkdir", "/home", "/home/alice")
	setOwner(t, mc, "/home/alice", 0o700, 1000, 1000)

	// A principal for uids 2000-2999 run by root on its host claims uid
	// 0: refused. One that squashes root acts as nobody: no access.
	bob := filepath.Join(base, "bob.conf")
	mustRun(t, admin, nil, "auth", "add", "bob", "--uids", "2000-2999", "--conf-out", bob)
	mustFail(t, bob, []string{"may act as uids 2000-2999, not 0"}, "cat", "/secret")
	squashed := filepath.Join(base, "squashed.conf")
	mustRun(t, admin, nil, "auth", "add", "squashed", "--root-squash", "--conf-out", squashed)
	mustFail(t, squashed, []string{"EACCES"}, "cat", "/secret")
	// Administration is the admin's.
	mustFail(t, bob, []string{"not an admin"}, "node", "drain", "1")
	mustFail(t, bob, []string{"not an admin"}, "auth", "add", "mallory", "--admin")
	mustFail(t, squashed, []string{"not an admin"}, "auth", "ls")
	if out := string(mustRun(t, admin, nil, "auth", "ls").stdout); !strings.Contains(out, "bob") || strings.Contains(out, "mallory") {
		t.Fatalf("auth ls:\n%s", out)
	}

	// alice: her own principal, confined to her home, written into her
	// home directory for her.
	home := filepath.Join(base, "alice-home")
	aliceConf := filepath.Join(home, ".config", "sluice", "client.conf")
	mustOK(t, "mkdir", os.Mkdir(home, 0o700))
	mustOK(t, "chown", os.Chown(home, 1000, 1000))
	mustRun(t, admin, nil, "auth", "add", "alice", "--path", "/home/alice", "--uids", "1000", "--conf-out", aliceConf, "--conf-owner", "1000:1000")
	if fi, err := os.Stat(aliceConf); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("alice's client.conf: %v %v", fi.Mode(), err)
	}
	// The binary and the mount point where she can reach them.
	bin := filepath.Join(base, "bin", "sluice")
	mustOK(t, "mkdir", os.MkdirAll(filepath.Dir(bin), 0o755))
	copyFile(t, sluiceBin, bin, 0o755)
	mnt := filepath.Join(base, "alice-mnt")
	mustOK(t, "mkdir", os.Mkdir(mnt, 0o755))
	mustOK(t, "chown", os.Chown(mnt, 1000, 1000))
	letOthersReach(t, mnt)
	letOthersReach(t, bin)

	// Her own config is found without --conf; the operator's is not hers
	// to read.
	if out, err := userCmd(1000, 1000, home, "/bin/cat", admin).CombinedOutput(); err == nil {
		t.Fatalf("alice read the operator's client.conf:\n%s", out)
	}
	if out, err := userCmd(1000, 1000, home, bin, "--conf", admin, "ls", "/").CombinedOutput(); err == nil || !strings.Contains(string(out), "permission denied") {
		t.Fatalf("alice used the operator's client.conf: %v\n%s", err, out)
	}
	if out, err := userCmd(1000, 1000, home, bin, "auth", "whoami").CombinedOutput(); err != nil || !strings.Contains(string(out), "principal alice") {
		t.Fatalf("alice's whoami: %v\n%s", err, out)
	}
	// Outside her path nothing is there.
	if out, err := userCmd(1000, 1000, home, bin, "cat", "/../secret").CombinedOutput(); err == nil || !strings.Contains(string(out), "ENOENT") {
		t.Fatalf("alice reached /secret: %v\n%s", err, out)
	}

	// She mounts it herself (fusermount3), and works in it. Distributions
	// make /dev/fuse usable by every user (0666); some containers do not.
	allowUserFUSE(t)
	mount := userCmd(1000, 1000, home, bin, "mount", mnt)
	stderr, err := os.Create(filepath.Join(base, "alice-mount.stderr"))
	mustOK(t, "create", err)
	defer stderr.Close()
	mount.Stderr = stderr
	pr, pw := io.Pipe()
	mount.Stdout = pw
	mustOK(t, "starting alice's mount", mount.Start())
	t.Cleanup(func() {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		mount.Process.Kill()
		mount.Wait()
	})
	mounted := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		n, _ := io.ReadAtLeast(pr, buf, 1)
		mounted <- string(buf[:n])
		io.Copy(io.Discard, pr)
	}()
	select {
	case line := <-mounted:
		if !strings.Contains(line, "mounted at") {
			t.Fatalf("alice's mount said %q", line)
		}
	case <-time.After(30 * time.Second):
		b, _ := os.ReadFile(stderr.Name())
		t.Fatalf("alice's mount did not come up:\n%s", b)
	}
	if out, err := userCmd(1000, 1000, home, "/bin/sh", "-c", "echo hello > "+mnt+"/notes && cat "+mnt+"/notes").CombinedOutput(); err != nil || string(out) != "hello\n" {
		t.Fatalf("alice writing in her mount: %v\n%s", err, out)
	}
	if got := string(mustRun(t, admin, nil, "cat", "/home/alice/notes").stdout); got != "hello\n" {
		t.Fatalf("the admin reads %q from /home/alice/notes", got)
	}

	// Removed, her mount and her CLI fail within seconds.
	start := time.Now()
	mustRun(t, admin, nil, "auth", "rm", "alice")
	i := 0
	eventually(t, 15*time.Second, 100*time.Millisecond, func() (bool, string) {
		i++
		_, err := os.Stat(filepath.Join(mnt, "probe"+string(rune('a'+i%26))+time.Now().Format("150405.000")))
		return err != nil && !os.IsNotExist(err), "a lookup in alice's mount still answers"
	})
	t.Logf("alice's mount refused %v after `sluice auth rm`", time.Since(start).Round(time.Millisecond))
	if out, err := userCmd(1000, 1000, home, bin, "ls", "/").CombinedOutput(); err == nil || !strings.Contains(string(out), "EAUTH") {
		t.Fatalf("alice's CLI after removal: %v\n%s", err, out)
	}
	if _, err := config.Load(aliceConf); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	mustOK(t, "reading "+from, err)
	mustOK(t, "writing "+to, os.WriteFile(to, b, mode))
}

// allowUserFUSE makes /dev/fuse usable by unprivileged users, as
// distributions' udev rules do, for the length of the test.
func allowUserFUSE(t *testing.T) {
	t.Helper()
	fi, err := os.Stat("/dev/fuse")
	mustOK(t, "stat /dev/fuse", err)
	if mode := fi.Mode().Perm(); mode&0o006 != 0o006 {
		mustOK(t, "chmod /dev/fuse", os.Chmod("/dev/fuse", mode|0o666))
		t.Cleanup(func() { os.Chmod("/dev/fuse", mode) })
	}
}

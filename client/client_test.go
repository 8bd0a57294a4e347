package client_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/cluster"
)

// connect starts an in-process cluster of n nodes and a client of it
// through this package, as a program outside the module would make one
// (from the client.conf meta wrote).
func connect(t *testing.T, n int) *client.Client {
	t.Helper()
	dir := t.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "sluice-pub-"); err == nil {
			dir = d
			t.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: dir, Nodes: n, MetaListen: "127.0.0.1:0", ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl, err := client.NewFromFile(c.ConfPath, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestFileSystemThroughPublicAPI: the namespace, policies and file
// descriptions a program gets through the public API, in the standard
// library's terms (fs.FileInfo, fs.DirEntry).
func TestFileSystemThroughPublicAPI(t *testing.T) {
	cl := connect(t, 3)
	ctx := context.Background()
	if err := cl.MkdirAll(ctx, "/data/logs", 0o750); err != nil {
		t.Fatal(err)
	}
	if err := cl.SetPolicy(ctx, "/data", client.Policy{Replicas: 2, Strategy: "tree"}); err != nil {
		t.Fatal(err)
	}
	if pol, inherited, err := cl.GetPolicy(ctx, "/data"); err != nil || inherited || pol.Replicas != 2 || pol.Strategy != "tree" || pol.EC != nil {
		t.Fatalf("GetPolicy(/data) = %v, inherited %v, %v", pol, inherited, err)
	}
	if pol, inherited, err := cl.GetPolicy(ctx, "/data/logs"); err != nil || !inherited || pol.String() != "replicas=2 strategy=tree" {
		t.Fatalf("GetPolicy(/data/logs) = %v, inherited %v, %v", pol, inherited, err)
	}
	if err := cl.SetPolicy(ctx, "/data/logs", client.Policy{EC: &client.ErasureCode{Data: 2, Parity: 1}}); err != nil {
		t.Fatal(err)
	}
	if pol, _, err := cl.GetPolicy(ctx, "/data/logs"); err != nil || pol.EC == nil || pol.EC.Data != 2 || pol.EC.Parity != 1 || pol.EC.Cell <= 0 {
		t.Fatalf("GetPolicy(/data/logs) = %v, %v", pol, err)
	}
	for _, bad := range []client.Policy{{Replicas: 2, Strategy: "carrier-pigeon"}, {Replicas: 0}, {Replicas: 2, EC: &client.ErasureCode{Data: 2, Parity: 1}}} {
		var pe *client.PathError
		if err := cl.SetPolicy(ctx, "/data", bad); err == nil || !errors.As(err, &pe) || pe.Path != "/data" {
			t.Errorf("SetPolicy(%+v) = %v, want a PathError naming /data", bad, err)
		}
	}

	payload := bytes.Repeat([]byte("sluice "), 300_000) // crosses chunks
	if _, err := cl.Put(ctx, "/data/a.bin", bytes.NewReader(payload), 0o640); err != nil {
		t.Fatal(err)
	}
	fi, err := cl.Stat(ctx, "/data/a.bin")
	if err != nil {
		t.Fatal(err)
	}
	sys, ok := fi.Sys().(*client.Sys)
	if fi.Name() != "a.bin" || fi.Size() != int64(len(payload)) || fi.IsDir() || fi.Mode() != 0o640 || !fi.Mode().IsRegular() ||
		fi.ModTime().IsZero() || !ok || sys.Ino == 0 || sys.Nlink != 1 {
		t.Fatalf("Stat = %s %d %v %v %v %+v", fi.Name(), fi.Size(), fi.Mode(), fi.IsDir(), fi.ModTime(), fi.Sys())
	}
	if err := cl.Symlink(ctx, "a.bin", "/data/link"); err != nil {
		t.Fatal(err)
	}
	if li, err := cl.Lstat(ctx, "/data/link"); err != nil || li.Mode()&fs.ModeSymlink == 0 || li.Sys().(*client.Sys).Target != "a.bin" {
		t.Fatalf("Lstat(link) = %v, %v", li, err)
	}
	if si, err := cl.Stat(ctx, "/data/link"); err != nil || si.Size() != int64(len(payload)) || si.Name() != "link" {
		t.Fatalf("Stat(link) follows it: %v, %v", si, err)
	}

	ents, err := cl.ReadDir(ctx, "/data")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"a.bin", "link", "logs"}; !slices.Equal(names, want) {
		t.Fatalf("ReadDir = %v, want %v", names, want)
	}
	if !ents[2].IsDir() || ents[2].Type() != fs.ModeDir || ents[1].Type() != fs.ModeSymlink {
		t.Fatalf("entry types: %v %v", ents[2].Type(), ents[1].Type())
	}
	if info, err := ents[2].Info(); err != nil || !info.IsDir() || info.Mode().Perm() != 0o750 || info.Name() != "logs" {
		t.Fatalf("Info(logs) = %v, %v", info, err)
	}

	f, err := cl.Open(ctx, "/data/a.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("PATCH"), 7); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 12)
	if _, err := f.ReadAt(got, 7); err != nil || string(got) != "PATCHe sluic" {
		t.Fatalf("ReadAt after WriteAt = %q, %v", got, err)
	}
	if err := f.Truncate(ctx, 10); err != nil || f.Size() != 10 || f.Stat().Size() != 10 {
		t.Fatalf("Truncate: %v, size %d", err, f.Size())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	if _, err := cl.Stat(ctx, "/data/none"); !client.IsNotExist(err) {
		t.Fatalf("Stat(missing) = %v", err)
	}
	if err := cl.Mkdir(ctx, "/data/logs", 0o700); !client.IsExist(err) {
		t.Fatalf("Mkdir(existing) = %v", err)
	}
	if f, err := cl.Create(ctx, "/data/a.bin", 0o600); err != nil || f.Size() != 0 {
		t.Fatalf("Create(existing) truncates: %v", err)
	}
	if err := cl.Rename(ctx, "/data/a.bin", "/data/b.bin"); err != nil {
		t.Fatal(err)
	}
	if err := cl.RemoveAll(ctx, "/data"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReadDir(ctx, "/data"); !client.IsNotExist(err) || !strings.Contains(err.Error(), "/data") {
		t.Fatalf("ReadDir(removed) = %v", err)
	}
}

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSDKExample: examples/sdk, a module of its own that requires this
// one, builds against the SDK (it could not if the SDK's API made it name
// an internal package) and, run against a cluster with the client.conf
// `sluice up` wrote, stores, reads and patches a file that `sluice get`
// then sees.
func TestSDKExample(t *testing.T) {
	base := baseDir(t)
	bin := filepath.Join(base, "sdk-example")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", "examples", "sdk")
	// Its own go.mod and go.sum, as an outside module builds; readonly
	// so the test never rewrites them.
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building examples/sdk: %v\n%s", err, out)
	}

	c := startUp(t, filepath.Join(base, "data"), 1)
	want := randomBytes(t, 3<<20+5)
	src := filepath.Join(base, "src")
	if err := os.WriteFile(src, want, 0o644); err != nil {
		t.Fatal(err)
	}
	run := exec.CommandContext(ctx, bin, "--conf", c.conf, "--path", "/sdk.bin", src)
	var stderr bytes.Buffer
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("sdk example: %v\n%s", err, stderr.String())
	}
	if !strings.HasPrefix(string(out), "put 3145733 bytes at /sdk.bin") {
		t.Errorf("sdk example printed %q", out)
	}
	copy(want[len(want)/2:], "SDK!")
	dst := filepath.Join(base, "dst")
	mustRun(t, c.conf, nil, "get", "/sdk.bin", dst)
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("sluice get of what the example wrote: %d bytes (%v), want %d with its patch", len(got), err, len(want))
	}
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// TestNFSWriteBehindReadAhead drives the gateway's write-behind and
// read-ahead (sdk.Buffered) with libnfs's nfs-cp, which sends one
// request at a time, UNSTABLE WRITEs and a COMMIT at close: several
// files copied in and out at once through a gateway whose buffer memory
// is smaller than they are together (some writes go through, some reads
// are not read ahead). What the CLI reads is what was copied in; what
// nfs-cp copies out is what was stored; a file written over again (in
// place, by Sluice's nfs-put) reads as its new content, not as what was
// read ahead of the old.
func TestNFSWriteBehindReadAhead(t *testing.T) {
	requireLibnfs(t)
	c := startUp(t, filepath.Join(baseDir(t), "data"), 3)
	addr, _ := nfsGateway(t, c.conf, "--buffer-mib", "40", "--cache-mib", "0")
	local := filepath.Join(baseDir(t), "local")
	if err := os.MkdirAll(local, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c.conf, nil, "mkdir", "-p", "/wb")
	chmodPath(t, c.conf, "/wb", 0o777)

	const files = 3
	src := make([][]byte, files)
	for i := range src {
		src[i] = randomBytes(t, 24<<20+i*4097+1)
		if err := os.WriteFile(filepath.Join(local, fmt.Sprint("src", i)), src[i], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	parallel := func(what string, args func(i int) []string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, files)
		for i := range files {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := args(i)
				if out, err := exec.Command(a[0], a[1:]...).CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("%v: %v: %s", a, err, tail(string(out), 10))
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	remote := func(i int) string { return nfsURL(addr, fmt.Sprintf("/wb/f%d", i)) }
	parallel("copying in", func(i int) []string {
		return []string{"nfs-cp", filepath.Join(local, fmt.Sprint("src", i)), remote(i)}
	})
	for i := range files {
		if got := mustRun(t, c.conf, nil, "cat", fmt.Sprintf("/wb/f%d", i)).stdout; !bytes.Equal(got, src[i]) {
			t.Fatalf("file %d copied in over NFS: the CLI reads %d bytes (want %d) that differ", i, len(got), len(src[i]))
		}
	}
	copyOut := func(round int) {
		t.Helper()
		parallel("copying out", func(i int) []string {
			return []string{"nfs-cp", remote(i), filepath.Join(local, fmt.Sprintf("dst%d-%d", round, i))}
		})
		for i := range files {
			got, err := os.ReadFile(filepath.Join(local, fmt.Sprintf("dst%d-%d", round, i)))
			if err != nil || !bytes.Equal(got, src[i]) {
				t.Fatalf("round %d: file %d copied out over NFS: %d bytes (want %d) that differ (%v)", round, i, len(got), len(src[i]), err)
			}
		}
	}
	copyOut(0)
	// New content under the same names, through the gateway (the files'
	// blocks read ahead must not be served), then out again.
	for i := range src {
		for j := range src[i] {
			src[i][j] ^= 0x5a
		}
		if err := os.WriteFile(filepath.Join(local, fmt.Sprint("src", i)), src[i], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range files {
		// Sluice's NFS client: CREATE UNCHECKED truncates the same file.
		mustRun(t, c.conf, nil, "nfs-put", "--server", addr, filepath.Join(local, fmt.Sprint("src", i)), fmt.Sprintf("/wb/f%d", i))
	}
	copyOut(1)
	for i := range files {
		if got := mustRun(t, c.conf, nil, "cat", fmt.Sprintf("/wb/f%d", i)).stdout; !bytes.Equal(got, src[i]) {
			t.Fatalf("file %d copied over: the CLI reads %d bytes that differ", i, len(got))
		}
	}
}

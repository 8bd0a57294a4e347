package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestFUSELostWriteReportedToEachDescriptor: buffered writes cannot be
// sent once the nodes' file system is full. Another descriptor of the
// file, on the same mount, fsyncs first and is told; the writer's own
// close must still fail, not report success over writes that were lost
// (as Linux reports a writeback error to every descriptor open at the
// time).
func TestFUSELostWriteReportedToEachDescriptor(t *testing.T) {
	requireFUSE(t)
	data := filepath.Join(baseDir(t), "data")
	mountTmpfs(t, data, 256<<20)
	c := startUp(t, data, 3)
	m := mountAt(t, c.conf, "mnt")
	p := filepath.Join(m.dir, "lost")
	w, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	chunk := bytes.Repeat([]byte("z"), 128<<10)
	for i := 0; i < 8; i++ {
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	fill(t, data)
	rerr := r.Sync()
	werr := w.Close()
	t.Logf("other descriptor's fsync: %v; writer's close: %v", rerr, werr)
	if rerr == nil {
		t.Fatal("the buffered writes were sent to a full file system")
	}
	if werr == nil {
		t.Fatal("the writer's close succeeded although its writes were lost")
	}
}

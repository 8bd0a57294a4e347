package meta

import (
	"bytes"
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/metabackup"
)

// A second meta started by mistake on a data directory a meta serves
// is refused (meta.db is locked), and must leave that meta's work
// alone: it used to remove the checkpoint of a backup being sent
// before it even tried the lock, cutting the backup off.
func TestBackupSurvivesSecondStart(t *testing.T) {
	f := newFixture(t, onDisk)
	f.mk("/", "a", metaapi.TypeFile, 0o644, root)
	write, err := f.s.Backup()
	if err != nil {
		t.Fatal(err)
	}
	if s2, err := Open(f.opt); err == nil {
		s2.Close()
		t.Fatal("a second meta opened a data directory a meta serves")
	}
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		t.Fatalf("backup cut off by a second meta's start: %v", err)
	}
	if _, err := metabackup.Open(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		t.Fatal(err)
	}
}

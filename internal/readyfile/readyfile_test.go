package readyfile

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestWriteRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ready.json")
	if _, err := Read(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("before Write: %v, want not exist", err)
	}
	in := Info{Meta: "127.0.0.1:7000", Conf: "/x/client.conf", Nodes: []Node{{ID: "n1", Addr: "127.0.0.1:7001"}}}
	if err := Write(p, in); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	in.PID = os.Getpid()
	if !reflect.DeepEqual(got, in) {
		t.Errorf("read %+v, wrote %+v", got, in)
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only the ready file (no temporary left)", len(ents))
	}
}

func TestReadRejects(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("{not json"), 0o644)
	if _, err := Read(bad); err == nil || !strings.Contains(err.Error(), "parsing") {
		t.Errorf("garbage: %v", err)
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(`{"meta":"`+strings.Repeat("a", MaxBytes)+`"}`), 0o644)
	if _, err := Read(big); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized: %v", err)
	}
}

func TestWriteUnwritableDir(t *testing.T) {
	if err := Write(filepath.Join(t.TempDir(), "no", "such", "dir", "r.json"), Info{}); err == nil {
		t.Error("Write into a missing directory succeeded")
	}
}

package sdk

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

// TestNewFromFileMissing: a client.conf that is not there is an error the
// caller can recognise, naming the file; nothing is connected.
func TestNewFromFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.conf")
	c, err := NewFromFile(path, Options{})
	if c != nil || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("NewFromFile(%s) = %v, %v; want nil and a not-exist error", path, c, err)
	}
}

//go:build !linux

package store

import (
	"errors"
	"os"
)

// fdatasync falls back to a full fsync where fdatasync is not available.
func fdatasync(f *os.File) error { return f.Sync() }

func fsCapacity(dir string) (int64, error) { return 0, errors.ErrUnsupported }

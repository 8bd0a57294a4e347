//go:build !linux

package store

import (
	"errors"
	"io/fs"
	"os"
)

// fdatasync falls back to a full fsync where fdatasync is not available.
func fdatasync(f *os.File) error { return f.Sync() }

func fsSpace(dir string) (total, avail int64, err error) { return 0, 0, errors.ErrUnsupported }

func allocate(f *os.File, size int64) error { return writeZeros(f, 0, size) }

func fsIdentity(dir string) (dev, fsid string, ok bool) { return "", "", false }

func allocatedBytes(fi fs.FileInfo) int64 { return fi.Size() }

func deviceOf(fs.FileInfo) (uint64, bool) { return 0, false }

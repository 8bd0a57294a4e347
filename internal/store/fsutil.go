package store

import (
	"errors"
	"io"
	"os"
)

// syncDir makes the entries of directory dir durable: needed after a file
// is created in it, or the file may vanish in a crash even if its data was
// synced.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// readFull reads len(p) bytes at off. Bytes past the end of the file read
// as zeros: chunk files are sparse and may be shorter than the committed
// length when the tail is a hole.
func readFull(f *os.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if errors.Is(err, io.EOF) {
		clear(p[n:])
		return nil
	}
	return err
}

// copyRange copies n bytes from src at srcOff to dst at dstOff. It moves
// both files' offsets, so the caller must own both descriptors (Place and
// readers use positional I/O, so this never disturbs them). Going through
// (*os.File).ReadFrom lets the kernel copy (copy_file_range) without a trip
// through user space; buf is the fallback when it cannot.
func copyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n int64, buf []byte) error {
	if _, err := src.Seek(srcOff, io.SeekStart); err != nil {
		return err
	}
	if _, err := dst.Seek(dstOff, io.SeekStart); err != nil {
		return err
	}
	got, err := dst.ReadFrom(&io.LimitedReader{R: src, N: n})
	if err != nil {
		return err
	}
	if got != n {
		// Short source: finish by hand to report the real error.
		return copyRangeBuf(dst, dstOff+got, src, srcOff+got, n-got, buf)
	}
	return nil
}

// copyRangeBuf copies through buf with positional I/O.
func copyRangeBuf(dst *os.File, dstOff int64, src *os.File, srcOff, n int64, buf []byte) error {
	for n > 0 {
		p := buf[:min(int64(len(buf)), n)]
		if _, err := src.ReadAt(p, srcOff); err != nil {
			return err
		}
		if _, err := dst.WriteAt(p, dstOff); err != nil {
			return err
		}
		srcOff += int64(len(p))
		dstOff += int64(len(p))
		n -= int64(len(p))
	}
	return nil
}

// removeFile removes path; already gone is fine.
func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

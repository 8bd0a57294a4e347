package client

import (
	"context"
	"io/fs"

	"github.com/sluicefs/sluice/internal/sdk"
)

// File is an open file, read and written in place. Its methods are safe
// for concurrent use; a write is durable on every replica when it
// returns.
type File struct {
	f    *sdk.File
	name string
}

// ReadAt reads len(p) bytes at off (io.ReaderAt); past the end it
// returns what there is and io.EOF.
func (f *File) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }

// ReadAtContext is ReadAt bounded by ctx.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return f.f.ReadAtContext(ctx, p, off)
}

// WriteAt writes p at off (io.WriterAt), growing the file if it ends
// past it.
func (f *File) WriteAt(p []byte, off int64) (int, error) { return f.f.WriteAt(p, off) }

// WriteAtContext is WriteAt bounded by ctx.
func (f *File) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return f.f.WriteAtContext(ctx, p, off)
}

// Truncate sets the file's size.
func (f *File) Truncate(ctx context.Context, size int64) error { return f.f.Truncate(ctx, size) }

// Size is the file's size as this handle last saw it.
func (f *File) Size() int64 { return f.f.Size() }

// Stat describes the file as this handle last saw it.
func (f *File) Stat() fs.FileInfo { return newInfo(f.name, f.f.Attr()) }

// Close releases the handle.
func (f *File) Close() error { return f.f.Close() }

package client

import (
	"context"
	"errors"

	"github.com/sluicefs/sluice/internal/sdk"
)

// BufferedFile is a File with write-behind and sequential read-ahead:
// the file layer the FUSE mount and the NFS gateway use. Writes that
// continue one another are gathered into large writes sent in the
// background (one on its way while the next fills); a read that
// continues the previous one starts fetching what follows. A write is
// durable only once Flush or Close returns: a background write's failure
// is returned by the next WriteAt, Flush or Close, never dropped. Reads
// see every write made through it. Safe for concurrent use.
type BufferedFile struct {
	f *File
	b *sdk.Buffered
}

// BufferOptions configure a BufferedFile.
type BufferOptions struct {
	// WriteBuffer is how many bytes of sequential writes go as one
	// write (default 16 MiB; negative: none, every write goes through).
	WriteBuffer int
	// ReadAhead is how far a sequential reader is read ahead (default
	// 16 MiB; negative: none).
	ReadAhead int
	// Memory bounds what the files sharing it buffer and read ahead
	// (nil: a bound for this file alone); past it writes go through and
	// reads are not read ahead.
	Memory *Memory
}

// Memory is a bound on the buffers of many BufferedFiles.
type Memory struct{ b *sdk.Budget }

// NewMemory returns a bound of n bytes.
func NewMemory(n int64) *Memory { return &Memory{sdk.NewBudget(n)} }

// Buffered returns f with write-behind and read-ahead. Use the
// BufferedFile, not f, from then on (f's own writes bypass the buffers).
func (f *File) Buffered(opts BufferOptions) *BufferedFile {
	o := sdk.BufferOptions{WriteBuffer: opts.WriteBuffer, ReadAhead: opts.ReadAhead}
	if opts.Memory != nil {
		o.Budget = opts.Memory.b
	}
	return &BufferedFile{f: f, b: sdk.NewBuffered(f.f, o)}
}

// ReadAt reads len(p) bytes at off (io.ReaderAt); past the end it
// returns what there is and io.EOF.
func (b *BufferedFile) ReadAt(p []byte, off int64) (int, error) {
	return b.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt bounded by ctx.
func (b *BufferedFile) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return b.b.ReadAtContext(ctx, p, off)
}

// WriteAt writes p at off (io.WriterAt), buffered or through.
func (b *BufferedFile) WriteAt(p []byte, off int64) (int, error) {
	return b.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt bounded by ctx (for what goes through; a
// background write has its own bound).
func (b *BufferedFile) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return b.b.WriteAtContext(ctx, p, off)
}

// Flush makes every write made so far durable on every replica.
func (b *BufferedFile) Flush(ctx context.Context) error { return b.b.Flush(ctx) }

// Size is the file's size including the writes not yet flushed.
func (b *BufferedFile) Size() int64 {
	end, _ := b.b.Buffered()
	return max(end, b.f.Size())
}

// Close flushes, gives the buffers back and releases the file.
func (b *BufferedFile) Close() error {
	err := b.b.Close(context.Background())
	return errors.Join(err, b.f.Close())
}

// Command sluice-sdk-example is a program outside the Sluice module that
// uses its SDK, package client: it connects with a client.conf, stores a
// local file with Put, reads it back with Get, then changes a few bytes
// in place with Open and WriteAt and reads them back with ReadAt.
//
//	go run . --conf sluice-data/client.conf --path /example.bin ./some-file
//
// It is built by the Sluice tests (cmd/sluice, TestSDKExample), so the
// SDK stays usable from another module.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluicefs/sluice/client"
)

func main() {
	conf := flag.String("conf", "sluice-data/client.conf", "the cluster's client.conf")
	path := flag.String("path", "/sdk-example", "where to store the file in Sluice")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: sluice-sdk-example [--conf client.conf] [--path /name] local-file")
		os.Exit(2)
	}
	if err := run(*conf, *path, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-sdk-example:", err)
		os.Exit(1)
	}
}

func run(conf, path, local string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	c, err := client.NewFromFile(conf, client.Options{})
	if err != nil {
		return err
	}
	defer c.Close()

	data, err := os.ReadFile(local)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return fmt.Errorf("%s is empty: nothing to patch", local)
	}

	// Put stores the whole file atomically: readers see the old content
	// or all of the new.
	if _, err := c.Put(ctx, path, bytes.NewReader(data), 0o644); err != nil {
		return err
	}
	var got bytes.Buffer
	if _, err := c.Get(ctx, path, &got); err != nil {
		return err
	}
	if !bytes.Equal(got.Bytes(), data) {
		return fmt.Errorf("get %s: read back %d bytes that differ from the %d put", path, got.Len(), len(data))
	}

	// Stat describes it as the standard library does (io/fs.FileInfo).
	fi, err := c.Stat(ctx, path)
	if err != nil {
		return err
	}
	if fi.Size() != int64(len(data)) || !fi.Mode().IsRegular() {
		return fmt.Errorf("stat %s: %d bytes, mode %v; want %d bytes, a regular file", path, fi.Size(), fi.Mode(), len(data))
	}

	// Open gives random access: WriteAt is durable on every replica when
	// it returns, ReadAt verifies what it reads against the checksums.
	f, err := c.Open(ctx, path)
	if err != nil {
		return err
	}
	off := int64(len(data)) / 2
	if err := patch(f, off, []byte("SDK!")); err != nil {
		f.Close()
		return fmt.Errorf("patching %s: %w", path, err)
	}
	fmt.Printf("put %d bytes at %s, got them back, patched offset %d (size now %d)\n", len(data), path, off, f.Size())
	// Close releases the handle; its error is checked as for any file.
	return f.Close()
}

// patch writes p at off in f and reads it back.
func patch(f *client.File, off int64, p []byte) error {
	if _, err := f.WriteAt(p, off); err != nil {
		return err
	}
	back := make([]byte, len(p))
	if _, err := f.ReadAt(back, off); err != nil {
		return err
	}
	if !bytes.Equal(back, p) {
		return fmt.Errorf("read %q at %d, wrote %q", back, off, p)
	}
	return nil
}

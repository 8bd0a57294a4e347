// Package metabackup is the file format of a meta backup and its
// restore: everything a meta data directory needs to serve the same
// cluster elsewhere (a pebble checkpoint of meta.db, the cluster CA,
// cluster.secret, credential.key), in one file that says what it is and
// detects its own truncation or corruption.
//
// A backup file is
//
//	"sluice-meta-backup v1\n"       magic and format version
//	a tar stream                     first entry header.json (Header), then the files
//	32 bytes                         SHA-256 of everything before them
//
// Writing streams (bounded memory, any size); reading checks the whole
// file's checksum before it trusts a byte of it.
package metabackup

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"path"
	"strconv"
	"strings"
	"time"
)

// Magic starts every backup; the format version follows it.
const Magic = "sluice-meta-backup v"

// Version is the format this build writes and reads.
const Version = 1

// headerName is the first entry: the Header as JSON.
const headerName = "header.json"

// maxHeader bounds header.json.
const maxHeader = 64 << 10

// Header says what a backup is of.
type Header struct {
	// Cluster is the fingerprint of the cluster CA (pki.Fingerprint):
	// the cluster's identity, which a restore compares with a data
	// directory's.
	Cluster string    `json:"cluster"`
	Created time.Time `json:"created"`
	// Meta is the address meta served at when it was taken.
	Meta string `json:"meta,omitempty"`
	// Schema is meta.db's schema version.
	Schema string `json:"schema,omitempty"`
}

// Writer writes a backup.
type Writer struct {
	w   io.Writer // the destination, through the hash
	sum hash.Hash
	dst io.Writer
	tw  *tar.Writer
}

// NewWriter starts a backup with header h on dst.
func NewWriter(dst io.Writer, h Header) (*Writer, error) {
	sum := sha256.New()
	w := &Writer{w: io.MultiWriter(dst, sum), sum: sum, dst: dst}
	if _, err := io.WriteString(w.w, Magic+strconv.Itoa(Version)+"\n"); err != nil {
		return nil, err
	}
	w.tw = tar.NewWriter(w.w)
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	if err := w.Add(headerName, int64(len(hb)), bytes.NewReader(hb)); err != nil {
		return nil, err
	}
	return w, nil
}

// Add adds a file of size bytes read from r, named name (slash
// separated, relative).
func (w *Writer) Add(name string, size int64, r io.Reader) error {
	if err := checkName(name); err != nil {
		return err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, Format: tar.FormatPAX}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("backup: %s: %w", name, err)
	}
	if n, err := io.Copy(w.tw, io.LimitReader(r, size)); err != nil {
		return fmt.Errorf("backup: %s: %w", name, err)
	} else if n != size {
		return fmt.Errorf("backup: %s: %d bytes, not %d (did it change?)", name, n, size)
	}
	return nil
}

// Close ends the archive and writes the checksum.
func (w *Writer) Close() error {
	if err := w.tw.Close(); err != nil {
		return err
	}
	_, err := w.dst.Write(w.sum.Sum(nil))
	return err
}

// checkName accepts a clean relative slash path: what a restore may
// create under its directory.
func checkName(name string) error {
	if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == "." || strings.HasPrefix(name, "../") || name == ".." || strings.Contains(name, "\\") {
		return fmt.Errorf("backup: bad file name %q", name)
	}
	return nil
}

// ErrNotBackup, ErrCorrupt and ErrVersion are what a file that is no
// usable backup is; errors wrap one of them.
var (
	ErrNotBackup = errors.New("not a Sluice meta backup")
	ErrCorrupt   = errors.New("the backup is truncated or corrupted (its checksum does not match)")
	ErrVersion   = errors.New("backup format version not understood")
)

// Archive is a backup whose checksum has been verified.
type Archive struct {
	Header Header
	body   *io.SectionReader // the tar stream
}

// Open verifies the backup in r (size bytes): magic, version and the
// checksum over all of it, reading it once.
func Open(r io.ReaderAt, size int64) (*Archive, error) {
	head := make([]byte, len(Magic)+12)
	n, _ := r.ReadAt(head, 0)
	head = head[:n]
	if !bytes.HasPrefix(head, []byte(Magic)) {
		return nil, ErrNotBackup
	}
	nl := bytes.IndexByte(head, '\n')
	if nl < 0 {
		return nil, ErrNotBackup
	}
	v, err := strconv.Atoi(string(head[len(Magic):nl]))
	if err != nil {
		return nil, ErrNotBackup
	}
	if v != Version {
		return nil, fmt.Errorf("%w: the file is format %d, this build reads %d", ErrVersion, v, Version)
	}
	start := int64(nl + 1)
	if size < start+sha256.Size {
		return nil, ErrCorrupt
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(r, 0, size-sha256.Size)); err != nil {
		return nil, fmt.Errorf("reading the backup: %w", err)
	}
	want := make([]byte, sha256.Size)
	if _, err := r.ReadAt(want, size-sha256.Size); err != nil {
		return nil, fmt.Errorf("reading the backup: %w", err)
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return nil, ErrCorrupt
	}
	a := &Archive{body: io.NewSectionReader(r, start, size-sha256.Size-start)}
	tr := tar.NewReader(a.body)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != headerName || hdr.Size > maxHeader {
		return nil, fmt.Errorf("%w: no header (%v)", ErrNotBackup, err)
	}
	if err := json.NewDecoder(io.LimitReader(tr, maxHeader)).Decode(&a.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrNotBackup, err)
	}
	if a.Header.Cluster == "" {
		return nil, fmt.Errorf("%w: the header names no cluster", ErrNotBackup)
	}
	return a, nil
}

// Walk calls f for each file after the header, with its name and
// contents.
func (a *Archive) Walk(f func(name string, size int64, r io.Reader) error) error {
	if _, err := a.body.Seek(0, io.SeekStart); err != nil {
		return err
	}
	tr := tar.NewReader(a.body)
	if _, err := tr.Next(); err != nil { // the header
		return err
	}
	// Files hold no more than the archive: a sparse entry (GNU.sparse
	// PAX records, which archive/tar expands) could otherwise declare
	// any size and have a restore write zeros until the disk is full.
	left := a.body.Size()
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrNotBackup, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return fmt.Errorf("%w: entry %q is not a regular file", ErrNotBackup, hdr.Name)
		}
		if err := checkName(hdr.Name); err != nil {
			return fmt.Errorf("%w: %v", ErrNotBackup, err)
		}
		if hdr.Size < 0 || hdr.Size > left {
			return fmt.Errorf("%w: entry %q of %d bytes, more than the archive holds", ErrNotBackup, hdr.Name, hdr.Size)
		}
		left -= hdr.Size
		if err := f(hdr.Name, hdr.Size, tr); err != nil {
			return err
		}
	}
}

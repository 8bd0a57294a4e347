package metabackup

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/pki"
)

// sealed wraps a tar stream that body writes (after header.json) in the
// backup format with a valid checksum: what anyone can craft. body may
// write raw blocks to buf between entries (after tw.Flush).
func sealed(t *testing.T, cluster string, body func(buf *bytes.Buffer, tw *tar.Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString(Magic + strconv.Itoa(Version) + "\n")
	tw := tar.NewWriter(&buf)
	hb, _ := json.Marshal(Header{Cluster: cluster, Created: time.Unix(1700000000, 0).UTC()})
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: headerName, Size: int64(len(hb)), Mode: 0o600, Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	tw.Write(hb)
	body(&buf, tw)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return append(buf.Bytes(), sum[:]...)
}

// paxBlocks is a PAX extended header entry ('x') holding recs, which
// archive/tar's writer will not write for GNU.sparse records: its block
// is made as a regular entry's, then retyped and checksummed again.
func paxBlocks(t *testing.T, recs map[string]string) []byte {
	t.Helper()
	var body []byte
	for k, v := range recs {
		rec := " " + k + "=" + v + "\n"
		n := len(rec)
		for len(strconv.Itoa(n))+len(rec) != n {
			n = len(strconv.Itoa(n)) + len(rec)
		}
		body = append(body, strconv.Itoa(n)+rec...)
	}
	var blk bytes.Buffer
	w := tar.NewWriter(&blk)
	if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "PaxHeaders/x", Size: int64(len(body)), Mode: 0o600, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	w.Write(body)
	w.Flush()
	raw := blk.Bytes() // the header block, then the body padded to a block
	raw[156] = tar.TypeXHeader
	copy(raw[148:156], "        ")
	sum := 0
	for _, c := range raw[:512] {
		sum += int(c)
	}
	copy(raw[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return raw
}

// A crafted backup of a few kilobytes must not make a restore write
// far more than it holds: a PAX sparse entry (GNU.sparse.*) reads back
// as a file of any declared size, all holes, which a restore would
// write out as zeros until the disk is full.
func TestSparseEntryRefused(t *testing.T) {
	const declared = 256 << 20 // small enough not to fill a test disk
	b := sealed(t, "sha256:aa", func(buf *bytes.Buffer, tw *tar.Writer) {
		for _, n := range []string{"ca.crt", "cluster.secret"} {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Size: 1, Mode: 0o600, Format: tar.FormatPAX})
			tw.Write([]byte("x"))
		}
		tw.Flush()
		buf.Write(paxBlocks(t, map[string]string{
			"GNU.sparse.major": "0", "GNU.sparse.minor": "1",
			"GNU.sparse.size": strconv.Itoa(declared), "GNU.sparse.numblocks": "1", "GNU.sparse.map": "0,0",
		}))
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "meta.db/000002.log", Size: 0, Mode: 0o600, Format: tar.FormatUSTAR}); err != nil {
			t.Fatal(err)
		}
	})
	if len(b) > 64<<10 {
		t.Fatalf("crafted backup of %d bytes", len(b))
	}
	a, err := Open(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var written int64
	err = a.Walk(func(name string, size int64, r io.Reader) error {
		n, err := io.Copy(io.Discard, io.LimitReader(r, size))
		written += n
		return err
	})
	if err == nil {
		t.Errorf("a backup of %d bytes walked as %d bytes of files: want it refused", len(b), written)
	}

	dir := filepath.Join(t.TempDir(), "meta")
	file := filepath.Join(t.TempDir(), "crafted.backup")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(file, dir, RestoreOptions{}); err == nil {
		st, _ := os.Stat(filepath.Join(dir, "meta.db", "000002.log"))
		t.Errorf("restore of a %d-byte backup succeeded and wrote a file of %d bytes", len(b), st.Size())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("restore refused but %s exists (%v)", dir, err)
	}
}

// The cluster a backup claims (header.json, covered by a checksum that
// anyone can recompute) must be the one whose CA it carries: the
// "another cluster" refusal goes by the header, so a backup claiming
// cluster A while carrying B's keys would, with --force, replace A's
// meta with B's.
func TestHeaderMustNameItsCA(t *testing.T) {
	tmp := t.TempDir()
	os.Mkdir(filepath.Join(tmp, "ours"), 0o700)
	os.Mkdir(filepath.Join(tmp, "theirs"), 0o700)
	ours, err := pki.LoadOrCreateCA(filepath.Join(tmp, "ours"))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := pki.LoadOrCreateCA(filepath.Join(tmp, "theirs"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"ca.crt": string(theirs.CertPEM), "meta.db/LOG": "x"}
	b := backupOf(t, pki.Fingerprint(ours.Cert), files, "ca.crt", "meta.db/LOG")
	file := filepath.Join(tmp, "b")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "ours")
	before := tree(t, dir)
	if _, err := Restore(file, dir, RestoreOptions{Force: true}); err == nil {
		t.Errorf("a backup claiming cluster %s but carrying the CA of %s replaced that cluster's meta",
			pki.Fingerprint(ours.Cert), pki.Fingerprint(theirs.Cert))
	}
	if after := tree(t, dir); after != before {
		t.Errorf("refused restore changed %s", dir)
	}
}

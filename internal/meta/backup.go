package meta

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/metabackup"
	"github.com/sluicefs/sluice/internal/pki"
)

// Backups: a consistent copy of meta's state taken while it serves. The
// database is a pebble checkpoint (hard links to its immutable tables
// and a copy of the log up to one point, made in a moment), taken under
// the data directory and streamed with the key files as one
// metabackup file; the checkpoint is removed once sent.

// BackupFiles are the data directory's files a backup carries besides
// meta.db (a directory: "meta.db/"). client.conf is not among them:
// meta writes it at every start, for the address it then serves at.
var BackupFiles = []string{SecretFile, CredKeyFile, pki.CACertFile, pki.CAKeyFile, DBDir + "/"}

// checkpointPrefix names checkpoints in the data directory; one left by
// a meta that died while sending it is removed at the next start.
const checkpointPrefix = ".backup-"

// Backup takes a consistent checkpoint of meta's state and returns what
// writes the backup file to w (which then removes the checkpoint; call
// it exactly once).
func (s *Service) Backup() (func(w io.Writer) error, error) {
	dir, err := os.MkdirTemp(s.opts.Dir, checkpointPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	// pebble makes the checkpoint directory itself.
	if err := os.Remove(dir); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, errClosed
	}
	s.wg.Add(1) // Close waits before it closes the database
	h := metabackup.Header{Cluster: pki.Fingerprint(s.ca.Cert), Created: s.opts.Now().UTC(), Meta: s.metaAddr, Schema: schemaVersion}
	s.mu.RUnlock()
	err = s.db.Checkpoint(dir, pebble.WithFlushedWAL())
	s.wg.Done()
	fs := s.dbFS()
	if err != nil {
		fs.RemoveAll(dir)
		return nil, fmt.Errorf("backup: checkpoint of %s: %w", DBDir, err)
	}
	return func(w io.Writer) error {
		defer fs.RemoveAll(dir)
		bw, err := metabackup.NewWriter(w, h)
		if err != nil {
			return err
		}
		for _, name := range BackupFiles {
			if strings.HasSuffix(name, "/") {
				continue
			}
			if err := addFile(bw, vfs.Default, filepath.Join(s.opts.Dir, name), name); err != nil {
				return err
			}
		}
		names, err := fs.List(dir)
		if err != nil {
			return fmt.Errorf("backup: listing the checkpoint: %w", err)
		}
		for _, n := range names {
			if err := addFile(bw, fs, fs.PathJoin(dir, n), path.Join(DBDir, n)); err != nil {
				return err
			}
		}
		return bw.Close()
	}, nil
}

// dbFS is the file system meta.db lives on.
func (s *Service) dbFS() vfs.FS {
	if s.opts.fs != nil {
		return s.opts.fs
	}
	return vfs.Default
}

func addFile(bw *metabackup.Writer, fs vfs.FS, p, name string) error {
	st, err := fs.Stat(p)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if st.IsDir() {
		return fmt.Errorf("backup: %s is a directory", p) // a checkpoint is flat
	}
	f, err := fs.Open(p)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	return bw.Add(name, st.Size(), f)
}

// removeCheckpoints removes checkpoints a backup left behind (meta died
// while sending one).
func removeCheckpoints(dir string, fs vfs.FS) {
	names, _ := fs.List(dir)
	for _, n := range names {
		if strings.HasPrefix(n, checkpointPrefix) {
			fs.RemoveAll(fs.PathJoin(dir, n))
		}
	}
}

// backupOp is the Backup endpoint: admin only (guard.go), its reply the
// backup file.
var backupOp = op{clients: true, stream: func(s *Service, _ caller) (func(io.Writer) error, error) {
	write, err := s.Backup()
	if err != nil {
		if _, ok := err.(*metaapi.Error); !ok {
			return nil, metaapi.Errorf(metaapi.EIO, "%v", err)
		}
	}
	return write, err
}}

// RestoredFile is left in the data directory by a restore
// (metabackup.RestoreOptions.Marker) for the first start to see.
const RestoredFile = "restored.json"

// Gaps the counters jump by at the first start after a restore. The
// cluster went on after the backup: meta gave out chunk ids (nodes hold
// copies and tombstones under them), inode numbers (in mounts' and NFS
// clients' handles), node ids and principal ids (in certificates and
// client configs) that the backup does not know. Reusing one would mix
// up two things, so the restored meta starts far past anything the lost
// one could have reached; what it had made since the backup (copies of
// files it does not know) is collected as strays.
const (
	restoreGapIDs       = 1 << 40
	restoreGapNodes     = 1 << 10
	restoreGapPrincipal = 1 << 20
	restoreGapEpoch     = 1 << 20
)

// afterRestore, at the first start after a restore, moves the counters
// past what the lost meta may have given out, then removes the marker.
func (s *Service) afterRestore() error {
	marker := filepath.Join(s.opts.Dir, RestoredFile)
	if _, err := os.Stat(marker); err != nil {
		return nil
	}
	c := s.ctr
	c.RestoredChunks = max(c.RestoredChunks, c.NextChunk)
	c.NextIno += restoreGapIDs
	c.NextChunk += restoreGapIDs
	c.NextNode += restoreGapNodes
	if c.NextPrincipal != 0 {
		c.NextPrincipal += restoreGapPrincipal
	}
	c.Epoch += restoreGapEpoch
	b := s.db.NewBatch()
	defer b.Close()
	b.Set(keyCounters, mustJSON(&c), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("moving the counters on after a restore: %w", err)
	}
	s.ctr = c
	if err := os.Remove(marker); err != nil {
		return fmt.Errorf("after a restore: %w", err) // a second start moves them again: harmless
	}
	s.log.Warn("first start after a restore: ids move past what the lost meta may have given out; copies written after the backup are collected as strays",
		"next_chunk", c.NextChunk, "next_ino", c.NextIno, "next_node", c.NextNode, "epoch", c.Epoch)
	return nil
}

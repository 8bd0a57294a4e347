package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/meta"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/metabackup"
	"github.com/sluicefs/sluice/internal/sdk"
)

// `sluice meta backup` and `sluice meta restore` (docs/backup.md).

func (a *app) metaBackupCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "backup FILE",
		Short: "Write a consistent backup of meta's state (namespace, layouts, keys) to FILE while meta serves (admin)",
		Long: "Write a backup of the running meta to FILE (mode 0600: it holds every key of the cluster),\n" +
			"replacing FILE only once the whole backup arrived and its checksum verified.\n" +
			"Restore it with `sluice meta restore FILE --data DIR` (docs/backup.md).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				body, err := c.Meta().Stream(cmd.Context(), metaapi.OpBackup, struct{}{})
				if err != nil {
					return err
				}
				defer body.Close()
				h, n, err := saveBackup(args[0], body)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "sluice: backup of cluster %s (meta %s, taken %s) written to %s, %d bytes\n",
					h.Cluster, h.Meta, h.Created.Format(time.RFC3339), args[0], n)
				return nil
			})
		},
	}
}

// saveBackup writes the stream r to path atomically, private, and only
// if it is a whole, verified backup.
func saveBackup(path string, r io.Reader) (metabackup.Header, int64, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return metabackup.Header{}, 0, fmt.Errorf("backup: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	n, err := io.Copy(f, r)
	if err != nil {
		return metabackup.Header{}, n, fmt.Errorf("backup: receiving it from meta after %d bytes: %w", n, err)
	}
	a, err := metabackup.Open(f, n)
	if err != nil {
		return metabackup.Header{}, n, fmt.Errorf("backup: what meta sent is no whole backup (%w); %s is unchanged", err, path)
	}
	if err := f.Sync(); err != nil {
		return a.Header, n, fmt.Errorf("backup: %w", err)
	}
	if err := f.Close(); err != nil {
		return a.Header, n, fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return a.Header, n, fmt.Errorf("backup: %w", err)
	}
	ok = true
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return a.Header, n, nil
}

func (a *app) metaRestoreCmd() *cobra.Command {
	var dir string
	var force bool
	cmd := &cobra.Command{
		Use:   "restore FILE --data DIR",
		Short: "Restore a meta backup into a new data directory, for `sluice meta --data DIR` to serve",
		Long: "Restore the backup FILE into DIR, which must be empty or not exist (or, with --force, hold a\n" +
			"stopped meta of the same cluster). Nothing in DIR changes unless the whole backup verified.\n" +
			"Then start `sluice meta --data DIR --advertise NEWADDR` and point nodes and clients at it (docs/backup.md).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return errors.New("--data is required")
			}
			h, err := metabackup.Restore(args[0], dir, metabackup.RestoreOptions{
				Required: meta.BackupFiles, Lock: filepath.Join(meta.DBDir, "LOCK"), Force: force, Marker: meta.RestoredFile})
			if err != nil {
				return fmt.Errorf("restore: %w; %s is unchanged", err, dir)
			}
			fmt.Fprintf(a.stdout, "sluice: restored cluster %s (backup of meta %s, taken %s) into %s\n",
				h.Cluster, h.Meta, h.Created.Format(time.RFC3339), dir)
			fmt.Fprintf(a.stdout, "sluice: start it with: sluice meta --data %s --advertise NEWADDR; then point nodes (--meta) and client.conf (meta) at NEWADDR\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "data", "", "the new meta data directory")
	cmd.Flags().BoolVar(&force, "force", false, "replace a (stopped) meta data directory of the same cluster")
	return cmd
}

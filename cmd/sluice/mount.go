package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/daemonconf"
	"github.com/sluicefs/sluice/internal/fusefs"
	"github.com/sluicefs/sluice/internal/readyfile"
	"github.com/sluicefs/sluice/internal/sdk"
)

// mountFlags are the FUSE mount's settings, shared by mount and up.
type mountFlags struct {
	attr, entry, negative time.Duration
	writeBuffer           int
	opTimeout             time.Duration
	allowOther, debug     bool
	od                    odafsFlags
}

func (m *mountFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&m.attr, "attr-timeout", time.Second, "how long the kernel caches attributes")
	cmd.Flags().DurationVar(&m.entry, "entry-timeout", time.Second, "how long the kernel caches name lookups")
	cmd.Flags().DurationVar(&m.negative, "negative-timeout", 0, "how long the kernel remembers that a name does not exist")
	cmd.Flags().IntVar(&m.writeBuffer, "write-buffer", 16<<20, "bytes of one file's sequential writes sent as one streaming write")
	cmd.Flags().DurationVar(&m.opTimeout, "op-timeout", time.Minute, "how long an operation retries (meta or nodes unreachable) before failing")
	cmd.Flags().BoolVar(&m.allowOther, "allow-other", false, "let other users use the mount (always on when mounted by root)")
	cmd.Flags().BoolVar(&m.debug, "fuse-debug", false, "log every FUSE request")
	m.od.add(cmd)
}

// tune fits the mount's client to --op-timeout: a chunk that keeps
// answering busy (a write another writer left in doubt, which only
// repair resolves) must fail the operation with EIO well within it, not
// run into the timeout.
func (m *mountFlags) tune(o *sdk.Options) {
	if m.opTimeout > 0 {
		o.OpTimeout = m.opTimeout     // meta's calls retry within it too
		o.BusyRetry = m.opTimeout / 4 // a flush may wait for two sends
	}
	m.od.tune(o)
}

func (a *app) mountOptions(m *mountFlags) fusefs.Options {
	return fusefs.Options{
		AttrTimeout: m.attr, EntryTimeout: m.entry, NegativeTimeout: m.negative,
		WriteBuffer: m.writeBuffer, OpTimeout: m.opTimeout, AllowOther: m.allowOther,
		Debug: m.debug, Logger: a.logger(),
	}
}

// serveMount mounts cl at dir and serves until ctx ends (SIGINT,
// SIGTERM) or the mount is unmounted from outside (`sluice umount`).
// Once mounted it calls ready (nil: none).
func (a *app) serveMount(ctx context.Context, cl *sdk.Client, dir string, m *mountFlags, ready func() error) error {
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("mount point: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("mount point %s is not a directory", dir)
	}
	server, err := fusefs.Mount(ctx, cl, dir, a.mountOptions(m))
	if err != nil {
		return err
	}
	defer m.od.report(a.stdout, cl)() // says the counters on SIGUSR1, and once unmounted
	fmt.Fprintf(a.stdout, "sluice: mounted at %s\n", dir)
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	if ready != nil {
		if err := ready(); err != nil {
			unmountServer(server, dir, done)
			return err
		}
	}
	select {
	case <-done:
		fmt.Fprintf(a.stdout, "sluice: %s was unmounted\n", dir)
		return nil
	case <-ctx.Done():
	}
	return unmountServer(server, dir, done)
}

// unmountServer unmounts, lazily if programs still use the mount (open
// files, a shell's working directory) so that this never hangs: the
// kernel detaches the mount and those programs get errors.
func unmountServer(server *fusefs.Server, dir string, done <-chan struct{}) error {
	if err := server.Unmount(); err != nil {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	return nil
}

func (a *app) mountCmd() *cobra.Command {
	var m mountFlags
	var readyPath string
	cmd := &cobra.Command{
		Use:   "mount MOUNTPOINT",
		Short: "Mount the cluster as a POSIX file system (FUSE), in the foreground until SIGINT/SIGTERM or `sluice umount`",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := m.od.check(cmd.Flags()); err != nil {
				return err
			}
			return a.withClient(func(cl *sdk.Client) error {
				return a.serveMount(cmd.Context(), cl, args[0], &m, func() error {
					return writeReady(readyPath, readyfile.Info{Mount: args[0]})
				})
			}, m.tune)
		},
	}
	m.add(cmd)
	addReadyFlag(cmd, &readyPath)
	daemonconf.Add(cmd)
	return cmd
}

func (a *app) umountCmd() *cobra.Command {
	var lazy bool
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a Sluice mount (the `sluice mount` serving it then exits)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return umount(args[0], lazy)
		},
	}
	cmd.Flags().BoolVar(&lazy, "lazy", false, "detach now even if the mount is busy")
	return cmd
}

// umount unmounts dir: with umount(2) when allowed (root), else with
// fusermount3 or fusermount, as an unprivileged user must.
func umount(dir string, lazy bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	err = syscall.Unmount(abs, flags)
	if err == nil {
		return nil
	}
	if !errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("unmounting %s: %w", abs, err)
	}
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	for _, tool := range []string{"fusermount3", "fusermount"} {
		if _, lerr := exec.LookPath(tool); lerr != nil {
			continue
		}
		out, err := exec.Command(tool, append(args, abs)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("unmounting %s: %s: %v: %s", abs, tool, err, out)
		}
		return nil
	}
	return fmt.Errorf("unmounting %s: not permitted, and no fusermount3 or fusermount found (Debian: apt-get install fuse3)", abs)
}

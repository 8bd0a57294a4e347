package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/sdk"
)

// exportFlags size a storage node's exported cache, shared by node and
// up (which passes them to every node it starts).
type exportFlags struct{ cache, block, client sizeFlag }

func (f *exportFlags) add(cmd *cobra.Command) {
	f.block = node.DefaultExportBlock
	cmd.Flags().Var(&f.cache, "export-cache", "memory for the exported cache, which clients read small blocks from with one-sided operations and no request (0: none; e.g. 64MiB). Each optimistic read over a network is checked against the reference's key; each process on this host gets a cache of its own (--export-client-cache); docs/architecture.md#optimistic-reads-odafs")
	cmd.Flags().Var(&f.block, "export-block", "the exported cache's block size (a power of two, 512 bytes to 1MiB)")
	cmd.Flags().Var(&f.client, "export-client-cache", "with --export-cache: memory for the cache of its own each process on this host reaching the node over shared memory gets (default 16MiB, at most --export-cache; up to 64 processes, pages used only as blocks fill them)")
}

// odafsFlags turn on a front end's optimistic reads of the nodes'
// exported caches (sdk.Options.ODAFS), shared by mount, up --mount and
// nfs.
type odafsFlags struct {
	on           bool
	cache, block sizeFlag
	refs         int
}

func (f *odafsFlags) add(cmd *cobra.Command) {
	def := odafs.New(odafs.Options{}).Options() // the package's defaults, filled in
	f.cache, f.block = sizeFlag(def.CacheBytes), sizeFlag(def.BlockSize)
	cmd.Flags().BoolVar(&f.on, "odafs", false, "read small ranges (up to 64 KiB) optimistically: from a cache of blocks, else with one-sided reads of the storage nodes' exported caches (sluice node --export-cache) through references earlier reads brought, no request for the node to serve; anything stale falls back to a request")
	cmd.Flags().Var(&f.cache, "odafs-cache", "with --odafs: bytes of blocks kept in this client's cache (0: none, every read through a reference or a request)")
	cmd.Flags().IntVar(&f.refs, "odafs-refs", def.Entries, "with --odafs: references to blocks in the nodes' exported caches this client keeps")
	cmd.Flags().Var(&f.block, "odafs-block", "with --odafs: the nodes' --export-block (references of another block size are not used)")
}

// check refuses settings that would mean nothing: --odafs-* without
// --odafs, or out of range.
func (f *odafsFlags) check(fl *pflag.FlagSet) error {
	for _, name := range []string{"odafs-cache", "odafs-refs", "odafs-block"} {
		if fl.Changed(name) && !f.on {
			return fmt.Errorf("--%s goes with --odafs", name)
		}
	}
	if b := int64(f.block); b < 512 || b > 1<<20 || b&(b-1) != 0 {
		return fmt.Errorf("--odafs-block %s: a power of two, 512 bytes to 1MiB", &f.block)
	}
	if f.refs < 1 {
		return fmt.Errorf("--odafs-refs %d: at least 1", f.refs)
	}
	return nil
}

// tune turns optimistic reads on in o when --odafs is given.
func (f *odafsFlags) tune(o *sdk.Options) {
	if !f.on {
		return
	}
	cache := int64(f.cache)
	if cache == 0 {
		cache = -1 // odafs.Options: none
	}
	o.ODAFS = &odafs.Options{Entries: f.refs, CacheBytes: cache, BlockSize: int(f.block)}
}

// report says how many reads were optimistic, when --odafs is on: on
// SIGUSR1 (as dd reports its progress) and once more when stop is
// called. A mount has no status call to ask it by.
func (f *odafsFlags) report(w io.Writer, cl *sdk.Client) (stop func()) {
	if !f.on {
		return func() {}
	}
	say := func() {
		st := cl.Stats()
		fmt.Fprintf(w, "sluice: optimistic reads: %d served, %d fell back to a request\n", st.Optimistic, st.OptimisticFallbacks)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range sig {
			say()
		}
	}()
	return func() {
		signal.Stop(sig)
		close(sig)
		<-done
		say()
	}
}

// Command sluice is Sluice's single binary: it runs a local cluster, the
// meta service and storage nodes, and is the command-line client.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/daemonconf"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// app holds the global flags shared by subcommands.
type app struct {
	confPath   string
	logLevel   string
	cpuProfile string
	fabricTLS  bool
	fabric     string
	opTimeout  time.Duration
	waitMeta   bool // --op-timeout given: wait for meta even before it first answers
	stdout     *os.File
	stderr     *os.File
}

func main() {
	a := &app{stdout: os.Stdout, stderr: os.Stderr}
	root := a.rootCmd()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if a.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", explain(err))
		os.Exit(1)
	}
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Sluice: a distributed file system whose storage nodes enforce policy as packets stream through them",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version, // --version
	}
	root.SetVersionTemplate(versionString())
	root.PersistentFlags().StringVar(&a.confPath, "conf", "", "client config file (default $"+config.EnvConf+", else ./"+config.DefaultPath+")")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().BoolVar(&a.fabricTLS, "fabric-tls", false, "run the data path (the fabric between clients and nodes and among nodes) over TLS 1.3; nodes and their clients must agree (docs/tls.md)")
	root.PersistentFlags().StringVar(&a.fabric, "fabric", string(fabric.FabricAuto), "how the data path reaches peers: auto (shared memory to peers on this host, TCP to others); tcp; shm (shared memory only); with --fabric-tls, TCP (docs/fabric.md)")
	root.PersistentFlags().DurationVar(&a.opTimeout, "op-timeout", time.Minute,
		"how long a command retries while meta cannot be reached (restarting); given explicitly, also before meta first answers (else a wrong address fails in seconds)")
	root.PersistentFlags().StringVar(&a.cpuProfile, "cpuprofile", "", "write a CPU profile of this command to FILE (for performance work)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		// A daemon's configuration file first, so its values meet the
		// checks the command line's do.
		if err := daemonconf.LoadFor(cmd); err != nil {
			return err
		}
		// mount and up have their own --op-timeout, which shadows this one.
		if f := cmd.Flags().Lookup("op-timeout"); f == root.PersistentFlags().Lookup("op-timeout") && daemonconf.Given(cmd.Flags(), "op-timeout") {
			if a.opTimeout <= 0 {
				return fmt.Errorf("--op-timeout %s: must be positive", a.opTimeout)
			}
			a.waitMeta = true
		}
		if a.cpuProfile == "" {
			return nil
		}
		f, err := os.Create(a.cpuProfile)
		if err != nil {
			return err
		}
		return pprof.StartCPUProfile(f)
	}
	root.AddCommand(a.upCmd(), a.metaCmd(), a.nodeCmd(), a.benchCmd())
	root.AddCommand(a.putCmd(), a.getCmd(), a.catCmd(), a.lsCmd(), a.statCmd(), a.mkdirCmd(), a.rmCmd(), a.mvCmd(), a.policyCmd(), a.repairCmd(), a.statusCmd(), a.checkCmd(), a.authCmd(), a.joinTokenCmd())
	root.AddCommand(a.mountCmd(), a.umountCmd(), a.nfsCmd(), a.nfsGetCmd(), a.nfsPutCmd(), a.versionCmd())
	return root
}

func (a *app) logger() *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(a.logLevel)); err != nil {
		lvl = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: lvl}))
}

// client opens the cluster named by the client config (tune, if given,
// adjusts the options).
func (a *app) client(tune ...func(*sdk.Options)) (*sdk.Client, error) {
	path := config.Find(a.confPath)
	conf, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	fm, err := fabric.ParseFabric(a.fabric)
	if err != nil {
		return nil, err
	}
	opts := sdk.Options{Conf: conf, Logger: a.logger(), FabricTLS: a.fabricTLS, Fabric: fm, OpTimeout: a.opTimeout, WaitForMeta: a.waitMeta}
	for _, t := range tune {
		t(&opts)
	}
	return sdk.New(opts)
}

// explain turns errors into one clear line.
func explain(err error) string {
	var me *metaapi.Error
	if errors.As(err, &me) {
		msg := err.Error()
		// Not for a node's refusal (a join token, its certificate): it
		// uses no client config.
		if me.Code == metaapi.EAUTH && !strings.Contains(msg, "secret") && !strings.HasPrefix(msg, "node: ") {
			msg += " (is the client config for this cluster?)"
		}
		return msg
	}
	msg := err.Error()
	if strings.Contains(msg, "connection refused") && strings.Contains(msg, "meta") {
		msg += " (is the cluster running? start one with `sluice up`; --op-timeout waits for a meta that is restarting)"
	}
	return msg
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/launch"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/readyfile"
	"github.com/sluicefs/sluice/internal/sdk"
)

// procCluster is a cluster of separate processes: one `sluice meta` and
// N `sluice node`, started from the sluice binary, meta on loopback.
type procCluster struct {
	dir   string
	procs []*launch.Proc
	nodes map[string]*launch.Proc // by node id ("n3"): a node on every interface registers another address than it prints
	conf  config.ClientConf
}

// startCluster starts meta and n nodes (cfg's binary, listening at
// cfg.NodeListen) with nodeArgs and waits until they are all up. Data
// lives in a fresh directory on tmpfs when there is one.
func startCluster(ctx context.Context, cfg *Config, n int, nodeArgs []string) (*procCluster, error) {
	return startClusterWith(ctx, cfg, n, nil, nodeArgs)
}

// startClusterWith is startCluster with extra meta arguments.
func startClusterWith(ctx context.Context, cfg *Config, n int, metaArgs, nodeArgs []string) (*procCluster, error) {
	exe := cfg.Exe
	if _, err := cluster.NodeListenAddr(cfg.NodeListen, n); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	dir, err := os.MkdirTemp(tmpfsBase(), "sluice-bench-")
	if err != nil {
		return nil, err
	}
	c := &procCluster{dir: dir, nodes: map[string]*launch.Proc{}}
	args := append([]string{"meta", "--data", filepath.Join(dir, "meta"), "--listen", "127.0.0.1:0", "--default-replicas", "1"}, metaArgs...)
	mr, err := c.start(ctx, exe, "meta", args...)
	if err != nil {
		c.Close()
		return nil, err
	}
	metaAddr := mr.Meta
	if c.conf, err = config.Load(filepath.Join(dir, "meta", config.FileName)); err != nil {
		c.Close()
		return nil, err
	}
	cl, err := sdk.New(sdk.Options{Conf: c.conf})
	if err != nil {
		c.Close()
		return nil, err
	}
	defer cl.Close()
	for i := 1; i <= n; i++ {
		tok, err := cl.JoinToken(ctx, time.Minute, 0)
		if err != nil {
			c.Close()
			return nil, err
		}
		listen, _ := cluster.NodeListenAddr(cfg.NodeListen, i) // checked above
		args := []string{"node", "--data", filepath.Join(dir, fmt.Sprintf("n%d", i)), "--meta", metaAddr,
			"--listen", listen, "--join", tok.Token}
		if !slices.Contains(nodeArgs, "--fabric") {
			// The seed's experiments emulate a network: nodes reach
			// each other over TCP, as clients reach them, not over
			// shared memory because they share this host.
			args = append(args, "--fabric", "tcp")
		}
		args = append(args, nodeArgs...)
		nr, err := c.start(ctx, exe, fmt.Sprintf("n%d", i), args...)
		if err == nil && len(nr.Nodes) != 1 {
			err = fmt.Errorf("bench: n%d's ready file names %d nodes", i, len(nr.Nodes))
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes[nr.Nodes[0].ID] = c.procs[len(c.procs)-1]
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := cl.Status(ctx)
		up := 0
		if err == nil {
			for _, nd := range st.Nodes {
				if nd.State == metaapi.NodeUp {
					up++
				}
			}
		}
		if up == n {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Close()
			return nil, fmt.Errorf("bench: %d of %d nodes up after 30s (logs in %s)", up, n, dir)
		}
	}
}

// tmpfsBase is where bench data goes: tmpfs when there is one (storage
// as fast as the network, as the seeds assume), else the default temp
// directory.
func tmpfsBase() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ""
}

// start runs one process (its output in dir/name.log) and waits until
// it is ready.
func (c *procCluster) start(ctx context.Context, exe, name string, args ...string) (readyfile.Info, error) {
	p, err := launch.Start(launch.Spec{Name: "bench: " + name, Path: exe, Args: args,
		Log: filepath.Join(c.dir, name+".log"), ReadyFile: filepath.Join(c.dir, name+".ready")})
	if err != nil {
		return readyfile.Info{}, err
	}
	c.procs = append(c.procs, p)
	info, err := p.WaitReady(ctx, 30*time.Second)
	if err != nil {
		return readyfile.Info{}, fmt.Errorf("%w (log %s)", err, p.Spec().Log)
	}
	return info, nil
}

// killNode kills -9 node id.
func (c *procCluster) killNode(id ids.NodeID) error {
	p := c.nodes[id.String()]
	if p == nil {
		return fmt.Errorf("bench: no node %v", id)
	}
	p.Kill()
	return nil
}

// Close stops every process and removes the data.
func (c *procCluster) Close() error {
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.Stop(10 * time.Second)
		var ee *exec.ExitError
		if err := p.Err(); err != nil && !errors.As(err, &ee) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		os.RemoveAll(c.dir)
	}
	return errors.Join(errs...)
}

// nodeArgs builds the flags every node of an experiment gets.
func nodeArgs(l LinkSpec, extra ...string) []string {
	args := append([]string{}, extra...)
	if !l.None() {
		args = append(args, "--link-rate", strconv.FormatFloat(l.Rate, 'f', -1, 64), "--link-delay", l.Delay.String())
	}
	return args
}

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// procCluster is a cluster of separate processes: one `sluice meta` and
// N `sluice node`, started from the sluice binary, meta on loopback.
type procCluster struct {
	dir   string
	procs []*proc
	nodes map[string]*proc // by node id ("n3"): a node on every interface registers another address than it prints
	conf  config.ClientConf
}

// proc is one process of the cluster and its log.
type proc struct {
	cmd  *exec.Cmd
	log  *os.File
	read chan struct{} // closed once its stdout is copied to the log
}

var (
	metaLine = regexp.MustCompile(`meta listening on (\S+)`)
	nodeLine = regexp.MustCompile(`storage node (\S+) listening on \S+`)
)

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
	c := &procCluster{dir: dir, nodes: map[string]*proc{}}
	args := append([]string{"meta", "--data", filepath.Join(dir, "meta"), "--listen", "127.0.0.1:0", "--default-replicas", "1"}, metaArgs...)
	metaAddr, err := c.start(ctx, exe, "meta", metaLine, args...)
	if err != nil {
		c.Close()
		return nil, err
	}
	if c.conf, err = config.Load(filepath.Join(dir, "meta", config.FileName)); err != nil {
		c.Close()
		return nil, err
	}
	cl, err := client.New(client.Options{Conf: c.conf})
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
		args := append([]string{"node", "--data", filepath.Join(dir, fmt.Sprintf("n%d", i)), "--meta", metaAddr,
			"--listen", listen, "--join", tok.Token}, nodeArgs...)
		id, err := c.start(ctx, exe, fmt.Sprintf("n%d", i), nodeLine, args...)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes[id] = c.procs[len(c.procs)-1]
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

// start runs one process and waits for the line announcing its address.
func (c *procCluster) start(ctx context.Context, exe, name string, ready *regexp.Regexp, args ...string) (string, error) {
	logf, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return "", err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", fmt.Errorf("bench: starting %s: %w", name, err)
	}
	p := &proc{cmd: cmd, log: logf, read: make(chan struct{})}
	c.procs = append(c.procs, p)
	found := make(chan string, 1)
	go func() {
		defer close(p.read)
		// ready is matched against all output so far, so it may span
		// lines; its groups come back joined by spaces.
		sc := bufio.NewScanner(out)
		var seen strings.Builder
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if seen.Len() < 64<<10 {
				seen.WriteString(sc.Text() + "\n")
			}
			if m := ready.FindStringSubmatch(seen.String()); m != nil {
				select {
				case found <- strings.Join(m[1:], " "):
				default:
				}
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case addr := <-found:
		return addr, nil
	case <-p.read:
		// Its stdout closed before the line: it exited, saying why on
		// stderr (in the log after its stdout).
		select {
		case addr := <-found:
			return addr, nil
		default:
		}
		b, _ := os.ReadFile(logf.Name())
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return "", fmt.Errorf("bench: %s exited before it started: %s (log %s)", name, lines[len(lines)-1], logf.Name())
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("bench: %s did not start within 30s (log %s)", name, logf.Name())
	}
}

// killNode kills -9 node id.
func (c *procCluster) killNode(id ids.NodeID) error {
	p := c.nodes[id.String()]
	if p == nil {
		return fmt.Errorf("bench: no node %v", id)
	}
	return p.cmd.Process.Kill()
}

// Close stops every process and removes the data.
func (c *procCluster) Close() error {
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.read: // stdout is at EOF: the process has exited
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.read
		}
		// Wait only once the output is read (it closes the pipe).
		var ee *exec.ExitError
		if err := p.cmd.Wait(); err != nil && !errors.As(err, &ee) {
			errs = append(errs, err)
		}
		p.log.Close()
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

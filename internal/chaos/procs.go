package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"
)

// proc is one `sluice` child process: its stdout lines are watched,
// both streams kept in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}

	mu    sync.Mutex
	lines []string
	wake  chan struct{}
}

func start(bin, logDir, name string, args ...string) (*proc, error) {
	lf, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = lf
	out, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the run
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: lf, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(io.TeeReader(out, lf))
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
		cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// waitLine waits for a stdout line matching re.
func (p *proc) waitLine(ctx context.Context, re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	deadline := time.After(timeout)
	seen := 0
	for {
		p.mu.Lock()
		lines := p.lines[seen:]
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if m := re.FindStringSubmatch(l); m != nil {
				return m, nil
			}
		}
		select {
		case <-p.wake:
		case <-p.done:
			return nil, fmt.Errorf("%s exited before printing %q (see its log)", p.name, re)
		case <-deadline:
			return nil, fmt.Errorf("%s printed no %q within %s", p.name, re, timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill is kill -9, waiting for the exit.
func (p *proc) kill() {
	if p.running() {
		p.cmd.Process.Kill()
	}
	<-p.done
}

// stop is SIGTERM, then SIGKILL after a while.
func (p *proc) stop() {
	if p.running() {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

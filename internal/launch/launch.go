// Package launch starts Sluice daemons as separate processes and waits
// until they serve: each is given --ready-file and is ready once that
// file appears (package readyfile), so launchers (the chaos run, the
// benchmarks, the integration tests) read its addresses from there
// rather than parse what it prints for people. An early exit ends the
// wait at once with the exit status and the end of the process's
// standard error.
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/sluicefs/sluice/internal/readyfile"
)

// Spec is how to start a process.
type Spec struct {
	Name string   // for messages
	Path string   // the program (the sluice binary)
	Args []string // its arguments (Start adds --ready-file when ReadyFile is set)
	// Prefix runs the program under another one: {"ip", "netns",
	// "exec", "ns1"}.
	Prefix []string
	// Env is added to this process's environment.
	Env []string
	// ReadyFile is where the daemon writes its ready file; Start removes
	// a stale one first (a restart must not find the last run's).
	ReadyFile string
	// Log, if set, is a file (appended to) that gets both output
	// streams.
	Log string
	// Stdout and Stderr, if set, get the streams too.
	Stdout, Stderr io.Writer
	Stdin          *os.File
	// KillWithParent has the kernel kill the process when the launcher
	// dies, so a crashed run leaves no daemons behind. (Linux delivers it
	// when the starting thread exits: not for callers that lock threads.)
	KillWithParent bool
}

// tailBytes is how much of a process's standard error is kept to report
// why it exited.
const tailBytes = 8 << 10

// Proc is a started process.
type Proc struct {
	spec    Spec
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error // set before done closes
	tail    *tailBuffer
}

// Start starts the process described by spec.
func Start(spec Spec) (*Proc, error) {
	if spec.ReadyFile != "" {
		if err := os.Remove(spec.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("starting %s: removing a stale ready file: %w", spec.Name, err)
		}
	}
	args := append([]string{}, spec.Args...)
	if spec.ReadyFile != "" {
		args = append(args, "--ready-file", spec.ReadyFile)
	}
	path := spec.Path
	if len(spec.Prefix) > 0 {
		path, args = spec.Prefix[0], append(append(append([]string{}, spec.Prefix[1:]...), spec.Path), args...)
	}
	cmd := exec.Command(path, args...)
	if spec.Env != nil {
		cmd.Env = append(os.Environ(), spec.Env...)
	}
	p := &Proc{spec: spec, cmd: cmd, done: make(chan struct{}), tail: &tailBuffer{max: tailBytes}}
	var log *os.File
	if spec.Log != "" {
		var err error
		if log, err = os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
		}
	}
	cmd.Stdout = sink(log, spec.Stdout)
	cmd.Stderr = sink(log, spec.Stderr, p.tail)
	if spec.Stdin != nil {
		cmd.Stdin = spec.Stdin
	}
	if spec.KillWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	// A grandchild holding the output open must not hold up Wait forever.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		if log != nil {
			log.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		if log != nil {
			log.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// sink joins the non-nil writers (nil when there are none: /dev/null).
func sink(log *os.File, ws ...io.Writer) io.Writer {
	var all []io.Writer
	if log != nil {
		all = append(all, log)
	}
	for _, w := range ws {
		if w != nil {
			all = append(all, w)
		}
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return io.MultiWriter(all...)
}

// Spec returns what p was started with.
func (p *Proc) Spec() Spec { return p.spec }

// Cmd is the started command, for callers that signal the process
// themselves (SIGSTOP) or read its ProcessState after Done.
func (p *Proc) Cmd() *exec.Cmd { return p.cmd }

// Pid is the process id (of the prefix program, if any).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and its output is copied.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Err is how the process exited (nil: status 0); only valid after Done.
func (p *Proc) Err() error {
	<-p.done
	return p.waitErr
}

// ExitCode is the exit status, -1 if killed by a signal; waits for the
// exit.
func (p *Proc) ExitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// StderrTail is the end of the process's standard error so far.
func (p *Proc) StderrTail() string { return p.tail.String() }

// pollEvery is how often WaitReady looks for the file.
const pollEvery = 20 * time.Millisecond

// WaitReady waits until the process has written its ready file and
// returns it. It fails at once if the process exits first, after
// timeout, or when ctx ends.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) (readyfile.Info, error) {
	if p.spec.ReadyFile == "" {
		return readyfile.Info{}, fmt.Errorf("%s: started without a ready file", p.spec.Name)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		info, err := readyfile.Read(p.spec.ReadyFile)
		if err == nil {
			return info, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return readyfile.Info{}, fmt.Errorf("%s: %w", p.spec.Name, err)
		}
		select {
		case <-tick.C:
		case <-p.done:
			// Written just before it exited: ready, though gone now.
			if info, err := readyfile.Read(p.spec.ReadyFile); err == nil {
				return info, nil
			}
			return readyfile.Info{}, &ExitError{Name: p.spec.Name, Err: p.waitErr, Stderr: p.tail.String()}
		case <-deadline.C:
			return readyfile.Info{}, fmt.Errorf("%s was not ready within %s; its stderr ends:\n%s", p.spec.Name, timeout, p.tail.String())
		case <-ctx.Done():
			return readyfile.Info{}, fmt.Errorf("waiting for %s: %w", p.spec.Name, ctx.Err())
		}
	}
}

// ExitError is a process that exited before it was ready.
type ExitError struct {
	Name   string
	Err    error  // from exec's Wait: the exit status (nil: status 0)
	Stderr string // the end of its standard error
}

func (e *ExitError) Error() string {
	how := "with status 0"
	if e.Err != nil {
		how = "(" + e.Err.Error() + ")"
	}
	return fmt.Sprintf("%s exited %s before it was ready; its stderr ends:\n%s", e.Name, how, e.Stderr)
}

func (e *ExitError) Unwrap() error { return e.Err }

// Kill sends SIGKILL (if the process still runs) and waits for the exit.
func (p *Proc) Kill() {
	if p.Running() {
		p.cmd.Process.Kill()
	}
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout for the exit, then kills.
// It reports whether the process exited by itself.
func (p *Proc) Stop(timeout time.Duration) bool {
	if p.Running() {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		p.Kill()
		return false
	}
}

// Restart starts the same process again once this one has exited
// (killing it if it has not).
func (p *Proc) Restart() (*Proc, error) {
	p.Kill()
	return Start(p.spec)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

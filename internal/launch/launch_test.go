package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/readyfile"
)

// The test binary doubles as the daemon under test: with $LAUNCH_HELPER
// set, TestMain behaves as that helper instead of running the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LAUNCH_HELPER"); mode != "" {
		helper(mode)
		return
	}
	os.Exit(m.Run())
}

func helper(mode string) {
	var ready string
	for i, a := range os.Args {
		if a == "--ready-file" && i+1 < len(os.Args) {
			ready = os.Args[i+1]
		}
	}
	fmt.Println("helper: starting", mode)
	switch mode {
	case "exit":
		fmt.Fprintln(os.Stderr, "helper: cannot bind the port")
		os.Exit(3)
	case "hang":
		time.Sleep(time.Hour)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	if mode == "stubborn" {
		signal.Ignore(syscall.SIGTERM)
	}
	if err := readyfile.Write(ready, readyfile.Info{Meta: "127.0.0.1:1234", Nodes: []readyfile.Node{{ID: "n1", Addr: "127.0.0.1:5"}}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	<-sig
	os.Exit(0)
}

func spec(t *testing.T, mode string) Spec {
	dir := t.TempDir()
	return Spec{Name: mode, Path: os.Args[0], Args: []string{"-test.run=^$"}, Env: []string{"LAUNCH_HELPER=" + mode},
		ReadyFile: filepath.Join(dir, "ready.json"), Log: filepath.Join(dir, "log")}
}

func TestReady(t *testing.T) {
	s := spec(t, "ready")
	var out strings.Builder
	s.Stdout = &syncWriter{b: &out}
	p, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	info, err := p.WaitReady(context.Background(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if info.Meta != "127.0.0.1:1234" || len(info.Nodes) != 1 || info.Nodes[0].ID != "n1" || info.PID != p.Pid() {
		t.Errorf("ready file %+v (pid %d)", info, p.Pid())
	}
	if !p.Stop(60 * time.Second) {
		t.Error("Stop had to kill a process that exits on SIGTERM")
	}
	if p.ExitCode() != 0 {
		t.Errorf("exit code %d, want 0", p.ExitCode())
	}
	log, _ := os.ReadFile(s.Log)
	if !strings.Contains(string(log), "helper: starting ready") {
		t.Errorf("log %q lacks the helper's stdout", log)
	}
	if !strings.Contains(out.String(), "helper: starting ready") {
		t.Errorf("Stdout got %q", out.String())
	}
}

func TestRestartFindsNoStaleReadyFile(t *testing.T) {
	p, err := Start(spec(t, "ready"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitReady(context.Background(), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	// The restarted process is told to hang: the last run's file must be
	// gone, or WaitReady would return at once.
	s := p.Spec()
	s.Env = []string{"LAUNCH_HELPER=hang"}
	q, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Kill()
	if _, err := q.WaitReady(context.Background(), 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "not ready within") {
		t.Errorf("restart: %v, want a timeout", err)
	}
	r, err := p.Restart()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Kill()
	if _, err := r.WaitReady(context.Background(), 60*time.Second); err != nil {
		t.Errorf("Restart: %v", err)
	}
}

func TestEarlyExit(t *testing.T) {
	p, err := Start(spec(t, "exit"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.WaitReady(context.Background(), 10*time.Minute)
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("got %v, want an ExitError", err)
	}
	if !strings.Contains(ee.Stderr, "cannot bind the port") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("error %q: want the exit status and the stderr line", err)
	}
	if time.Since(start) > 5*time.Minute {
		t.Error("the wait ran into its timeout instead of ending at the exit")
	}
	if p.ExitCode() != 3 {
		t.Errorf("exit code %d", p.ExitCode())
	}
}

func TestContextEndsWait(t *testing.T) {
	p, err := Start(spec(t, "hang"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.WaitReady(ctx, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

func TestStopKillsStubborn(t *testing.T) {
	p, err := Start(spec(t, "stubborn"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitReady(context.Background(), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Stop(200 * time.Millisecond) {
		t.Error("Stop says a process that ignores SIGTERM exited by itself")
	}
	if p.Running() || p.ExitCode() != -1 {
		t.Errorf("after Stop: running %v, exit code %d", p.Running(), p.ExitCode())
	}
}

func TestPrefix(t *testing.T) {
	// env(1) as the prefix stands in for `ip netns exec NS`.
	s := spec(t, "ready")
	s.Prefix = []string{"env", "LAUNCH_PREFIXED=1"}
	p, err := Start(s)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if _, err := p.WaitReady(context.Background(), 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 4}
	b.Write([]byte("abc"))
	b.Write([]byte("defg"))
	if b.String() != "defg" {
		t.Errorf("tail %q, want defg", b.String())
	}
}

// syncWriter is written by exec's copying goroutine only, and read
// after the exit.
type syncWriter struct{ b *strings.Builder }

func (w *syncWriter) Write(p []byte) (int, error) { return w.b.Write(p) }

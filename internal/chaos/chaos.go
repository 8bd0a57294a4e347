// Package chaos is Sluice's fault-injection run: a cluster of separate
// `sluice` processes (meta and N storage nodes) takes a continuous
// workload of writes and reads on a replicated and an erasure-coded
// directory while a controller kills nodes with SIGKILL and restarts
// them (never more down at once than the policies tolerate) and kills and
// restarts meta. At the end every node comes back, repair restores full
// redundancy, and every file must read back as the last write the
// workload was told succeeded: bytes lost must be zero. `sluice bench
// chaos` and a CI test run it.
package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/launch"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Options configure a run.
type Options struct {
	Binary   string        // the sluice executable
	Dir      string        // data and logs (tmpfs for speed)
	Nodes    int           // default 5
	Duration time.Duration // of the faulty phase; default 1 minute
	Writers  int           // default 4
	MaxFile  int           // bytes; default 3 MiB
	Seed     uint64
	// MaxDown is how many nodes may be down at once (default 1). Both
	// policies tolerate two lost members; the controller stays below
	// that. (With 5 nodes an RS(3,2) write needs all five up: writes to
	// the erasure-coded directory fail while a node is down.)
	MaxDown int
	// MetaEvery is how often meta is killed and restarted (0: never).
	MetaEvery time.Duration
	Logf      func(format string, args ...any)
}

// cluster is the processes of a run.
type cluster struct {
	o                   Options
	metaAddr, conf      string
	secret              string
	meta                *launch.Proc
	mu                  sync.Mutex
	nodes               []*launch.Proc // by index; nil or exited: down
	kills, restarts, mr int
	// repairs and repaired count what earlier meta incarnations
	// reported (a restart starts meta's counters over).
	repairs, repaired int64
	cl                *sdk.Client
}

func (c *cluster) startMeta(ctx context.Context, listen string) error {
	p, err := start(c.o.Binary, c.o.Dir, "meta", "meta", "--data", filepath.Join(c.o.Dir, "meta"), "--listen", listen,
		"--node-timeout", "2s", "--repair-grace", "4s")
	if err != nil {
		return err
	}
	r, err := p.WaitReady(ctx, 30*time.Second)
	if err != nil {
		p.Kill()
		return err
	}
	c.meta, c.metaAddr, c.secret, c.conf = p, r.Meta, r.Secret, r.Conf
	return nil
}

func (c *cluster) startNode(ctx context.Context, i int) error {
	dir := filepath.Join(c.o.Dir, fmt.Sprintf("n%d", i+1))
	args := []string{"node", "--data", dir, "--meta", c.metaAddr, "--listen", "127.0.0.1:0"}
	if joined, _ := node.Joined(dir); !joined {
		tok, err := c.joinToken(ctx)
		if err != nil {
			return err
		}
		args = append(args, "--join", tok)
	}
	p, err := start(c.o.Binary, c.o.Dir, fmt.Sprintf("n%d", i+1), args...)
	if err != nil {
		return err
	}
	if _, err := p.WaitReady(ctx, 30*time.Second); err != nil {
		p.Kill()
		return err
	}
	c.mu.Lock()
	c.nodes[i] = p
	c.mu.Unlock()
	return nil
}

// joinToken gets a token for a new node, as an operator would.
func (c *cluster) joinToken(ctx context.Context) (string, error) {
	conf, err := config.Load(c.conf)
	if err != nil {
		return "", err
	}
	cl, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		return "", err
	}
	defer cl.Close()
	tok, err := cl.JoinToken(ctx, time.Minute, 0)
	return tok.Token, err
}

func (c *cluster) down() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, p := range c.nodes {
		if p == nil || !p.Running() {
			out = append(out, i)
		}
	}
	return out
}

func (c *cluster) stopAll() {
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	for _, p := range nodes {
		if p != nil {
			p.Stop(stopWait)
		}
	}
	if c.meta != nil {
		c.meta.Stop(stopWait)
	}
}

// Run runs the whole experiment. An error means it could not be run;
// losses are in the report.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Nodes == 0 {
		o.Nodes = 5
	}
	if o.Duration == 0 {
		o.Duration = time.Minute
	}
	if o.Writers == 0 {
		o.Writers = 4
	}
	if o.MaxFile == 0 {
		o.MaxFile = 3 << 20
	}
	if o.MaxDown == 0 {
		o.MaxDown = 1
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Nodes < 5 {
		return Report{}, fmt.Errorf("chaos: needs at least 5 nodes (RS(3,2) spans 5), got %d", o.Nodes)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Report{}, err
	}
	c := &cluster{o: o, nodes: make([]*launch.Proc, o.Nodes)}
	defer c.stopAll()
	if err := c.startMeta(ctx, "127.0.0.1:0"); err != nil {
		return Report{}, err
	}
	for i := range o.Nodes {
		if err := c.startNode(ctx, i); err != nil {
			return Report{}, err
		}
	}
	conf, err := config.Load(c.conf)
	if err != nil {
		return Report{}, err
	}
	cl, err := sdk.New(sdk.Options{Conf: conf, BusyRetry: 10 * time.Second})
	if err != nil {
		return Report{}, err
	}
	defer cl.Close()
	c.cl = cl
	if err := waitUp(ctx, cl, o.Nodes, 30*time.Second); err != nil {
		return Report{}, err
	}
	for _, d := range []struct {
		p   string
		pol metaapi.Policy
	}{{"/r", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}}}, {"/e", metaapi.Policy{EC: &metaapi.ErasureCode{Data: 3, Parity: 2, Cell: 64 << 10}}}} {
		if err := cl.MkdirAll(ctx, d.p, 0o755); err != nil {
			return Report{}, err
		}
		if err := cl.SetPolicy(ctx, d.p, d.pol); err != nil {
			return Report{}, err
		}
	}

	var rep Report
	w := &workload{cl: cl, o: o, files: map[string]*fileState{}}
	start := time.Now()
	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range o.Writers {
		wg.Add(2)
		go func() { defer wg.Done(); w.writer(wctx, i) }()
		go func() { defer wg.Done(); w.reader(wctx, uint64(i)) }()
	}
	faultErr := c.faults(ctx, o.Duration)
	stopWork()
	wg.Wait()
	rep.Duration = time.Since(start)
	rep.Writes, rep.WriteErrors = w.writes.Load(), w.writeErrs.Load()
	rep.Reads, rep.ReadErrors, rep.WrongReads = w.reads.Load(), w.readErrs.Load(), w.wrong.Load()
	rep.NodeKills, rep.NodeRestarts, rep.MetaRestarts = c.kills, c.restarts, c.mr
	if faultErr != nil {
		return rep, faultErr
	}

	// Everything back; wait for full redundancy; check every file.
	for _, i := range c.down() {
		if err := c.startNode(ctx, i); err != nil {
			return rep, err
		}
		rep.NodeRestarts++
	}
	healStart := time.Now()
	st, err := waitHealed(ctx, cl, o.Nodes, 3*time.Minute)
	rep.RepairTime = time.Since(healStart)
	rep.Repairs, rep.RepairedBytes = c.repairs+st.Repair.Done, c.repaired+st.Repair.Bytes
	if err != nil {
		return rep, err
	}
	rep.Files, rep.FilesLost, rep.BytesLost = w.verifyAll(ctx, o.Logf)
	rep.Check, err = checkSettled(ctx, cl, time.Minute)
	return rep, err
}

// faults runs the controller for d: a node kill or restart every few
// seconds, meta now and then.
func (c *cluster) faults(ctx context.Context, d time.Duration) error {
	rng := rand.New(rand.NewPCG(c.o.Seed, 0xfa))
	end := time.Now().Add(d)
	nextMeta := time.Now().Add(c.o.MetaEvery)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(1500+rng.IntN(3000)) * time.Millisecond):
		}
		if c.o.MetaEvery > 0 && time.Now().After(nextMeta) {
			if st, err := c.cl.Status(ctx); err == nil {
				c.repairs += st.Repair.Done
				c.repaired += st.Repair.Bytes
			}
			c.o.Logf("chaos: kill -9 meta")
			c.meta.Kill()
			time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
			if err := c.startMeta(ctx, c.metaAddr); err != nil {
				return fmt.Errorf("restarting meta: %w", err)
			}
			c.mr++
			nextMeta = time.Now().Add(c.o.MetaEvery)
			continue
		}
		down := c.down()
		if len(down) > 0 && (len(down) >= c.o.MaxDown || rng.IntN(2) == 0) {
			i := down[rng.IntN(len(down))]
			c.o.Logf("chaos: restart n%d", i+1)
			if err := c.startNode(ctx, i); err != nil {
				return fmt.Errorf("restarting n%d: %w", i+1, err)
			}
			c.restarts++
			continue
		}
		i := rng.IntN(c.o.Nodes)
		c.mu.Lock()
		p := c.nodes[i]
		c.mu.Unlock()
		c.o.Logf("chaos: kill -9 n%d", i+1)
		p.Kill()
		c.kills++
	}
	return nil
}

func waitUp(ctx context.Context, cl *sdk.Client, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := cl.Status(ctx)
		if err == nil {
			up := 0
			for _, nd := range st.Nodes {
				if nd.State == metaapi.NodeUp {
					up++
				}
			}
			if up == n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %d nodes not up within %s (%v)", n, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitHealed waits until every node is up and a scan after that finds
// every chunk and stripe group at full redundancy, nothing to repair.
func waitHealed(ctx context.Context, cl *sdk.Client, n int, timeout time.Duration) (metaapi.StatusResp, error) {
	if err := waitUp(ctx, cl, n, timeout); err != nil {
		return metaapi.StatusResp{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := cl.WaitRepaired(ctx, time.Now())
	if err != nil {
		err = fmt.Errorf("chaos: %w", err)
	}
	return st, err
}

// ---- the workload ----

// fileState is what a file may hold: the hashes of the contents the
// workload's writes could have left (one after an acknowledged write;
// two after a failed one: the old or the new). A file with more than one
// is not written again. A read may also see a write still in flight: it
// became visible before its writer was told (linearizable, not wrong).
type fileState struct {
	mu       sync.Mutex
	sizes    map[[32]byte]int64
	inflight map[[32]byte]bool
	// past numbers every content ever written (from 1), to tell a stale
	// read from garbage when a read is wrong.
	past map[[32]byte]int
}

func newFileState(h [32]byte, n int64) *fileState {
	return &fileState{sizes: map[[32]byte]int64{h: n}, past: map[[32]byte]int{h: 1}}
}

// start records a write about to begin.
func (f *fileState) start(h [32]byte) {
	f.mu.Lock()
	if f.inflight == nil {
		f.inflight = map[[32]byte]bool{}
	}
	f.inflight[h] = true
	f.mu.Unlock()
}

func (f *fileState) set(h [32]byte, n int64) {
	f.mu.Lock()
	delete(f.inflight, h)
	f.sizes = map[[32]byte]int64{h: n}
	f.past[h] = len(f.past) + 1
	f.mu.Unlock()
}

func (f *fileState) add(h [32]byte, n int64) {
	f.mu.Lock()
	delete(f.inflight, h)
	f.sizes[h] = n
	f.past[h] = len(f.past) + 1
	f.mu.Unlock()
}

// which says which write (1 = the first) produced content h, 0 if none.
func (f *fileState) which(h [32]byte) (n, of int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.past[h], len(f.past)
}

func (f *fileState) certain() ([32]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for h := range f.sizes {
		return h, len(f.sizes) == 1
	}
	return [32]byte{}, false
}

func (f *fileState) allows(h [32]byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sizes[h]
	return ok || f.inflight[h]
}

type workload struct {
	cl    *sdk.Client
	o     Options
	mu    sync.Mutex
	files map[string]*fileState
	names []string

	writes, writeErrs, reads, readErrs, wrong atomic.Int64
}

// writer creates and rewrites its own files (Put: a temporary name,
// then a rename), alternating the two directories.
func (w *workload) writer(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.o.Seed, uint64(id)+1))
	var mine []string
	for n := 0; ctx.Err() == nil; n++ {
		var p string
		if len(mine) < 8 || rng.IntN(3) == 0 {
			p = fmt.Sprintf("/%s/w%d-%d", []string{"r", "e"}[n%2], id, n)
		} else {
			p = mine[rng.IntN(len(mine))]
		}
		w.mu.Lock()
		fs := w.files[p]
		w.mu.Unlock()
		if fs != nil {
			if _, ok := fs.certain(); !ok {
				continue // its state is uncertain: leave it as it is
			}
		}
		data := make([]byte, rng.IntN(w.o.MaxFile))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		h := sha256.Sum256(data)
		if fs != nil {
			fs.start(h)
		}
		wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a started write finishes
		_, err := w.cl.Put(wctx, p, bytes.NewReader(data), 0o644)
		cancel()
		switch {
		case err == nil && fs == nil:
			fs = newFileState(h, int64(len(data)))
			w.mu.Lock()
			w.files[p] = fs
			w.names = append(w.names, p)
			w.mu.Unlock()
			mine = append(mine, p)
			w.writes.Add(1)
		case err == nil:
			fs.set(h, int64(len(data)))
			w.writes.Add(1)
		case fs != nil:
			fs.add(h, int64(len(data))) // the rename may have happened
			w.writeFailed(p, err)
		default:
			w.writeFailed(p, err) // a new file: it may or may not exist; not checked
		}
	}
}

// writeFailed counts a failed write and logs the first few.
func (w *workload) writeFailed(p string, err error) {
	if n := w.writeErrs.Add(1); n <= 5 {
		w.o.Logf("chaos: write of %s failed (as it may while nodes die): %v", p, err)
	}
}

// reader reads files whose content is certain and checks them.
func (w *workload) reader(ctx context.Context, id uint64) {
	rng := rand.New(rand.NewPCG(w.o.Seed, id+100))
	for ctx.Err() == nil {
		w.mu.Lock()
		var p string
		var fs *fileState
		if len(w.names) > 0 {
			p = w.names[rng.IntN(len(w.names))]
			fs = w.files[p]
		}
		w.mu.Unlock()
		if fs == nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		want, ok := fs.certain()
		if !ok {
			continue
		}
		var buf bytes.Buffer
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := w.cl.Get(rctx, p, &buf)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.readErrs.Add(1)
			}
			continue
		}
		// A write may have been acknowledged meanwhile: only a content no
		// write produced is wrong.
		if got := sha256.Sum256(buf.Bytes()); got != want && !fs.allows(got) {
			w.wrong.Add(1)
			w.o.Logf("chaos: WRONG read of %s: %s", p, w.explainWrong(ctx, p, fs, buf.Bytes()))
		}
		w.reads.Add(1)
	}
}

// explainWrong describes a wrong read: whether it is an older write's
// content, and how it differs from what a second read returns.
func (w *workload) explainWrong(ctx context.Context, p string, fs *fileState, got []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d bytes", len(got))
	if n, of := fs.which(sha256.Sum256(got)); n > 0 {
		fmt.Fprintf(&b, ", the content of write %d of %d (stale)", n, of)
	} else {
		fmt.Fprintf(&b, ", matching none of its %d writes", of)
	}
	var again bytes.Buffer
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err := w.cl.Get(rctx, p, &again)
	cancel()
	if err != nil {
		fmt.Fprintf(&b, "; a second read failed: %v", err)
		return b.String()
	}
	a := again.Bytes()
	fmt.Fprintf(&b, "; a second read has %d bytes", len(a))
	if n, _ := fs.which(sha256.Sum256(a)); n > 0 {
		fmt.Fprintf(&b, " (write %d)", n)
	}
	// The byte ranges that differ, at most a few, and whether they are zeros.
	var runs []string
	zeros := true
	for i := 0; i < min(len(a), len(got)); {
		if a[i] == got[i] {
			i++
			continue
		}
		j := i
		for j < min(len(a), len(got)) && (a[j] != got[j] || j-i < 64) {
			if got[j] != 0 && a[j] != got[j] {
				zeros = false
			}
			j++
		}
		if len(runs) < 6 {
			runs = append(runs, fmt.Sprintf("[%d,%d)", i, j))
		}
		i = j
	}
	fmt.Fprintf(&b, "; differing at %v (wrong bytes all zero: %v)", runs, zeros && len(runs) > 0)
	return b.String()
}

// verifyAll reads every file once the cluster has healed.
func (w *workload) verifyAll(ctx context.Context, logf func(string, ...any)) (files, lost int, bytesLost int64) {
	w.mu.Lock()
	names := slices.Clone(w.names)
	w.mu.Unlock()
	for _, p := range names {
		fs := w.files[p]
		files++
		var buf bytes.Buffer
		_, err := w.cl.Get(ctx, p, &buf)
		if err == nil && fs.allows(sha256.Sum256(buf.Bytes())) {
			continue
		}
		lost++
		fs.mu.Lock()
		var size int64
		for _, n := range fs.sizes {
			size = max(size, n)
		}
		fs.mu.Unlock()
		bytesLost += size
		if err == nil {
			err = errors.New("content matches no acknowledged write")
		}
		logf("chaos: LOST %s (%d bytes): %v", p, size, err)
	}
	return
}

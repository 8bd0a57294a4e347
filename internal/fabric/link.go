package fabric

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Link emulates a network link for benchmarks: an egress bandwidth shared
// by every connection that uses it (one Link per node models its NIC, so a
// tree node's two forwards share it, as on real hardware) and a one-way
// propagation delay. Loopback TCP is CPU-bound; a Link makes the network
// the bottleneck, the regime the seed's experiments measure.
//
// Each batch of packets reserves its transmission time on the link when
// it is sent, is copied into its connection's bounded wire queue, and is
// delivered to the socket when it would arrive: transmission end plus the
// delay. A wire goroutine per connection does the delivery on a locked OS
// thread with a 1 ns timer slack, because Go's timers have about 1 ms
// granularity on the VMs this runs on; wakeups still overshoot by some
// 15-20 µs there, so emulated delays below that are approximate.
type Link struct {
	rate  float64 // bytes per second; 0 = unlimited
	delay time.Duration

	mu   sync.Mutex
	busy time.Time // the link is transmitting until then
}

// Limits on emulated links.
const (
	MinLinkRate  = 1e6 / 8  // 1 Mbit/s
	MaxLinkRate  = 1e12 / 8 // 1 Tbit/s
	MaxLinkDelay = time.Second
)

// NewLink returns a link with rate bytes per second (0 for unlimited) and
// the given one-way delay.
func NewLink(rate float64, delay time.Duration) (*Link, error) {
	if rate != 0 && (rate < MinLinkRate || rate > MaxLinkRate) {
		return nil, fmt.Errorf("fabric: link rate %s outside [1 Mbit/s, 1 Tbit/s]", FormatRate(rate))
	}
	if delay < 0 || delay > MaxLinkDelay {
		return nil, fmt.Errorf("fabric: link delay %s outside [0, %s]", delay, MaxLinkDelay)
	}
	return &Link{rate: rate, delay: delay}, nil
}

// Rate is the link's bandwidth in bytes per second (0: unlimited).
func (l *Link) Rate() float64 { return l.rate }

// Delay is the link's one-way delay.
func (l *Link) Delay() time.Duration { return l.delay }

func (l *Link) String() string {
	if l == nil {
		return "none"
	}
	return FormatRate(l.rate) + " " + l.delay.String()
}

// reserve books n bytes of transmission and returns when they arrive.
func (l *Link) reserve(n int) time.Time {
	now := time.Now()
	l.mu.Lock()
	start := l.busy
	if start.Before(now) {
		start = now
	}
	done := start
	if l.rate > 0 {
		done = start.Add(time.Duration(float64(n) / l.rate * 1e9))
	}
	l.busy = done
	l.mu.Unlock()
	return done.Add(l.delay)
}

// ParseRate reads a bandwidth: "10Gbit", "10Gbit/s", "10Gbps", "1.25GB/s",
// "800MB/s", "100Mbit"; a bare number is bytes per second.
func ParseRate(s string) (float64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(strings.TrimSuffix(t, "/s"), "ps")
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("fabric: cannot read link rate %q (try 10Gbit or 1.25GB/s)", s)
	}
	scale := map[string]float64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
		"bit": 1.0 / 8, "b": 1.0 / 8, "Kbit": 1e3 / 8, "kbit": 1e3 / 8, "Kb": 1e3 / 8, "Mbit": 1e6 / 8, "Mb": 1e6 / 8,
		"Gbit": 1e9 / 8, "Gb": 1e9 / 8, "Tbit": 1e12 / 8, "Tb": 1e12 / 8}
	m, ok := scale[unit]
	if !ok {
		return 0, fmt.Errorf("fabric: unknown rate unit %q in %q (use bit, Kbit, Mbit, Gbit, B, KB, MB, GB)", unit, s)
	}
	return v * m, nil
}

// FormatRate writes a bandwidth in bits per second.
func FormatRate(bytesPerSec float64) string {
	b := bytesPerSec * 8
	for _, u := range []struct {
		s string
		v float64
	}{{"Tbit/s", 1e12}, {"Gbit/s", 1e9}, {"Mbit/s", 1e6}, {"Kbit/s", 1e3}} {
		if b >= u.v {
			return strconv.FormatFloat(b/u.v, 'g', 4, 64) + " " + u.s
		}
	}
	return strconv.FormatFloat(b, 'g', 4, 64) + " bit/s"
}

// wireQueueLimit bounds the bytes in one connection's wire queue (about
// 3 ms at 10 Gbit/s): senders that get further ahead of the link block.
const wireQueueLimit = 4 << 20

// wire delivers a connection's emulated traffic.
type wire struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []wireItem
	bytes  int
	closed bool
	bufs   sync.Pool
}

type wireItem struct {
	due time.Time
	buf *[]byte
}

var errWireClosed = errors.New("fabric: connection closed")

// sendEmulated queues the batched packets for delivery at their arrival
// time. Caller holds sendMu.
func (c *Conn) sendEmulated(l *Link) error {
	n := 0
	for _, b := range c.iov {
		n += len(b)
	}
	due := l.reserve(n)
	w := c.wire
	bp, _ := w.bufs.Get().(*[]byte)
	if bp == nil || cap(*bp) < n {
		b := make([]byte, 0, max(n, 64<<10))
		bp = &b
	}
	buf := (*bp)[:0]
	for _, b := range c.iov {
		buf = append(buf, b...)
	}
	*bp = buf
	w.mu.Lock()
	for !w.closed && w.bytes > 0 && w.bytes+n > wireQueueLimit {
		w.cond.Wait()
	}
	if w.closed {
		w.mu.Unlock()
		return errWireClosed
	}
	w.items = append(w.items, wireItem{due: due, buf: bp})
	w.bytes += n
	w.cond.Broadcast()
	w.mu.Unlock()
	return nil
}

// runWire is the connection's delivery goroutine.
func (c *Conn) runWire() {
	runtime.LockOSThread() // precise sleeps need this thread's timer slack
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	w := c.wire
	for {
		w.mu.Lock()
		for !w.closed && len(w.items) == 0 {
			w.cond.Wait()
		}
		if w.closed {
			w.mu.Unlock()
			return
		}
		it := w.items[0]
		w.items = w.items[1:]
		w.mu.Unlock()
		sleepUntil(it.due)
		c.nc.SetWriteDeadline(time.Now().Add(c.ep.opts.WriteTimeout))
		_, err := c.nc.Write(*it.buf)
		w.mu.Lock()
		w.bytes -= len(*it.buf)
		w.cond.Broadcast()
		w.mu.Unlock()
		w.bufs.Put(it.buf)
		if err != nil {
			c.fail(fmt.Errorf("fabric: sending to %s: %w", c.nc.RemoteAddr(), err))
			return
		}
	}
}

func (w *wire) close() {
	w.mu.Lock()
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
}

// sleepUntil sleeps with nanosleep (this thread has a 1 ns timer slack).
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 2*time.Microsecond {
			return
		}
		ts := unix.NsecToTimespec(int64(d))
		if unix.Nanosleep(&ts, nil) == nil {
			return
		}
	}
}

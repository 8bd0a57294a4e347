package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Link emulates a network link for benchmarks: a full-duplex NIC whose
// egress and ingress bandwidths are each shared by every connection that
// uses it (one Link per node models its NIC, so a tree node's two forwards
// share its egress, and a parity node's K incoming partial streams share
// its ingress, as on real hardware) and a one-way propagation delay. Loopback TCP is CPU-bound; a Link makes the network
// the bottleneck, the regime the seed's experiments measure.
//
// Each batch of packets reserves its transmission time on the link when
// it is sent, is copied into its connection's bounded wire queue, and is
// delivered to the socket when it would arrive: transmission end plus the
// delay. A wire goroutine per connection does the delivery, waiting on a
// timerfd armed with a 1 ns slack (Go's timers have about 1 ms
// granularity on the VMs this runs on); wakeups still vary by some 10-20
// µs there, so emulated delays below that are approximate.
type Link struct {
	rate  float64 // bytes per second; 0 = unlimited
	delay time.Duration

	mu     sync.Mutex
	busy   time.Time // the link is transmitting until then
	inBusy time.Time // the link is receiving until then
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

// receive books n bytes of reception for a packet whose last byte reached
// the socket at arrived, and returns when the NIC would have it all. A
// packet's reception overlaps its transmission (the bits stream in as they
// are sent), so one sender at the link's rate is never delayed; only
// senders that together exceed the rate queue behind each other.
func (l *Link) receive(n int, arrived time.Time) time.Time {
	if l.rate <= 0 {
		return arrived
	}
	d := time.Duration(float64(n) / l.rate * 1e9)
	l.mu.Lock()
	start := arrived.Add(-d)
	if start.Before(l.inBusy) {
		start = l.inBusy
	}
	done := start.Add(d)
	l.inBusy = done
	l.mu.Unlock()
	return done
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
	mu      sync.Mutex
	cond    sync.Cond
	items   []wireItem
	bytes   int
	writing bool // the wire goroutine is delivering an item
	closed  bool
	bufs    sync.Pool
	timer   *wireTimer // the wire goroutine's, while it runs: close wakes it
}

type wireItem struct {
	due time.Time
	buf *[]byte
}

var errWireClosed = errors.New("fabric: connection closed")

// sendEmulated queues the batched packets for delivery, each at its own
// arrival time: a link delivers a packet when its last bit is through,
// not a whole batch at once (which would make every hop store-and-forward).
// Caller holds sendMu.
func (c *Conn) sendEmulated(l *Link) error {
	iov := c.iov
	for len(iov) > 0 {
		// A packet is its 16-byte header, then iov entries making up the
		// payload length the header states (prefix and data).
		hdr := iov[0]
		size := HeaderSize + int(binary.LittleEndian.Uint32(hdr[4:]))
		n, k := len(hdr), 1
		for n < size {
			n += len(iov[k])
			k++
		}
		due := l.reserve(n)
		if sent, err := c.sendNowIfDue(due, iov[:k]); err != nil {
			return err
		} else if !sent {
			if err := c.enqueueWire(due, iov[:k], n); err != nil {
				return err
			}
		}
		iov = iov[k:]
	}
	return nil
}

// sendNowIfDue writes a packet that is due (within a wakeup's latency)
// straight from the sender when nothing is queued ahead of it: most small
// messages on a fast link, which then pay no goroutine hand-off.
func (c *Conn) sendNowIfDue(due time.Time, parts [][]byte) (bool, error) {
	if time.Until(due) > wakeLatency {
		return false, nil
	}
	w := c.wire
	w.mu.Lock()
	idle := !w.closed && len(w.items) == 0 && !w.writing
	w.mu.Unlock()
	if !idle {
		return false, nil // keep the order: queue behind what is waiting
	}
	// Only senders (under sendMu) add items, so the queue stays empty
	// and the wire goroutine is not writing: the deadline is ours to set.
	// (Either side only ever moves it to now+WriteTimeout, so the one
	// last set is never earlier than c.deadline.)
	if now := time.Now(); c.deadline.Sub(now) < c.ep.opts.WriteTimeout/2 {
		c.deadline = now.Add(c.ep.opts.WriteTimeout)
		c.nc.SetWriteDeadline(c.deadline)
	}
	bufs := net.Buffers(parts)
	if _, err := bufs.WriteTo(c.nc); err != nil {
		return true, fmt.Errorf("fabric: sending to %s: %w", c.nc.RemoteAddr(), err)
	}
	return true, nil
}

// enqueueWire copies one packet into the wire queue.
func (c *Conn) enqueueWire(due time.Time, parts [][]byte, n int) error {
	w := c.wire
	bp, _ := w.bufs.Get().(*[]byte)
	if bp == nil || cap(*bp) < n {
		b := make([]byte, 0, max(n, 64<<10))
		bp = &b
	}
	buf := (*bp)[:0]
	for _, b := range parts {
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
	t, err := newWireTimer()
	if err != nil {
		c.fail(fmt.Errorf("fabric: link emulation: %w", err))
		return
	}
	w := c.wire
	w.mu.Lock()
	w.timer = t
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.timer = nil
		t.close()
		w.mu.Unlock()
	}()
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
		w.writing = true
		w.mu.Unlock()
		t.sleepUntil(it.due)
		c.nc.SetWriteDeadline(time.Now().Add(c.ep.opts.WriteTimeout))
		_, err := c.nc.Write(*it.buf)
		w.mu.Lock()
		w.writing = false
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
	if w.timer != nil {
		w.timer.wake() // do not sleep out a long emulated delay
	}
	w.mu.Unlock()
}

// drain waits up to d for everything queued to be delivered.
func (w *wire) drain(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		w.mu.Lock()
		done := w.closed || len(w.items) == 0 && !w.writing
		w.mu.Unlock()
		if done {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// wireTimer sleeps precisely without holding a scheduler slot: a timerfd
// waited on through Go's netpoller. (time.Sleep has about 1 ms
// granularity here, and a blocking nanosleep would keep the goroutine's P
// until sysmon notices, stalling other goroutines for up to 10 ms.)
type wireTimer struct {
	fd int
	f  *os.File
}

func newWireTimer() (*wireTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &wireTimer{fd: fd, f: os.NewFile(uintptr(fd), "link-timer")}, nil
}

func (t *wireTimer) close() { t.f.Close() }

// wake fires the timer now, ending a sleep.
func (t *wireTimer) wake() {
	its := unix.ItimerSpec{Value: unix.Timespec{Nsec: 1}}
	unix.TimerfdSettime(t.fd, 0, &its, nil)
}

// wakeLatency is how late a wakeup typically comes; timers are armed that
// much early.
const wakeLatency = 25 * time.Microsecond

func (t *wireTimer) sleepUntil(due time.Time) {
	d := time.Until(due) - wakeLatency
	if d <= 0 {
		return
	}
	its := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	// The timer takes the slack of the thread that arms it: 1 ns rather
	// than the default 50 µs, which would swamp microsecond delays.
	runtime.LockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	err := unix.TimerfdSettime(t.fd, 0, &its, nil)
	runtime.UnlockOSThread()
	if err != nil {
		return
	}
	var b [8]byte
	t.f.Read(b[:])
}

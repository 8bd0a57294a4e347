package fabric

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestEmulatedInlineSendRefreshesDeadline: a packet due at once is
// written inline by the sender, which must refresh the write deadline the
// wire goroutine left (in the past once the connection has idled longer
// than WriteTimeout), or a healthy pooled connection fails on its next
// small message.
func TestEmulatedInlineSendRefreshesDeadline(t *testing.T) {
	l, err := NewLink(50e6, 0) // 400 Mbit/s: a 1 MiB message is queued
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := NewEndpoint(Options{})
	col := newCollector()
	addr, _ := srv.Listen("127.0.0.1:0", col)
	cli, _ := NewEndpoint(Options{Link: l, WriteTimeout: 300 * time.Millisecond})
	defer func() { cli.Close(); srv.Close() }()
	pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Send(pc.NewID(), []byte("h"), make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	<-col.done
	time.Sleep(500 * time.Millisecond) // idle longer than WriteTimeout
	if err := pc.Send(pc.NewID(), []byte("small")); err != nil {
		t.Fatalf("small message on a healthy, idle emulated connection: %v", err)
	}
	select {
	case <-col.done:
	case <-time.After(2 * time.Second):
		t.Fatal("small message never arrived")
	}
}

// TestEmulatedInlineSendHasDeadline: on a link whose packets are always
// due at once every send is written inline; a peer that stops reading
// must still make it fail after WriteTimeout, not block it for good.
func TestEmulatedInlineSendHasDeadline(t *testing.T) {
	l, _ := NewLink(0, 0)
	srv, _ := NewEndpoint(Options{})
	col := newCollector()
	col.hold = true // keeps every packet: the server stops reading after its quota
	addr, _ := srv.Listen("127.0.0.1:0", col)
	cli, _ := NewEndpoint(Options{Link: l, WriteTimeout: 300 * time.Millisecond})
	defer func() { cli.Close(); srv.Close() }()
	pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pc.Send(pc.NewID(), []byte("h"), make([]byte, 256<<20)) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("256 MiB sent to a peer that does not read")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("send to a peer that stopped reading still blocked after 5s (WriteTimeout 300ms)")
	}
}

// TestEmulatedAccessErrorNotice: an access error's notice queued on an
// emulated link's wire is delivered before the connection closes, so the
// initiator learns why (an AccessError), not just that it closed.
func TestEmulatedAccessErrorNotice(t *testing.T) {
	l, _ := NewLink(0, time.Millisecond) // delivery is queued, not inline
	srv, _ := NewEndpoint(Options{Link: l})
	addr, _ := srv.Listen("127.0.0.1:0", newCollector())
	cli, _ := NewEndpoint(Options{})
	defer func() { cli.Close(); srv.Close() }()
	pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	err = pc.Read(context.Background(), 12345, 0, make([]byte, 100))
	var ae *AccessError
	if !errors.As(err, &ae) {
		t.Fatalf("READ of an unknown region key over an emulated link: %v (want an AccessError)", err)
	}
}

// TestEmulatedCloseWakesWire: closing a connection ends its wire
// goroutine at once, even while it sleeps out a long emulated delay.
func TestEmulatedCloseWakesWire(t *testing.T) {
	l, _ := NewLink(0, 900*time.Millisecond)
	srv, _ := NewEndpoint(Options{})
	addr, _ := srv.Listen("127.0.0.1:0", newCollector())
	cli, _ := NewEndpoint(Options{Link: l})
	defer func() { cli.Close(); srv.Close() }()
	pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Send(pc.NewID(), []byte("h")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the wire goroutine is asleep
	w := pc.Conn.wire
	start := time.Now()
	pc.Close()
	for {
		w.mu.Lock()
		running := w.timer != nil
		w.mu.Unlock()
		if !running {
			break
		}
		if time.Since(start) > 500*time.Millisecond {
			t.Fatal("wire goroutine still running 500ms after close (delay 900ms)")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLinkReceive: one sender at the link's rate streams through the
// ingress without delay; two packets that arrive together share it, the
// second done one transmission time later; an idle gap is not banked.
func TestLinkReceive(t *testing.T) {
	l, _ := NewLink(1e6, 0) // 1 MB/s: 1000 bytes take 1 ms
	ms := time.Millisecond
	t0 := time.Unix(1000, 0)
	for i := range 3 { // back to back, as one sender at this rate delivers
		at := t0.Add(time.Duration(i) * ms)
		if got := l.receive(1000, at); !got.Equal(at) {
			t.Fatalf("packet %d of one sender: done %v after arrival, want at once", i, got.Sub(at))
		}
	}
	at := t0.Add(10 * ms)
	l.receive(1000, at)
	if got := l.receive(1000, at); got.Sub(at) != ms {
		t.Fatalf("second of two simultaneous packets done %v after arrival, want 1ms", got.Sub(at))
	}
	late := t0.Add(time.Second)
	if got := l.receive(1000, late); !got.Equal(late) {
		t.Fatalf("after an idle second: done %v after arrival, want at once", got.Sub(late))
	}
	if got := (&Link{}).receive(1<<20, late); !got.Equal(late) {
		t.Fatal("an unlimited link delayed a packet")
	}
}

// TestEmulatedIngressIsShared: two senders, each at the full rate of its
// own link, into one receiver with a link of the same rate: the receiver's
// ingress carries both, so the pair takes at least twice as long as one
// sender alone would (a lower bound, which a slow machine only raises).
func TestEmulatedIngressIsShared(t *testing.T) {
	const rate, size = 50e6, 4 << 20 // 4 MiB alone: 84 ms
	mk := func() *Link { l, _ := NewLink(rate, 0); return l }
	srv, _ := NewEndpoint(Options{Link: mk()})
	col := newCollector()
	addr, _ := srv.Listen("127.0.0.1:0", col)
	defer srv.Close()
	var pcs []*PeerConn
	for range 2 {
		cli, _ := NewEndpoint(Options{Link: mk()})
		defer cli.Close()
		pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
		if err != nil {
			t.Fatal(err)
		}
		pcs = append(pcs, pc)
	}
	start := time.Now()
	errs := make(chan error, 2)
	for i, pc := range pcs {
		// Distinct ids: the collector keys messages by id alone.
		go func() { errs <- pc.Send(uint64(i+1), []byte("h"), make([]byte, size)) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case <-col.done:
		case <-time.After(10 * time.Second):
			t.Fatal("messages not delivered")
		}
	}
	if el, min := time.Since(start), time.Duration(2*size/rate*1e9*0.9); el < min {
		t.Fatalf("two 4 MiB messages into one 50 MB/s ingress took %v; the ingress alone needs %v", el, min)
	}
}

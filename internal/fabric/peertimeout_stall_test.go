package fabric

import (
	"runtime"
	"testing"
	"time"
)

// TestPeerTimeoutSpareStalledReader: a peer that is up but stops reading
// for a while (its handler holds every receive buffer: a slow disk) keeps
// acknowledging at the TCP level with a zero window. Linux (since 5.11)
// applies TCP_USER_TIMEOUT to zero-window probes too, so such a reader is
// cut after PeerTimeout, not WriteTimeout (documented on both); one
// stalled for less than that must be spared, and the transfer finish once
// it reads again.
func TestPeerTimeoutSpareStalledReader(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_USER_TIMEOUT is Linux's")
	}
	// The peer timeout well above the stall: under -race and a loaded
	// machine the reader, once resumed, can fall silent for seconds.
	const peer, stall = 15 * time.Second, 2 * time.Second
	col := newCollector()
	col.hold = true
	_, _, pc := pair(t, Options{Quota: 2, PeerTimeout: peer, WriteTimeout: 60 * time.Second}, col)
	data := make([]byte, 32<<20) // far more than the socket buffers hold
	sent := make(chan error, 1)
	go func() { sent <- pc.Send(pc.NewID(), []byte("h"), data) }()
	select {
	case err := <-sent:
		t.Fatalf("send ended while the reader was stalled: %v", err)
	case err := <-col.closed:
		t.Fatalf("the stalled reader's connection closed (%v) before PeerTimeout", err)
	case <-time.After(stall):
	}
	col.mu.Lock()
	col.hold = false
	for _, p := range col.held {
		p.Release()
	}
	col.held = nil
	col.mu.Unlock()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatalf("send after the reader resumed: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("send did not finish after the reader resumed")
	}
	select {
	case <-col.done:
	case err := <-col.closed:
		t.Fatalf("connection closed: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("message not delivered after the reader resumed")
	}
}

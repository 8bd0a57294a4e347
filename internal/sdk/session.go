package sdk

import (
	"context"
	"math/rand/v2"
	"time"
)

// A put's session: the put creates its temporary file as one of a lock
// session at meta (metaapi.CreateReq.TempSession), renewed here while it
// writes. Should the put die (kill -9, a crashed host), the renewals
// stop, the session lapses, and meta removes the file after its grace
// period, freeing its chunks.

// putSession is a session kept alive until end is called.
type putSession struct {
	id   uint64
	stop chan struct{}
	done chan struct{}
}

// startPutSession starts a new session, renewed at once (which tells
// its lease) and then a third of the lease after each renewal.
func (c *Client) startPutSession() *putSession {
	s := &putSession{id: rand.Uint64() | 1, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		lease, wait := 30*time.Second, time.Duration(0) // until meta says
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(wait):
			}
			wait = lease / 3
			ctx, cancel := context.WithTimeout(context.Background(), lease/3)
			resp, err := c.LockSession(ctx, s.id, false)
			cancel()
			if err != nil {
				c.log.Warn("put: renewing the session of its temporary file", "err", err)
				continue
			}
			if resp.Lease > 0 {
				lease, wait = time.Duration(resp.Lease), time.Duration(resp.Lease)/3
			}
		}
	}()
	return s
}

// end stops the renewals and ends the session at meta.
func (c *Client) endPutSession(s *putSession) {
	close(s.stop)
	<-s.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.LockSession(ctx, s.id, true); err != nil {
		c.log.Debug("put: ending its session (it lapses with the lease)", "err", err)
	}
}

// Package lograte keeps a flood of one kind of event (refused
// connections, refused credentials) from flooding the log too: of the
// events it is told about, at most one a second is to be logged, and that
// one carries how many were skipped since the last one logged.
package lograte

import (
	"sync"
	"time"
)

// Every is the least time between two events logged.
const Every = time.Second

// Limiter decides which events to log. The zero value is ready; it is
// safe for concurrent use.
type Limiter struct {
	mu      sync.Mutex
	skipped int
	last    time.Time
}

// Allow reports whether the event at now is one to log and, if it is,
// how many events were skipped since the last one logged.
func (l *Limiter) Allow(now time.Time) (ok bool, skipped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < Every {
		l.skipped++
		return false, 0
	}
	skipped, l.skipped, l.last = l.skipped, 0, now
	return true, skipped
}

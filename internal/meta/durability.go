package meta

import (
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// durability tracks which applied batches are known to be on disk.
// Batches are applied in sequence order under Service.mu, and pebble's WAL
// is sequential, so when the fsync for batch n completes, every batch up
// to n is durable.
type durability struct {
	mu      sync.Mutex
	cond    sync.Cond
	applied uint64 // written under Service.mu as well as dur.mu
	durable uint64
	err     error
}

func (d *durability) init() { d.cond.L = &d.mu }

func (d *durability) commit() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.applied++
	return d.applied
}

func (d *durability) committed() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.applied
}

func (d *durability) done(seq uint64) {
	d.mu.Lock()
	if seq > d.durable {
		d.durable = seq
	}
	d.mu.Unlock()
	d.cond.Broadcast()
}

func (d *durability) fail(err error) {
	d.mu.Lock()
	if d.err == nil {
		d.err = err
	}
	d.mu.Unlock()
	d.cond.Broadcast()
}

func (d *durability) wait(seq uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.durable < seq && d.err == nil {
		d.cond.Wait()
	}
	if d.durable < seq {
		return metaapi.Errorf(metaapi.EIO, "write-ahead log sync failed: %v", d.err)
	}
	return nil
}

// pebbleLogger routes pebble's messages to slog.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error("pebble fatal: " + fmt.Sprintf(format, args...))
	os.Exit(1)
}

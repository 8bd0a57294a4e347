package store

import (
	"context"
	"fmt"
	"log/slog"
)

// pebbleLogger routes pebble's chatter into the store's slog.Logger: its
// informational messages (compactions, WAL recovery) at Debug so they stay
// quiet by default, its errors at Error.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...), "component", "pebble")
	}
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf must not return: pebble calls it when continuing would corrupt
// the index.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error(msg, "component", "pebble")
	panic("store: pebble: " + msg)
}

package connlimit

import (
	"errors"
	"log/slog"
	"net"
)

// Log logs a refusal from Admit at Warn level, if it is one to report
// (at most one a second); server names who refused.
func Log(log *slog.Logger, server string, remote net.Addr, err error) {
	var r *Refused
	if !errors.As(err, &r) || !r.Report {
		return
	}
	log.Warn(server+": refusing connections", "peer", remote, "why", r.Error(), "also_refused_since_last_report", r.Suppressed)
}

// Listener admits the connections its inner listener accepts through a
// Limiter: one refused is closed at once and Accept goes on to the next;
// one admitted holds its slot until it is closed. For servers (net/http)
// that own their accept loop; a server whose connections must stay
// *net.TCPConn (for writev) calls Admit itself.
type Listener struct {
	net.Listener
	lim *Limiter
	log *slog.Logger
	srv string
}

// NewListener wraps ln; refusals are logged to log as server's.
func NewListener(ln net.Listener, lim *Limiter, log *slog.Logger, server string) *Listener {
	return &Listener{Listener: ln, lim: lim, log: log, srv: server}
}

// Accept returns the next admitted connection.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		release, err := l.lim.Admit(nc.RemoteAddr())
		if err != nil {
			Log(l.log, l.srv, nc.RemoteAddr(), err)
			nc.Close()
			continue
		}
		return &conn{Conn: nc, release: release}, nil
	}
}

// conn frees its slot when closed.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

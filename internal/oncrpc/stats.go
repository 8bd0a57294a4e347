package oncrpc

import (
	"bufio"
	"sync/atomic"
)

// Stats count a TCP transport's traffic, for the NFS benchmark's bytes
// copied per byte delivered. Copied is bytes the code copied in memory:
// reply data into the reply record (xdr.Writer.Copied) and record bytes
// that passed through the buffered reader's buffer (reads smaller than
// the buffer are filled into it by the socket, then copied out). The
// socket's own copies, one at each end per byte, are not in it.
type Stats struct {
	Calls    int64 // calls answered (server) or made (client)
	BytesIn  int64 // record bytes read
	BytesOut int64 // record bytes written
	Copied   int64
}

type counters struct {
	calls, in, out, copied atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{Calls: c.calls.Load(), BytesIn: c.in.Load(), BytesOut: c.out.Load(), Copied: c.copied.Load()}
}

// countingReader reads through a bufio.Reader and counts what it copies
// out of its buffer: a read that finds the buffer empty and is at least
// its size goes straight from the socket to the caller.
type countingReader struct {
	br *bufio.Reader
	c  *counters
}

func (r countingReader) Read(p []byte) (int, error) {
	direct := r.br.Buffered() == 0 && len(p) >= r.br.Size()
	n, err := r.br.Read(p)
	r.c.in.Add(int64(n))
	if !direct {
		r.c.copied.Add(int64(n))
	}
	return n, err
}

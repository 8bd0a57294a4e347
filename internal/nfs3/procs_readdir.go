package nfs3

import (
	"context"
	"encoding/binary"
	"sync"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/xdr"
)

// readdir serves READDIR and (plus) READDIRPLUS.
func (g *Gateway) readdir(ctx context.Context, r *xdr.Reader, w *xdr.Writer, plus bool) bool {
	ino, herr := g.handleArg(ctx, r)
	cookie := r.Uint64()
	verf := r.Uint64()  // cookieverf3: 8 opaque bytes, read as a number
	count := r.Uint32() // READDIR: count; READDIRPLUS: dircount
	if plus {
		count = r.Uint32() // maxcount bounds the whole reply
	}
	if r.Err() != nil {
		return false
	}
	fail := func(st Status, a *metaapi.Attr) bool {
		w.Uint32(uint32(st))
		putPostOp(w, a)
		return true
	}
	if herr != nil {
		return fail(handleErrStatus(herr), nil)
	}
	a, st := g.getAttrErr(ctx, ino)
	if st != OK {
		return fail(st, nil)
	}
	if a.Type != metaapi.TypeDir {
		return fail(ErrNotdir, &a)
	}
	// Every call, not only the first: entries a listing holds are served
	// without asking meta.
	if !may(ctx, &a, metaapi.MayRead) {
		return fail(ErrAcces, &a)
	}
	var ls *listing
	if cookie == 0 {
		verf, ls = g.lists.start(ino)
	} else if ls = g.lists.get(verf, ino); ls == nil {
		// A listing the gateway no longer holds (evicted, or a restart):
		// list again up to the cookie's place, under a new verifier,
		// rather than make the client start over. (Entries added or
		// removed meanwhile shift places, as on any NFS server.)
		verf, ls = g.lists.start(ino)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for uint64(len(ls.ents)) < cookie && !ls.done {
		if err := g.nextPage(ctx, ls); err != nil {
			return fail(statusOf(err), &a)
		}
	}
	if cookie > uint64(len(ls.ents)) {
		return fail(ErrBadCookie, &a) // past the end of the directory
	}
	// Entries from the listing, fetching pages from meta as it runs
	// out, until the reply is full or the directory ends.
	budget := int(min(count, MaxData)) - 128 // less the reply's fixed part
	if budget <= 0 {
		return fail(ErrToosmall, &a)
	}
	// READDIRPLUS asks meta for each entry's attributes: bound how many
	// one call may cost.
	maxEntries := 4096
	if plus {
		maxEntries = 512
	}
	perEntry := func(name string) int {
		n := 4 + 8 + 4 + len(name) + xdr.Pad(len(name)) + 8
		if plus {
			n += 4 + 84 + 4 + 4 + handleLen
		}
		return n
	}
	type entry struct {
		d    metaapi.Dirent
		attr *metaapi.Attr
	}
	var entries []entry
	used, pos, eof := 0, int(cookie), false
	for {
		if pos == len(ls.ents) {
			if ls.done {
				eof = true
				break
			}
			if err := g.nextPage(ctx, ls); err != nil {
				return fail(statusOf(err), &a)
			}
			continue
		}
		d := ls.ents[pos]
		if used+perEntry(string(d.Name)) > budget || len(entries) == maxEntries {
			break
		}
		used += perEntry(string(d.Name))
		entries = append(entries, entry{d: d})
		pos++
	}
	if len(entries) == 0 && !eof {
		return fail(ErrToosmall, &a)
	}
	if plus {
		// Attributes of the entries, a few at a time.
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for i := range entries {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				entries[i].attr = g.attrOf(ctx, entries[i].d.Ino)
			}()
		}
		wg.Wait()
	}
	w.Uint32(uint32(OK))
	putPostOp(w, &a)
	var vb [8]byte
	binary.BigEndian.PutUint64(vb[:], verf)
	w.Fixed(vb[:])
	first := int(cookie)
	for i, e := range entries {
		w.Bool(true)
		w.Uint64(uint64(e.d.Ino))
		w.String(string(e.d.Name))
		w.Uint64(uint64(first + i + 1)) // its place in the listing
		if plus {
			putPostOp(w, e.attr)
			g.putPostFH(ctx, w, e.d.Ino)
		}
	}
	w.Bool(false)
	w.Bool(eof)
	return true
}

// nextPage extends listing ls (whose mu the caller holds) by the next
// page meta lists.
func (g *Gateway) nextPage(ctx context.Context, ls *listing) error {
	after := ""
	if len(ls.ents) > 0 {
		after = string(ls.ents[len(ls.ents)-1].Name)
	}
	page, more, err := g.cl.ReadDirPage(ctx, ls.dir, after)
	if err == nil {
		g.lists.add(ls, page, !more)
	}
	return err
}

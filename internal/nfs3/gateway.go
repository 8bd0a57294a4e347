package nfs3

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Options configure a Gateway.
type Options struct {
	Client *sdk.Client
	Logger *slog.Logger
	// AttrTTL is how long the gateway trusts a file's attributes (size,
	// for READ's end of file) before asking meta again; other clients'
	// changes show within it. Default 1 s.
	AttrTTL time.Duration
	// CacheBytes bounds the read cache of file data (blocks of 1 MiB
	// that READ serves without asking the storage nodes): 0 is 256 MiB,
	// negative turns the cache off. Blocks pinned by replies still being
	// sent may hold memory beyond it (at most a block per READ in
	// flight). See cache.go.
	CacheBytes int64
	// Exports is the export table (see package nfsexport); nil is
	// nfsexport.Default(): the whole namespace, read-write, to this
	// machine only, root squashed, from reserved ports.
	Exports []nfsexport.Export
	// HandleKey MACs file handles, so that no client can make the
	// handle of a file outside its export. Handles stay valid across
	// restarts while the key stays the same; empty is a random key
	// (handles die with the gateway).
	HandleKey []byte
}

// Gateway serves the cluster's namespace over NFSv3.
type Gateway struct {
	cl   *sdk.Client
	log  *slog.Logger
	ttl  time.Duration
	verf [8]byte // write verifier: new at every start (RFC 1813 §3.3.7)

	filesMu sync.Mutex
	files   map[ids.Ino]*openFile

	lists listings

	statMu sync.Mutex
	stat   metaapi.StatusResp
	statAt time.Time

	bufs sync.Pool // READ buffers of MaxData bytes

	cache *blockCache // nil: no read cache

	exports     []*export
	exportTable []nfsexport.Export // the same, for nfsexport.Find
	exportByID  map[uint32]*export
	handles     *handles
}

// openFile is an SDK handle the gateway keeps for READ and WRITE, so a
// sequential read costs no meta call per request.
type openFile struct {
	f  *sdk.File
	at time.Time // when its attributes were fetched
}

// maxOpenFiles bounds the handles kept.
const maxOpenFiles = 4096

// New returns a gateway over opts.Client.
func New(opts Options) (*Gateway, error) {
	if opts.Client == nil {
		return nil, fmt.Errorf("nfs3: no client")
	}
	g := &Gateway{cl: opts.Client, log: opts.Logger, ttl: opts.AttrTTL, files: map[ids.Ino]*openFile{}}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.ttl <= 0 {
		g.ttl = time.Second
	}
	if _, err := rand.Read(g.verf[:]); err != nil {
		return nil, fmt.Errorf("nfs3: write verifier: %w", err)
	}
	if opts.Exports == nil {
		opts.Exports = nfsexport.Default()
	}
	g.exportByID, g.exportTable = map[uint32]*export{}, opts.Exports
	for _, e := range opts.Exports {
		x := &export{Export: e, id: exportID(e.Path)}
		if o := g.exportByID[x.id]; o != nil {
			return nil, fmt.Errorf("nfs3: exports %s and %s have the same id in file handles: export one of them under another name", o.Path, e.Path)
		}
		g.exports = append(g.exports, x)
		g.exportByID[x.id] = x
	}
	var err error
	if g.handles, err = newHandles(opts.HandleKey); err != nil {
		return nil, err
	}
	g.lists.init()
	switch {
	case opts.CacheBytes == 0:
		g.cache = newBlockCache(defaultCacheBytes)
	case opts.CacheBytes > 0:
		g.cache = newBlockCache(opts.CacheBytes)
	}
	g.bufs.New = func() any { b := make([]byte, MaxData); return &b }
	return g, nil
}

// Programs returns the NFS and MOUNT programs to serve (on one port: a
// client told that port needs no portmapper).
func (g *Gateway) Programs() []oncrpc.Program {
	return []oncrpc.Program{
		{Prog: ProgNFS, Low: Version, High: Version, Handle: g.nfs, Idempotent: nfsIdempotent},
		{Prog: ProgMount, Low: Version, High: Version, Handle: g.mount},
	}
}

// nfsIdempotent: the procedures whose retransmission must not run again
// (their replies are kept in the duplicate-request cache).
func nfsIdempotent(_, proc uint32) bool {
	switch proc {
	case ProcSetattr, ProcCreate, ProcMkdir, ProcSymlink, ProcMknod, ProcRemove, ProcRmdir, ProcRename, ProcLink:
		return false
	}
	return true
}

// file returns an SDK handle for regular file ino with attributes at
// most AttrTTL old.
func (g *Gateway) file(ctx context.Context, ino ids.Ino) (*sdk.File, error) {
	g.filesMu.Lock()
	of := g.files[ino]
	var at time.Time
	if of != nil {
		at = of.at
	}
	g.filesMu.Unlock()
	if of != nil && time.Since(at) < g.ttl {
		return of.f, nil
	}
	a, err := g.cl.GetAttr(ctx, ino)
	if err != nil {
		return nil, err
	}
	if of != nil {
		old := of.f.Attr()
		if old.Mtime != a.Mtime || old.Size != a.Size || old.Ctime != a.Ctime {
			g.cl.ForgetLayouts(ino) // changed elsewhere: no stale chunk layouts
		}
		if a.Ctime >= old.Ctime { // not older than a write through this handle
			of.f.SetAttr(a)
		}
		g.filesMu.Lock()
		of.at = time.Now()
		g.filesMu.Unlock()
		return of.f, nil
	}
	f, err := g.cl.OpenAttr(a, fmt.Sprintf("inode %d", ino))
	if err != nil {
		return nil, err
	}
	g.filesMu.Lock()
	if len(g.files) >= maxOpenFiles {
		for k := range g.files { // drop one at random
			delete(g.files, k)
			break
		}
	}
	g.files[ino] = &openFile{f: f, at: time.Now()}
	g.filesMu.Unlock()
	return f, nil
}

// forget drops what the gateway keeps of ino (after a change through it
// that the SDK handle does not see: SETATTR, REMOVE, RENAME over it),
// its cached data included.
func (g *Gateway) forget(ino ids.Ino) {
	g.filesMu.Lock()
	delete(g.files, ino)
	g.filesMu.Unlock()
	g.invalidate(ino)
}

// invalidate drops ino's cached data (after a change through the
// gateway: the next READ reads it afresh).
func (g *Gateway) invalidate(ino ids.Ino) {
	if g.cache != nil {
		g.cache.invalidate(ino)
	}
}

// CacheStats reports the read cache's hits (blocks READ found cached,
// or being filled by another READ: one READ across two blocks looks up
// two), misses (blocks filled from the cluster) and the bytes its blocks
// are charged; all zero with the cache off.
func (g *Gateway) CacheStats() (hits, misses, bytes int64) {
	if g.cache == nil {
		return 0, 0, 0
	}
	return g.cache.stats()
}

// status returns the cluster's status, cached for a second (FSSTAT).
func (g *Gateway) status(ctx context.Context) (metaapi.StatusResp, error) {
	g.statMu.Lock()
	defer g.statMu.Unlock()
	if time.Since(g.statAt) > time.Second {
		st, err := g.cl.Status(ctx)
		if err != nil {
			return st, err
		}
		g.stat, g.statAt = st, time.Now()
	}
	return g.stat, nil
}

// killPrivs drops the set-user-ID and set-group-ID bits of a file an
// unprivileged caller is about to write, as a write(2) does (knfsd
// writes as the caller, and the kernel drops them); the write's record
// at meta then brings back the file's new mode.
func (g *Gateway) killPrivs(ctx context.Context, f *sdk.File) Status {
	a := f.Attr()
	if accessOf(ctx).who.UID == 0 || metaapi.KillSuidgid(a.Type, a.Mode) == a.Mode {
		return OK
	}
	if _, err := g.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: a.Ino, KillSuidgid: true}); err != nil {
		return statusOf(err)
	}
	return OK
}

// ---- directory listings ----

// Meta lists a directory in name order from a name; NFS resumes from a
// 64-bit cookie. A listing remembers the names it returned, so cookie n
// (the n-th entry) resumes after the n-th name; its cookie verifier names
// it. For a listing the gateway no longer holds (evicted, or a restart),
// READDIR lists again up to the cookie's place under a new verifier; a
// cookie past the end is NFS3ERR_BAD_COOKIE.
type listings struct {
	mu       sync.Mutex
	m        map[uint64]*listing
	bytes    int64 // memory of the entries held in all listings
	maxBytes int64
}

type listing struct {
	mu      sync.Mutex // one READDIR at a time extends it
	evicted bool       // no longer held (guarded by listings.mu)
	dir     ids.Ino
	ents    []metaapi.Dirent
	done    bool // every entry is in ents
	used    time.Time
}

// Bounds on what listings hold: their count, and the memory of their
// entries (names are up to 255 bytes, so a bound on entries alone would
// let long names take gigabytes).
const (
	maxListings     = 1024
	maxListingBytes = 256 << 20
	direntOverhead  = 48 // a Dirent's fixed part and the name's header
)

// entriesBytes is the memory ents hold.
func entriesBytes(ents []metaapi.Dirent) int64 {
	n := int64(len(ents)) * direntOverhead
	for _, e := range ents {
		n += int64(len(e.Name))
	}
	return n
}

func (l *listings) init() { l.m, l.maxBytes = map[uint64]*listing{}, maxListingBytes }

// start begins a listing of dir and returns its verifier.
func (l *listings) start(dir ids.Ino) (uint64, *listing) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evictLocked(nil)
	// Random verifiers: one caller cannot guess another's listing, and
	// they differ across restarts.
	var verf uint64
	for verf == 0 || l.m[verf] != nil {
		var b [8]byte
		rand.Read(b[:])
		verf = binary.BigEndian.Uint64(b[:])
	}
	ls := &listing{dir: dir, used: time.Now()}
	l.m[verf] = ls
	return verf, ls
}

// get returns listing verf of dir, if held.
func (l *listings) get(verf uint64, dir ids.Ino) *listing {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.m[verf]
	if ls == nil || ls.dir != dir {
		return nil
	}
	ls.used = time.Now()
	return ls
}

// add records entries appended to ls (whose mu the caller holds; ents is
// read under either lock).
func (l *listings) add(ls *listing, ents []metaapi.Dirent, done bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls.ents = append(ls.ents, ents...)
	ls.done = done
	if !ls.evicted {
		l.bytes += entriesBytes(ents)
		l.evictLocked(ls)
	}
}

// evictLocked drops the least recently used listings, never keep, while
// over bounds.
func (l *listings) evictLocked(keep *listing) {
	for len(l.m) >= maxListings || l.bytes > l.maxBytes {
		var oldest uint64
		var at time.Time
		for v, ls := range l.m {
			if ls != keep && (oldest == 0 || ls.used.Before(at)) {
				oldest, at = v, ls.used
			}
		}
		if oldest == 0 {
			return
		}
		ls := l.m[oldest]
		ls.evicted = true
		l.bytes -= entriesBytes(ls.ents)
		delete(l.m, oldest)
	}
}

package nfs3

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
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
	// BufferBytes bounds the memory of write-behind and read-ahead
	// (sdk.Buffered) over every file: 0 is 256 MiB, negative none of
	// either (every WRITE written through, FILE_SYNC).
	BufferBytes int64
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
	verf verifier

	bufOpts sdk.BufferOptions // for each file's write-behind and read-ahead

	filesMu sync.Mutex
	files   map[ids.Ino]*openFile
	// closing holds the handles dropped from files whose buffered writes
	// are still being sent: COMMIT waits for them too.
	closing map[ids.Ino][]*openFile

	lists listings

	// testHookOpened, if set (tests), runs after a handle is opened and
	// before the gateway keeps it.
	testHookOpened func(ids.Ino)

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
// sequential read costs no meta call per request, with its write-behind
// and read-ahead (kept across the stateless RPCs, per file).
type openFile struct {
	f  *sdk.File
	b  *sdk.Buffered
	at time.Time // when its attributes were fetched

	closed   chan struct{} // closed once dropped and flushed (see closeFile)
	closeErr error         // set before closed is closed

	// gone says the file has been removed through the gateway: its
	// buffered writes are dropped, and their failures are no loss (no
	// one can read the file any more), so the verifier stays.
	gone atomic.Bool
}

// defaultBufferBytes bounds write-behind and read-ahead when
// Options.BufferBytes is 0.
const defaultBufferBytes = 256 << 20

// idleFlush is how long UNSTABLE writes wait in the gateway for the next
// before they are sent anyway (a client that never COMMITs).
const idleFlush = 200 * time.Millisecond

// maxOpenFiles bounds the handles kept.
const maxOpenFiles = 4096

// New returns a gateway over opts.Client.
func New(opts Options) (*Gateway, error) {
	if opts.Client == nil {
		return nil, fmt.Errorf("nfs3: no client")
	}
	g := &Gateway{cl: opts.Client, log: opts.Logger, ttl: opts.AttrTTL, files: map[ids.Ino]*openFile{}, closing: map[ids.Ino][]*openFile{}}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.ttl <= 0 {
		g.ttl = time.Second
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("nfs3: write verifier: %w", err)
	}
	g.verf.v = binary.BigEndian.Uint64(seed[:])
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
	g.bufOpts = sdk.BufferOptions{Sequential: 1, IdleFlush: idleFlush}
	if g.cache != nil {
		// Read ahead in the cache's blocks, from its spare buffers, so
		// that a block read ahead becomes a cache block without a copy.
		g.bufOpts.ReadAheadBlock, g.bufOpts.Alloc = blockSize, g.cache.spare
	}
	switch {
	case opts.BufferBytes < 0:
		g.bufOpts.WriteBuffer, g.bufOpts.ReadAhead = -1, -1
	case opts.BufferBytes == 0:
		g.bufOpts.Budget = sdk.NewBudget(defaultBufferBytes)
	default:
		g.bufOpts.Budget = sdk.NewBudget(opts.BufferBytes)
	}
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

// lost changes the write verifier: writes to ino answered UNSTABLE may
// not have reached the cluster, and clients holding them must send them
// again.
func (g *Gateway) lost(ino ids.Ino, err error) {
	g.log.Warn("nfs: buffered writes failed; changing the write verifier", "ino", ino, "err", err)
	g.verf.lost()
}

// settle makes what the gateway buffered for ino durable and recorded
// with meta (before its attributes are reported or changed).
func (g *Gateway) settle(ctx context.Context, ino ids.Ino) error {
	// The kept handle and the dropped ones in one look: a handle dropped
	// between two looks (forget) would be in neither, its writes not
	// waited for. One dropped after this look is flushed here, or by its
	// close, which this Flush waits for.
	g.filesMu.Lock()
	of := g.files[ino]
	closing := slices.Clone(g.closing[ino])
	g.filesMu.Unlock()
	if err := waitClosed(ctx, closing); err != nil {
		return err
	}
	if of == nil || !of.b.Pending() {
		return nil
	}
	// A failure lost buffered writes: the file's verifier changed already
	// (sdk.Buffered calls OnLost, g.lost, at every loss, and only then).
	return of.b.Flush(ctx)
}

// waitClosing waits until the handles of ino the gateway dropped have sent
// what they buffered, and returns their failure.
func (g *Gateway) waitClosing(ctx context.Context, ino ids.Ino) error {
	g.filesMu.Lock()
	closing := slices.Clone(g.closing[ino])
	g.filesMu.Unlock()
	return waitClosed(ctx, closing)
}

// waitClosed waits until the dropped handles closing have sent what they
// buffered, and returns their failure.
func waitClosed(ctx context.Context, closing []*openFile) error {
	for _, c := range closing {
		select {
		case <-c.closed:
			if c.closeErr != nil {
				return c.closeErr // the verifier changed already
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// file returns an SDK handle for regular file ino with attributes at
// most AttrTTL old.
func (g *Gateway) file(ctx context.Context, ino ids.Ino) (*openFile, error) {
	g.filesMu.Lock()
	of := g.files[ino]
	var at time.Time
	if of != nil {
		at = of.at
	}
	g.filesMu.Unlock()
	if of != nil && (time.Since(at) < g.ttl || of.b.Pending()) {
		// (With writes buffered, meta's attributes lag this handle's.)
		return of, nil
	}
	if of == nil {
		return g.open(ctx, ino)
	}
	a, err := g.cl.GetAttr(ctx, ino)
	if err != nil {
		return nil, err
	}
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
	return of, nil
}

// open opens a handle of ino for the gateway to keep, or returns the one
// another call opened meanwhile.
func (g *Gateway) open(ctx context.Context, ino ids.Ino) (*openFile, error) {
	for {
		// A dropped handle's writes go first: older, they must not land
		// on top of writes through a new one, whose attributes include
		// them. (Its failure is not this call's: the verifier changed,
		// and COMMIT reports it.)
		if err := g.waitClosing(ctx, ino); ctx.Err() != nil {
			return nil, err
		}
		a, err := g.cl.GetAttr(ctx, ino)
		if err != nil {
			return nil, err
		}
		f, err := g.cl.OpenAttr(a, fmt.Sprintf("inode %d", ino))
		if err != nil {
			return nil, err
		}
		of := &openFile{f: f, at: time.Now()}
		bo := g.bufOpts
		bo.OnLost = func(err error) {
			if of.gone.Load() {
				g.log.Debug("nfs: buffered writes to a removed file dropped", "ino", ino, "err", err)
				return
			}
			g.lost(ino, err)
		}
		of.b = sdk.NewBuffered(f, bo)
		if g.testHookOpened != nil {
			g.testHookOpened(ino)
		}
		g.filesMu.Lock()
		if cur := g.files[ino]; cur != nil { // another call opened it meanwhile
			g.filesMu.Unlock()
			return cur, nil
		}
		if g.sendingLocked(ino) {
			// Another call opened one meanwhile, wrote through it and
			// dropped it, its writes still on their way: wait for them
			// and read the attributes again.
			g.filesMu.Unlock()
			continue
		}
		g.insertLocked(ino, of)
		g.filesMu.Unlock()
		return of, nil
	}
}

// sendingLocked reports whether a dropped handle of ino is still sending
// its buffered writes. Caller holds filesMu.
func (g *Gateway) sendingLocked(ino ids.Ino) bool {
	for _, c := range g.closing[ino] {
		select {
		case <-c.closed:
		default:
			return true
		}
	}
	return false
}

// insertLocked keeps of as ino's handle. Caller holds filesMu.
func (g *Gateway) insertLocked(ino ids.Ino, of *openFile) {
	if len(g.files) >= maxOpenFiles {
		// Drop one at random, but not one with writes buffered: those
		// must land before any later write to the file (there are at
		// most as many as the budget holds buffers).
		for k, old := range g.files {
			if !old.b.Pending() {
				delete(g.files, k)
				g.closingLocked(k, old)
				break
			}
		}
	}
	g.files[ino] = of
}

// closingLocked starts closing of, just dropped from files, and keeps it
// in closing until it is done. Caller holds filesMu.
func (g *Gateway) closingLocked(ino ids.Ino, of *openFile) {
	of.closed = make(chan struct{})
	g.closing[ino] = append(g.closing[ino], of)
	go g.closeFile(ino, of)
}

// kept reports whether of is still the handle the gateway keeps for ino
// (a write into one dropped meanwhile must not stay buffered in it).
func (g *Gateway) kept(ino ids.Ino, of *openFile) bool {
	g.filesMu.Lock()
	defer g.filesMu.Unlock()
	return g.files[ino] == of
}

// closeFile flushes a handle the gateway no longer keeps and gives back
// its buffers; a failure has changed the write verifier (OnLost) before a
// COMMIT waiting for it, or coming after, can answer.
func (g *Gateway) closeFile(ino ids.Ino, of *openFile) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if of.gone.Load() {
		of.b.Drop() // nobody can read them: not sent
	} else if err := of.b.Close(ctx); !of.gone.Load() {
		of.closeErr = err
	}
	close(of.closed)
	g.filesMu.Lock()
	defer g.filesMu.Unlock()
	cs := g.closing[ino]
	if i := slices.Index(cs, of); i >= 0 {
		cs = slices.Delete(cs, i, i+1)
	}
	if len(cs) == 0 {
		delete(g.closing, ino)
	} else {
		g.closing[ino] = cs
	}
}

// forget drops what the gateway keeps of ino (after a change through it
// that the SDK handle does not see: SETATTR, REMOVE, RENAME over it),
// its cached data included.
func (g *Gateway) forget(ino ids.Ino) {
	g.filesMu.Lock()
	if of := g.files[ino]; of != nil {
		delete(g.files, ino)
		g.closingLocked(ino, of)
	}
	g.filesMu.Unlock()
	g.invalidate(ino)
}

// forgetGone is forget for a file a REMOVE or RENAME through the gateway
// may have removed (its last name gone): if meta no longer knows the
// inode, the handles of it are marked gone first, so that their buffered
// writes are dropped rather than sent and failing, which would change
// the verifier for every client (a temporary file written and removed
// before its writes were sent is common). A failure noted before the
// mark changed the verifier, as any loss does. A file kept (another
// name, open elsewhere) is only forgotten.
func (g *Gateway) forgetGone(ctx context.Context, ino ids.Ino) {
	g.filesMu.Lock()
	held := g.files[ino] != nil || len(g.closing[ino]) > 0
	g.filesMu.Unlock()
	if held {
		if _, err := g.cl.GetAttr(ctx, ino); metaapi.IsCode(err, metaapi.ENOENT) {
			g.filesMu.Lock()
			if of := g.files[ino]; of != nil {
				of.gone.Store(true)
			}
			for _, of := range g.closing[ino] {
				of.gone.Store(true)
			}
			g.filesMu.Unlock()
		}
	}
	g.forget(ino)
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

// Package meta is Sluice's control plane: the namespace (inodes and
// directories with POSIX semantics), file layouts (which chunk lives on
// which storage nodes), per-directory redundancy policies, storage-node
// membership with heartbeats and a cluster epoch, and the minting of the
// capabilities storage nodes check on the data path.
//
// All state lives in one pebble database (DIR/meta.db); keys.go describes
// the key space. Every mutation runs under one mutex as a single pebble
// batch, so multi-key updates (a rename touches two directories, up to two
// inodes and the deletion queue) are atomic. Reads run under a read lock.
//
// Durability and group commit: a mutation applies its batch while holding
// the lock with "sync requested, but don't wait" (pebble's
// ApplyNoSyncWait), releases the lock, and then waits for the WAL fsync.
// Mutations that arrive while an fsync is in flight queue behind it and
// share the next one, so N concurrent creates cost far fewer than N
// fsyncs, yet nothing is acknowledged before it is on disk. Because a
// batch is visible to readers as soon as it is applied, every operation —
// reads included — also waits until everything it could have observed is
// durable before it returns (durability.wait), so no caller ever sees state
// that a crash could take back.
//
// The decision logic is plain Go over a pebble reader or batch (namespace.go,
// layout.go, membership.go) and is tested without HTTP; http.go is a thin
// JSON layer over the Service methods.
package meta

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/time/rate"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/connlimit"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/lograte"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
	"github.com/sluicefs/sluice/internal/placement"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/privfs"
	"github.com/sluicefs/sluice/internal/privfs/privpebble"
	"github.com/sluicefs/sluice/internal/secret"
)

// File names inside the data directory.
const (
	SecretFile = "cluster.secret"
	// CredKeyFile holds the key meta derives its own clients'
	// credentials from (principal.go). Unlike the cluster secret, it has
	// never left meta: holding a node's disk does not make one admin.
	CredKeyFile = "credential.key"
	DBDir       = "meta.db"
)

// Options configure a Service. Zero values take the defaults.
type Options struct {
	Dir               string        // data dir; cluster.secret is created there on first start
	Logger            *slog.Logger  // default: slog.Default()
	HeartbeatInterval time.Duration // told to nodes; default 1s
	NodeTimeout       time.Duration // node marked down after this silence; default 10s
	CapabilityTTL     time.Duration // default 10m
	CapKeyRotate      time.Duration // > CapabilityTTL; default DefaultCapKeyRotate, negative: never (capkeys.go)
	DefaultReplicas   int           // root policy on first start; default 3
	ChunkSize         int64         // chunk size of new files; default metaapi.DefaultChunkSize
	MetaAddr          string        // reported by Status; see also SetMetaAddr
	Now               func() time.Time
	// Seed seeds placement's random choices; 0 picks a random seed.
	Seed uint64
	// SweepInterval is how often a background ticker marks silent nodes
	// down; default HeartbeatInterval. Negative disables the ticker (tests
	// drive Sweep themselves).
	SweepInterval time.Duration
	// OrphanLease is how long a file removed while open (RemoveReq.Keep)
	// outlives its last renewal; default 10m.
	OrphanLease time.Duration
	// RepairGrace is how long a node may be down before meta moves its
	// data elsewhere (a quick restart moves nothing); default 30s.
	RepairGrace time.Duration
	// RepairRate bounds the bytes a second repairs copy or rebuild (0:
	// no bound): the trade-off between restoring redundancy and
	// clients' throughput.
	RepairRate int64
	// LockLease is how long a lock session (a mount holding file locks)
	// keeps its locks without renewing them; default 30s.
	LockLease time.Duration
	// TempGrace is how long a put's temporary file outlives its
	// writer's session (temp.go); default 10m.
	TempGrace time.Duration
	// OrphanGrace is how long a copy a node holds must be found stray
	// (no file needs it there) by the node's inventories before the
	// node is told to delete it; default 1h.
	OrphanGrace time.Duration
	// MinFreeBytes and MinFreePercent are the free space a node must
	// keep to be given new chunks: the bytes, or the percentage of its
	// file system, whichever is more (see space.go). 0 means the default
	// (DefaultMinFreeBytes, DefaultMinFreePercent); negative, none.
	MinFreeBytes   int64
	MinFreePercent float64
	// MaxConns, MaxConnsPerHost: see limitConns.
	MaxConns, MaxConnsPerHost int
	// TLSNames are extra names and addresses meta's TLS certificate
	// carries (tls.go lists the ones it always does).
	TLSNames []string
	// ProbeNodeAddr, if set, checks that meta reaches a registering
	// node at the address it is to be recorded at (DialProbe); a node
	// it fails for is refused with the address named (nodeaddr.go).
	ProbeNodeAddr func(addr string) error

	fs vfs.FS // tests: an in-memory file system for meta.db
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 10 * time.Second
	}
	if o.CapabilityTTL <= 0 {
		o.CapabilityTTL = DefaultCapabilityTTL
	}
	if o.CapKeyRotate == 0 {
		o.CapKeyRotate = DefaultCapKeyRotate
	}
	if o.DefaultReplicas <= 0 {
		o.DefaultReplicas = 3
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = metaapi.DefaultChunkSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = o.HeartbeatInterval
	}
	if o.OrphanLease <= 0 {
		o.OrphanLease = 10 * time.Minute
	}
	if o.RepairGrace <= 0 {
		o.RepairGrace = 30 * time.Second
	}
	if o.LockLease <= 0 {
		o.LockLease = 30 * time.Second
	}
	if o.TempGrace <= 0 {
		o.TempGrace = 10 * time.Minute
	}
	if o.OrphanGrace <= 0 {
		o.OrphanGrace = time.Hour
	}
	if o.MinFreeBytes == 0 {
		o.MinFreeBytes = DefaultMinFreeBytes
	}
	if o.MinFreePercent == 0 {
		o.MinFreePercent = DefaultMinFreePercent
	}
	o.MinFreeBytes, o.MinFreePercent = max(o.MinFreeBytes, 0), max(o.MinFreePercent, 0)
}

// Service is the meta service. Its exported methods are safe for
// concurrent use; each returns *metaapi.Error for every failure a caller
// can act on (other errors are internal and map to EIO).
type Service struct {
	opts    Options
	log     *slog.Logger
	db      *pebble.DB
	sec     secret.Secret
	credKey secret.Secret // meta-only: its clients' credentials (CredKeyFile)
	keys    *capability.Keyring
	ca      *pki.CA
	dur     durability
	princ   atomic.Pointer[principalSet]
	// scopeGen counts moves of directories (scope.go's caches).
	scopeGen atomic.Uint64
	connLim  atomic.Pointer[connlimit.Limiter] // Serve's (conns.go)
	// refusals rate-limits the logging of refused calls (http.go).
	refusals lograte.Limiter

	mu      sync.RWMutex
	closed  bool
	ctr     counters
	capKeys capKeyState // capkeys.go
	nodes   map[ids.NodeID]*member
	// nodeCerts is each node id's current certificate (nodecert.go).
	nodeCerts map[ids.NodeID]nodeCertRec
	rng       *rand.Rand // under mu (write)
	minFree   placement.MinFree
	metaAddr  string
	openedAt  time.Time

	srvMu sync.Mutex
	srv   *http.Server

	stop     chan struct{}
	wg       sync.WaitGroup // background goroutines
	inflight sync.WaitGroup // mutations applied but not yet synced

	repairs *repairQueue
	inv     inventories
	// reportLimits bound how fast each client may report corrupt copies.
	reportLimits reportLimits
	chk          checks
	scanPage     int // chunk records per read lock in the repair scan (tests shrink it)
	// reconcileWait is how long a waiting Reconcile call is held (tests
	// shrink it; metaapi.MaxReconcileWait otherwise).
	reconcileWait time.Duration
	repairLimit   *rate.Limiter // nil: repairs unthrottled
}

// Open opens (creating on first start) the meta service's state in
// opts.Dir.
func Open(opts Options) (*Service, error) {
	opts.setDefaults()
	if opts.Dir == "" {
		return nil, errors.New("meta: no data directory")
	}
	if opts.DefaultReplicas > 16 {
		return nil, fmt.Errorf("meta: default replicas %d out of range 1..16", opts.DefaultReplicas)
	}
	if opts.MinFreePercent >= 100 {
		return nil, fmt.Errorf("meta: a node must keep %g%% of its space free: no node could take anything", opts.MinFreePercent)
	}
	// Everything under the data directory is private to this account,
	// including what an older version left readable by others.
	if err := privfs.CheckDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	if err := privfs.MkdirAll(opts.Dir); err != nil {
		return nil, fmt.Errorf("meta: creating data directory: %w", err)
	}
	if err := privfs.Secure(opts.Dir); err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	fs := opts.fs
	if fs == nil {
		fs = privpebble.FS(vfs.Default)
	}
	sec, err := secret.LoadOrCreate(filepath.Join(opts.Dir, SecretFile))
	if err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	credKey, err := secret.LoadOrCreate(filepath.Join(opts.Dir, CredKeyFile))
	if err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	ca, err := pki.LoadOrCreateCA(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	db, err := pebble.Open(filepath.Join(opts.Dir, DBDir), &pebble.Options{Logger: pebbleLogger{opts.Logger}, FS: fs})
	if err != nil {
		return nil, fmt.Errorf("meta: opening %s: %w", DBDir, err)
	}
	// Only now that meta.db's lock is ours: a meta refused it (another
	// serves this directory) must not remove that one's checkpoints.
	removeCheckpoints(opts.Dir, fs)
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := &Service{
		opts:     opts,
		log:      opts.Logger,
		db:       db,
		sec:      sec,
		credKey:  credKey,
		keys:     capability.NewKeyring(), // openCapKeys sets it
		ca:       ca,
		nodes:    make(map[ids.NodeID]*member),
		rng:      rand.New(rand.NewPCG(seed, seed^0x5eed)),
		minFree:  placement.MinFree{Bytes: opts.MinFreeBytes, Percent: opts.MinFreePercent},
		metaAddr: opts.MetaAddr,
		openedAt: opts.Now(),
		repairs:  newRepairQueue(),
		inv:      newInventories(opts.OrphanGrace),
		stop:     make(chan struct{}),
	}
	s.dur.init()
	if err := s.load(); err != nil {
		db.Close()
		return nil, fmt.Errorf("meta: %w", err)
	}
	if err := s.afterRestore(); err != nil {
		db.Close()
		return nil, fmt.Errorf("meta: %w", err)
	}
	if err := s.openCapKeys(); err != nil {
		db.Close()
		return nil, fmt.Errorf("meta: %w", err)
	}
	if opts.SweepInterval > 0 {
		s.wg.Add(1)
		go s.sweeper()
	}
	s.log.Info("meta service open", "dir", opts.Dir, "epoch", s.ctr.Epoch, "nodes", len(s.nodes),
		"files", s.ctr.Files, "dirs", s.ctr.Dirs, "chunks", s.ctr.Chunks)
	return s, nil
}

// load reads the counters and the node table, initialising a fresh
// database with the root directory and the root policy.
func (s *Service) load() error {
	raw, found, err := getRaw(s.db, keySchema)
	if err != nil {
		return err
	}
	if !found {
		if err := s.initDB(); err != nil {
			return err
		}
		s.nodeCerts = make(map[ids.NodeID]nodeCertRec)
		return s.loadPrincipals()
	}
	if string(raw) == "1" {
		if err := s.indexChunkIDs(); err != nil {
			return fmt.Errorf("bringing %s to schema version %s: %w", DBDir, schemaVersion, err)
		}
		raw = []byte("2")
	}
	if string(raw) == "2" {
		if err := s.indexLinks(); err != nil {
			return fmt.Errorf("bringing %s to schema version %s: %w", DBDir, schemaVersion, err)
		}
	} else if string(raw) != schemaVersion {
		return fmt.Errorf("%s has schema version %q, this build understands %q", DBDir, raw, schemaVersion)
	}
	if ok, err := getJSON(s.db, keyCounters, &s.ctr); err != nil || !ok {
		return fmt.Errorf("reading counters: found=%v: %v", ok, err)
	}
	if err := s.loadPrincipals(); err != nil {
		return err
	}
	if err := s.loadNodeCerts(); err != nil {
		return fmt.Errorf("reading node certificates: %w", err)
	}
	return scan(s.db, []byte{pNode}, []byte{pNode + 1}, func(k, v []byte) (bool, error) {
		m := new(member)
		if err := json.Unmarshal(v, &m.rec); err != nil {
			return false, err
		}
		m.state = metaapi.NodeDown // until heard from
		s.nodes[m.rec.ID] = m
		return true, nil
	})
}

func (s *Service) initDB() error {
	now := s.opts.Now().UnixNano()
	pol := metaapi.Policy{Replicas: s.opts.DefaultReplicas, Strategy: plan.Plan{Strategy: plan.Ring}}
	root := &inode{
		Attr: metaapi.Attr{
			Ino: ids.RootIno, Type: metaapi.TypeDir, Mode: 0o755, Nlink: 2,
			Atime: now, Mtime: now, Ctime: now,
		},
		Parent:    ids.RootIno,
		DirPolicy: &pol,
	}
	s.ctr = counters{NextIno: ids.RootIno + 1, NextChunk: 1, NextNode: 1, Epoch: 1, Dirs: 1}
	b := s.db.NewBatch()
	defer b.Close()
	b.Set(inodeKey(ids.RootIno), mustJSON(root), nil)
	b.Set(keyCounters, mustJSON(&s.ctr), nil)
	b.Set(keySchema, []byte(schemaVersion), nil) // last: its presence marks a complete init
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("initialising %s: %w", DBDir, err)
	}
	s.log.Info("initialised new namespace", "root_policy", pol.String())
	return nil
}

// Secret returns the cluster secret (for writing node configuration; never
// log it).
func (s *Service) Secret() secret.Secret { return s.sec }

// ClientConf returns the operator's client configuration at addr: the
// admin principal with the credential meta derives (see AdminID).
func (s *Service) ClientConf(addr string) config.ClientConf {
	return config.ClientConf{Meta: addr, ClientID: uint64(AdminID), Credential: s.credKey.ClientCredential(uint64(AdminID)), Principal: AdminName, CA: string(s.ca.CertPEM)}
}

// SystemConf returns the configuration of meta's own clients (its repair
// worker): the system principal, whose credential only meta knows, so
// rotating or removing operators' principals never stops repair.
func (s *Service) SystemConf(addr string) config.ClientConf {
	return config.ClientConf{Meta: addr, ClientID: uint64(SystemID), Credential: s.credKey.ClientCredential(uint64(SystemID)), Principal: systemName, CA: string(s.ca.CertPEM)}
}

// WriteClientConf writes the operator's DIR/client.conf for clients
// reaching meta at addr and returns its path. Once the operator has
// rotated the admin principal's credential, meta no longer knows it: the
// file is left as it is.
func (s *Service) WriteClientConf(addr string) (string, error) {
	path := filepath.Join(s.opts.Dir, config.FileName)
	return path, s.SaveClientConf(path, addr)
}

// SaveClientConf writes the operator's client configuration to path (see
// WriteClientConf).
func (s *Service) SaveClientConf(path, addr string) error {
	if !s.AdminCredentialDerived() {
		s.log.Warn("the admin principal's credential was rotated: not rewriting its client config", "path", path)
		return nil
	}
	return config.Save(path, s.ClientConf(addr))
}

// SetMetaAddr sets the address Status reports.
func (s *Service) SetMetaAddr(addr string) {
	s.mu.Lock()
	s.metaAddr = addr
	s.mu.Unlock()
}

// Serve serves the HTTP API over TLS on ln until Shutdown or Close. It
// also sets the reported meta address from ln if none is set yet.
func (s *Service) Serve(ln net.Listener) error {
	ln = s.limitConns(ln)
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      5 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.srvMu.Lock()
	if s.srv != nil {
		s.srvMu.Unlock()
		return errors.New("meta: already serving")
	}
	s.srv = srv
	s.srvMu.Unlock()
	s.mu.Lock()
	if s.metaAddr == "" {
		s.metaAddr = AdvertiseAddr(ln.Addr().String())
	}
	s.mu.Unlock()
	// TLS last, over whatever ln is: the certificate names its address.
	tc, err := s.TLSConfig(ln.Addr())
	if err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	ln = tls.NewListener(ln, tc)
	s.log.Info("meta service listening", "addr", ln.Addr().String())
	err = srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops serving HTTP, waiting for calls in progress.
func (s *Service) Shutdown(ctx context.Context) error {
	s.srvMu.Lock()
	srv := s.srv
	s.srvMu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Shutdown(ctx)
}

// Close stops the service and closes the database. Calls after Close fail
// with EAGAIN (meta is restarting, from the caller's point of view).
func (s *Service) Close() error {
	s.srvMu.Lock()
	srv := s.srv
	s.srvMu.Unlock()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		srv.Shutdown(ctx)
		cancel()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.mu.Unlock()
	s.wg.Wait()
	s.inflight.Wait()
	return s.db.Close()
}

var errClosed = metaapi.Errorf(metaapi.EAGAIN, "meta service is shutting down")

// update runs fn as one atomic, durable mutation. fn's error, if any, is
// returned and nothing is written. Otherwise the batch is committed, the
// in-memory side effects (tx.after) applied, and update returns once the
// batch — and everything before it — is durable.
func (s *Service) update(fn func(tx *txn) error) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	tx := &txn{
		b:      s.db.NewIndexedBatch(),
		now:    s.opts.Now().UnixNano(),
		ctr:    s.ctr,
		ctr0:   s.ctr,
		inodes: make(map[ids.Ino]*inode),
		dirtyI: make(map[ids.Ino]bool),
		freed:  make(map[ids.Ino]bool),
	}
	tx.goneUntil = tx.now + int64(s.opts.CapabilityTTL+tombstoneSlack)
	err := contained(func() error { return fn(tx) })
	if err == nil {
		err = tx.flush()
	}
	if err != nil {
		// The refusal may rest on state not yet durable (EEXIST for a
		// name whose create is still syncing): wait for it like a read.
		seen := s.dur.committed()
		s.mu.Unlock()
		tx.b.Close()
		if werr := s.dur.wait(seen); werr != nil {
			return werr
		}
		return err
	}
	if tx.b.Empty() {
		for _, f := range tx.after {
			f()
		}
		seen := s.dur.committed()
		s.mu.Unlock()
		tx.b.Close()
		return s.dur.wait(seen) // it may have read state not yet durable
	}
	if err := s.db.ApplyNoSyncWait(tx.b, pebble.Sync); err != nil {
		s.mu.Unlock()
		tx.b.Close()
		s.log.Error("committing mutation", "err", err)
		return metaapi.Errorf(metaapi.EIO, "committing: %v", err)
	}
	s.ctr = tx.ctr
	if tx.movedDir {
		s.scopeGen.Add(1) // every principal's scope cache starts over
	}
	for _, f := range tx.after {
		f()
	}
	seq := s.dur.commit()
	s.inflight.Add(1) // under mu, so Close cannot miss it
	s.mu.Unlock()

	err = tx.b.SyncWait()
	tx.b.Close()
	s.inflight.Done()
	if err != nil {
		s.log.Error("syncing WAL", "err", err)
		s.dur.fail(err)
		return metaapi.Errorf(metaapi.EIO, "syncing: %v", err)
	}
	s.dur.done(seq)
	return nil
}

func (s *Service) read(fn func(v view) error) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return errClosed
	}
	err := contained(func() error { return fn(view{s.db}) })
	seen := s.dur.committed()
	s.mu.RUnlock()
	// Errors are observations too (ENOENT for a name whose removal is
	// still syncing), so wait either way.
	if werr := s.dur.wait(seen); werr != nil {
		return werr
	}
	return err
}

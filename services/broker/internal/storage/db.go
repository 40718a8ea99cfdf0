package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/logging"
)

// Options configures one broker's Badger store.
type Options struct {
	Dir    string
	Logger zerolog.Logger
	// MemTableBytes and CacheBytes bound Badger's memory; 0 picks small defaults.
	MemTableBytes int64
	CacheBytes    int64
	// MaxProducers bounds the producers each stream copy tracks for
	// idempotent publish (least recently appended evicted first);
	// ProducerWindow is how many of a producer's latest records are
	// deduplicated and ProducerBatches in how many runs at most (each
	// batch is one); ProducerCheckpointRecords how many records may follow
	// the persisted producer table. 0 picks DefaultMaxProducers,
	// DefaultProducerWindow, DefaultProducerBatches and
	// DefaultProducerCheckpointRecords.
	MaxProducers              int
	ProducerWindow            int
	ProducerBatches           int
	ProducerCheckpointRecords int
	// TailCacheBytes bounds each stream's cache of its newest durable
	// records and TailCacheTotalBytes all of them together (tailcache.go);
	// 0 picks DefaultTailCacheBytes and DefaultTailCacheTotalBytes, a
	// negative value turns the cache off.
	TailCacheBytes      int
	TailCacheTotalBytes int64
	// ValueLogFileBytes is the size of one value log file (0 or less:
	// 64 MiB; Badger takes 1 MiB to 2 GiB). Tests only set it, small:
	// below Badger's transaction bound (15% of MemTableBytes) a batch can
	// outgrow its file, and Badger then rotates it without an msync of the
	// bytes written since it grew it, which DB.Sync (the new file only)
	// does not cover either.
	ValueLogFileBytes int64
	// BootIDPath is read for the id of the running boot (boot.go);
	// empty means BootIDPath. Tests point it at a file of their own.
	BootIDPath string
	// OnCommit, when set, is called on the committer after every batch it
	// wrote: how long the Badger write took and, when the batch was synced
	// (synced), its fsync. The broker's metrics take it.
	OnCommit func(write, sync time.Duration, synced bool)
	// OnFail, when set, is called once, on the committer or the value log
	// GC (whichever failed first; it must not block), with the first
	// write error: the DB refuses every later write until it is opened
	// again (after a failed fsync the page cache no longer says what the
	// disk holds). A broker stops on it, so the streams it owns fail over.
	OnFail func(error)
	// WriteFault, when set, is called before each batch is written; an
	// error fails the batch as a failed Badger write or fsync would. For
	// fault tests of what a failed disk does.
	WriteFault func() error
}

// Memory defaults, for a broker that stays near 512 MiB RSS under load: two
// 16 MiB memtables, 4 MiB tables, 16 MiB block and 8 MiB index caches, two
// compactors, no block compression (payloads are the clients' bytes; Snappy
// doubled the allocation rate of compaction for little gain).
const (
	defaultMemTableBytes = 16 << 20
	defaultCacheBytes    = 16 << 20
	numMemtables         = 2
	valueLogFileBytes    = 64 << 20
)

// DB is one broker's store: one Badger database holding every stream copy
// the broker has, and the single committer that writes to it (commit.go).
type DB struct {
	bdb *badger.DB
	log zerolog.Logger

	// maxEntryBytes bounds one encoded record: Badger refuses a transaction
	// above 15% of the memtable, and one record must fit one transaction.
	maxEntryBytes int

	// Producer table limits (Options).
	maxProducers, producerWindow, producerBatches, producerCheckpointEvery int

	dir string
	// mayHaveLostWritten: the last stop was unclean and the machine
	// rebooted since (boot.go).
	mayHaveLostWritten bool
	// checkAll: loadStream reads every segment back (torn.go).
	checkAll bool
	// pin, while a recovery is not done (unsureFile), is a read
	// transaction that keeps compaction from dropping the versions a
	// roll back after another crash would need (torn.go, settle).
	pin *badger.Txn

	// Tail cache bounds (Options) and the bytes all streams' caches hold.
	tailCacheBytes int
	tailCacheLimit int64
	tailCacheUsed  atomic.Int64

	ops     chan *op
	stop    chan struct{}
	stopped chan struct{}
	// gcDone is closed when the value log GC loop has returned.
	gcDone chan struct{}

	// gate orders enqueueing against Close: senders hold it shared while
	// they send, Close takes it exclusively to stop them, so the committer
	// sees every op that was accepted.
	gate   sync.RWMutex
	closed bool

	// failed is the first write error; the committer refuses all later work.
	failMu sync.Mutex
	failed error

	// writeMu is held by the committer from a batch's commit through its
	// fsync, and by the value log GC from its rewrite through the flush
	// that makes the rewrite durable (vlog.go): Badger's two writers never
	// interleave.
	writeMu sync.Mutex

	mu      sync.Mutex
	streams map[string]*Stream

	// vlogMu orders the value log GC against the committer's mapping
	// advice (mappings_linux.go); advisor is the committer's.
	vlogMu  sync.Mutex
	advisor *mapAdvisor

	// Streams whose raised watermark waits for the next flush (wait.go).
	wmMu    sync.Mutex
	wmDirty []*Stream
	wmDone  chan struct{}

	// afterCompactBatch, when set (tests only), runs after each batch of
	// cursor events compaction deleted; an error stops the compaction
	// there, as a crash would.
	afterCompactBatch func() error
	// holdCompaction, when set (tests only), keeps every cursor event: a
	// snapshot not yet compacted, as a stop right after it leaves it.
	holdCompaction atomic.Bool
	// compactQ holds the streams whose durable snapshot may let events go;
	// compactWake wakes compactLoop, closed compactDone once it returned.
	compactMu   sync.Mutex
	compactQ    map[*Stream]struct{}
	compactWake chan struct{}
	compactDone chan struct{}
	// afterRecordCut, when set (tests only), runs between the record log cut
	// and the cursor event log cut; an error aborts the cut there, leaving
	// the intent for the next open to complete.
	afterRecordCut func() error
	// beforeSync, when set (tests only), runs on the committer between a
	// batch's Badger commit and its fsync: the batch is written, not yet
	// durable.
	beforeSync func()
	// afterGCRewrite, when set (tests only), runs in the value log GC after
	// Badger rewrote a file, before the rewrite is made durable.
	afterGCRewrite func()
	// onCommit, onFail and writeFault are the Options'.
	onCommit   func(write, sync time.Duration, synced bool)
	onFail     func(error)
	writeFault func() error
}

// Open opens (or creates) the store in opts.Dir. Pending drops are completed
// before it returns; a stream's pending cut or purge is completed when the
// stream is opened.
func Open(opts Options) (*DB, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("%w: empty Dir", ErrInvalidArgument)
	}
	mem := opts.MemTableBytes
	if mem <= 0 {
		mem = defaultMemTableBytes
	}
	cache := opts.CacheBytes
	if cache <= 0 {
		cache = defaultCacheBytes
	}
	maxBatch := mem * 15 / 100 // Badger's own transaction bound
	// Payloads above 512 bytes go to the value log, written once and
	// sequentially; the LSM tree then holds only pointers, so compaction
	// does not rewrite record bytes at every level. Measured with the
	// cluster bench: +15% records/s and half the peak RSS of inline values.
	threshold := min(int64(512), maxBatch/2)
	bo := badger.DefaultOptions(opts.Dir).
		WithLogger(badgerLogger{opts.Logger}).
		WithSyncWrites(false). // the committer fsyncs once per batch (commit.go)
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithMemTableSize(mem).
		WithNumMemtables(numMemtables).
		WithNumLevelZeroTables(3).
		WithNumLevelZeroTablesStall(8).
		WithBaseTableSize(4 << 20).
		WithBaseLevelSize(16 << 20).
		WithBlockCacheSize(cache).
		WithIndexCacheSize(cache / 2).
		WithValueLogFileSize(orDefault(opts.ValueLogFileBytes, valueLogFileBytes)).
		WithValueThreshold(threshold).
		// A value log read checks the value's checksum: a value torn by
		// a machine crash (torn.go) or rotted on disk is an error, not
		// bytes that look like records.
		WithVerifyValueChecksum(true).
		WithNumCompactors(2).
		WithCompression(options.None).
		WithNumGoroutines(2)
	// Every level's tables the same size: a compaction builds its output
	// tables in memory, so deeper levels with larger tables would make
	// its peak memory grow with the store.
	bo.TableSizeMultiplier = 1
	// Before either Badger open below (the recovery's and the store's).
	removed, err := repairLogFiles(opts.Dir)
	if err != nil {
		return nil, err
	}
	if len(removed) > 0 {
		opts.Logger.Warn().Strs(logging.Files, removed).
			Msg("removed log files a power loss left shorter than their header: they held no synced entry")
	}
	bootIDPath := opts.BootIDPath
	if bootIDPath == "" {
		bootIDPath = BootIDPath
	}
	if bootLost(opts.Dir, bootIDPath) && fileExists(opts.Dir, badger.ManifestFilename) {
		// Written records may be missing: recover first (torn.go). A
		// new store has nothing to recover.
		if _, err := recoverStore(bo, opts.Dir, bootIDPath, opts.Logger); err != nil {
			return nil, err
		}
	}
	bdb, err := badger.Open(bo)
	if err != nil {
		return nil, fmt.Errorf("storage: opening badger in %s: %w", opts.Dir, err)
	}
	// After Badger's open (which holds the directory lock), before any
	// write. After a recovery, only its unsureFile says lost.
	lost, rec, err := checkBoot(opts.Dir, bootIDPath, bdb.MaxVersion)
	if err != nil {
		_ = bdb.Close()
		return nil, err
	}
	db := &DB{
		bdb:                     bdb,
		dir:                     opts.Dir,
		mayHaveLostWritten:      lost,
		log:                     opts.Logger,
		maxEntryBytes:           int(maxBatch / 2),
		maxProducers:            orDefault(opts.MaxProducers, DefaultMaxProducers),
		producerWindow:          orDefault(opts.ProducerWindow, DefaultProducerWindow),
		producerBatches:         orDefault(opts.ProducerBatches, DefaultProducerBatches),
		producerCheckpointEvery: orDefault(opts.ProducerCheckpointRecords, DefaultProducerCheckpointRecords),
		tailCacheBytes:          cacheBound(opts.TailCacheBytes, DefaultTailCacheBytes),
		tailCacheLimit:          cacheBound(opts.TailCacheTotalBytes, DefaultTailCacheTotalBytes),
		onCommit:                opts.OnCommit,
		onFail:                  opts.OnFail,
		writeFault:              opts.WriteFault,
		ops:                     make(chan *op, 4096),
		stop:                    make(chan struct{}),
		stopped:                 make(chan struct{}),
		gcDone:                  make(chan struct{}),
		wmDone:                  make(chan struct{}),
		compactQ:                make(map[*Stream]struct{}),
		compactWake:             make(chan struct{}, 1),
		compactDone:             make(chan struct{}),
		streams:                 make(map[string]*Stream),
	}
	db.checkAll = lost && rec.CheckAll
	if lost {
		db.pin = bdb.NewTransaction(false)
	}
	db.advisor = newMapAdvisor(opts.Dir)
	go db.commitLoop()
	// Until the loops below start, Close must not wait for them.
	fail := func(err error) (*DB, error) {
		close(db.gcDone)
		close(db.wmDone)
		close(db.compactDone)
		_ = db.Close()
		return nil, err
	}
	if !lost && fileExists(opts.Dir, gcMarkerFile) {
		// A GC marker without a reboot: the page cache kept every write
		// of the rewrite, nothing to repair. (Checked first: the removal
		// syncs the directory, which every clean open would pay.)
		if err := removeFileSync(opts.Dir, gcMarkerFile); err != nil {
			return fail(err)
		}
	}
	if err := db.finishDrops(); err != nil {
		return fail(err)
	}
	if lost {
		if err := db.settle(rec); err != nil {
			return fail(err)
		}
	}
	// The value log GC starts once the recovery is done: it must not
	// delete a file the recovery reads, nor its marker.
	go db.every(valueLogGCInterval, db.gcDone, db.valueLogGC)
	go db.every(watermarkPersistInterval, db.wmDone, func() { db.flushWatermarks(false) })
	go db.compactLoop()
	return db, nil
}

// cacheBound reads a cache bound: 0 is the default, negative is off.
func cacheBound[T int | int64](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func orDefault[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Close stops the committer after it has written every accepted op, closes
// every stream (waking their waiters) and closes Badger.
func (db *DB) Close() error {
	// A clean close keeps the latest watermarks: the committer writes
	// every op queued before it stops, and this flush waits for room in
	// the queue rather than leave one for a next flush that never comes.
	db.flushWatermarks(true)
	db.gate.Lock()
	if db.closed {
		db.gate.Unlock()
		return nil
	}
	db.closed = true
	db.gate.Unlock()
	close(db.stop)
	<-db.stopped
	<-db.gcDone
	<-db.wmDone
	<-db.compactDone
	if db.pin != nil {
		db.pin.Discard()
	}

	db.mu.Lock()
	for _, s := range db.streams {
		s.close()
	}
	db.streams = map[string]*Stream{}
	db.mu.Unlock()

	if err := db.bdb.Close(); err != nil {
		return fmt.Errorf("storage: closing badger: %w", err)
	}
	db.failMu.Lock()
	failed := db.failed
	db.failMu.Unlock()
	if failed != nil {
		return nil
	}
	// Badger synced everything on close: the next open may trust the
	// written records whatever the boot.
	return markClean(db.dir)
}

// MayHaveLostWritten reports that the last stop of this store was unclean
// and the machine has rebooted since (or that cannot be told): records that
// were written but not yet synced then, which an owner may already have
// shipped to followers, may be missing (boot.go).
func (db *DB) MayHaveLostWritten() bool { return db.mayHaveLostWritten }

// Open returns the stream copy called name, creating it (empty, epoch 0) if
// it does not exist. Every call for a name returns the same *Stream until it
// is dropped or the DB is closed.
func (db *DB) Open(name string) (*Stream, error) {
	if err := validStreamName(name); err != nil {
		return nil, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := db.usable(); err != nil {
		return nil, err
	}
	if s, ok := db.streams[name]; ok {
		return s, nil
	}
	s, err := db.loadStream(name)
	if err != nil {
		return nil, err
	}
	db.streams[name] = s
	return s, nil
}

// Streams lists the streams stored (opened or not), sorted.
func (db *DB) Streams() ([]string, error) {
	if err := db.usable(); err != nil {
		return nil, err
	}
	var names []string
	err := eachMeta(db.bdb, func(name string, _ []byte, m meta) {
		if !m.Dropping {
			names = append(names, name)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("storage: listing streams: %w", err)
	}
	slices.Sort(names)
	return names, nil
}

// Drop deletes every entry of the stream: records, cursor events, the
// snapshot and the metadata. The *Stream it had returned is closed. A drop
// interrupted by a crash is completed by the next Open.
func (db *DB) Drop(name string) error {
	if err := validStreamName(name); err != nil {
		return err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := db.usable(); err != nil {
		return err
	}
	if s, ok := db.streams[name]; ok {
		delete(db.streams, name)
		s.close()
	}
	return db.drop(name)
}

func (db *DB) drop(name string) error {
	ctx := context.Background()
	mk := streamKey(kindMeta, name)
	var m meta
	found := false
	err := db.bdb.View(func(txn *badger.Txn) error {
		item, err := txn.Get(mk)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		return item.Value(func(v []byte) (err error) {
			m, err = decodeMeta(v)
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("storage: drop %q: %w", name, err)
	}
	if !found {
		return nil
	}
	if !m.Dropping {
		m.Dropping = true
		if err := db.do(ctx, &op{kvs: []kv{{key: mk, val: encodeMeta(&m)}}}); err != nil {
			return fmt.Errorf("storage: drop %q: %w", name, err)
		}
	}
	for _, kind := range []byte{kindRecord, kindEvent} {
		if err := db.deleteRange(ctx, streamKey(kind, name), 0, maxOffset); err != nil {
			return fmt.Errorf("storage: drop %q: %w", name, err)
		}
	}
	if err := db.deletePrefix(ctx, streamKey(kindProducers, name)); err != nil {
		return fmt.Errorf("storage: drop %q: %w", name, err)
	}
	last := &op{kvs: []kv{{key: streamKey(kindSnapshot, name), del: true}, {key: mk, del: true}}}
	if err := db.do(ctx, last); err != nil {
		return fmt.Errorf("storage: drop %q: %w", name, err)
	}
	return nil
}

// eachMeta calls fn with every stream copy's name, meta key and meta, in
// key order. A meta that does not decode stops it with an error naming the
// stream.
func eachMeta(bdb *badger.DB, fn func(name string, key []byte, m meta)) error {
	return bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{kindMeta}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			name, ok := nameFromMetaKey(item.Key())
			if !ok {
				continue
			}
			var m meta
			if err := item.Value(func(v []byte) (err error) {
				m, err = decodeMeta(v)
				return err
			}); err != nil {
				return fmt.Errorf("stream %q: %w", name, err)
			}
			fn(name, item.Key(), m)
		}
		return nil
	})
}

// finishDrops completes drops that a crash interrupted.
func (db *DB) finishDrops() error {
	var pending []string
	err := eachMeta(db.bdb, func(name string, _ []byte, m meta) {
		if m.Dropping {
			pending = append(pending, name)
		}
	})
	if err != nil {
		return fmt.Errorf("storage: scanning for pending drops: %w", err)
	}
	for _, name := range pending {
		if err := db.drop(name); err != nil {
			return err
		}
	}
	return nil
}

// usable reports ErrClosed once the DB is closed or a write failed.
func (db *DB) usable() error {
	db.gate.RLock()
	closed := db.closed
	db.gate.RUnlock()
	if closed {
		return fmt.Errorf("%w: db", ErrClosed)
	}
	db.failMu.Lock()
	defer db.failMu.Unlock()
	if db.failed != nil {
		return fmt.Errorf("%w: db stopped after a write failure: %w", ErrClosed, db.failed)
	}
	return nil
}

// badgerLogger routes Badger's log to zerolog: errors and warnings only;
// Badger's info and debug lines are noise at a broker's level.
type badgerLogger struct{ l zerolog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	b.l.Error().Str(logging.Detail, strings.TrimSpace(fmt.Sprintf(f, a...))).Msg("badger error")
}

func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn().Str(logging.Detail, strings.TrimSpace(fmt.Sprintf(f, a...))).Msg("badger warning")
}

func (b badgerLogger) Infof(string, ...any)  {}
func (b badgerLogger) Debugf(string, ...any) {}

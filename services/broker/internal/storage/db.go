package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
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
	// BootIDPath is read for the id of the running boot (engine/boot.go);
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

	// hooks, when set (tests only), are the engine's.
	hooks *engine.Hooks
	// tailsCheckpointChunks overrides tailsCheckpointChunks (tests).
	tailsCheckpointChunks int
}

// BootIDPath is where Linux publishes the id of the running boot.
const BootIDPath = engine.BootIDPath

// DB is one broker's store: every stream copy the broker has, in one log
// engine (engine.Engine), whose committer writes every op (commit.go).
type DB struct {
	eng *engine.Engine
	log zerolog.Logger

	// maxEntryBytes bounds one encoded record: half the engine's
	// transaction bound (engine.TxnBytes), which one record must fit.
	maxEntryBytes int

	// Producer table limits (Options).
	maxProducers, producerWindow, producerBatches, producerCheckpointEvery int

	// checkAll: loadStream reads every segment back (torn.go).
	checkAll bool
	// hooks are the engine's (tests only: Options.hooks).
	hooks *engine.Hooks
	// onFail is Options.OnFail; tests set it after Open.
	onFail func(error)
	// tailsCheckpointChunks: tails chunks between checkpoints (tails.go).
	tailsCheckpointChunks int
	// cm is the committer's scratch for groupMeta.
	cm struct {
		touched []*Stream
		entries []engine.Entry
		// seq numbers the groups (tails.go); tails is the writer of a
		// group's tails entries, live their keys since the last
		// checkpoint, dirty the streams whose newest state is only in
		// them (Stream.cmInTails).
		seq   uint64
		tails tailsWriter
		live  [][]byte
		dirty []*Stream
	}

	// closing: Close's guard (closeGuard).
	closing closeGuard

	// logReads bounds the log reads that go to the engine at once
	// (readLog).
	logReads chan struct{}

	// statusGen moves after every change a Stream.Status may show: each op
	// the committer finished (its apply ran: durable tails, cuts, heads)
	// and each change of assigned metadata taken back because its op could
	// not be queued. A reader that saw it unchanged across two reads of
	// every Status knows none changed between them (StatusGeneration).
	statusGen atomic.Uint64

	// Tail cache bounds (Options) and the bytes all streams' caches hold.
	tailCacheBytes int
	tailCacheLimit int64
	tailCacheUsed  atomic.Int64

	// stop is closed by Close, after the engine stopped taking writes,
	// to stop the loops below.
	stop chan struct{}

	// streams: the open streams by name (streamRegistry).
	streams streamRegistry

	// wm: streams whose raised watermark waits for the next flush
	// (wait.go); wmDone is closed once watermarkLoop returned.
	wm     watermarkQueue
	wmDone chan struct{}

	// afterCompactBatch, when set (tests only), runs after each batch of
	// cursor events compaction deleted; an error stops the compaction
	// there, as a crash would.
	afterCompactBatch func() error
	// holdCompaction, when set (tests only), keeps every cursor event: a
	// snapshot not yet compacted, as a stop right after it leaves it.
	holdCompaction atomic.Bool
	// compact holds the streams whose durable snapshot may let events go;
	// compactWake wakes compactLoop, closed compactDone once it returned.
	compact     compactQueue
	compactWake chan struct{}
	compactDone chan struct{}
	// afterRecordCut, when set (tests only), runs between the record log cut
	// and the cursor event log cut; an error aborts the cut there, leaving
	// the intent for the next open to complete.
	afterRecordCut func() error
	// beforeDropMarker, when set (tests only), runs in a drop before it
	// writes its marker.
	beforeDropMarker func()
}

// closeGuard is Close's lock and the flag it guards (doc.go, "Locks").
// Close holds mu throughout, so a second Close waits for the first and
// then finds closed set.
type closeGuard struct {
	mu     sync.Mutex
	closed bool
}

// streamRegistry is the open streams by name with the lock that guards
// the map (doc.go, "Locks"). Open holds mu while it loads a stream, so a
// name is loaded once and a Drop never races its load; a stream's own
// locks are taken under it, never the other way round.
type streamRegistry struct {
	mu     sync.Mutex
	byName map[string]*Stream
}

// Open opens (or creates) the store in opts.Dir. Pending drops are completed
// before it returns; a stream's pending cut or purge is completed when the
// stream is opened.
func Open(opts Options) (*DB, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("%w: empty Dir", ErrInvalidArgument)
	}
	db := &DB{
		log:                     opts.Logger,
		maxProducers:            orDefault(opts.MaxProducers, DefaultMaxProducers),
		producerWindow:          orDefault(opts.ProducerWindow, DefaultProducerWindow),
		producerBatches:         orDefault(opts.ProducerBatches, DefaultProducerBatches),
		producerCheckpointEvery: orDefault(opts.ProducerCheckpointRecords, DefaultProducerCheckpointRecords),
		tailCacheBytes:          cacheBound(opts.TailCacheBytes, DefaultTailCacheBytes),
		tailCacheLimit:          cacheBound(opts.TailCacheTotalBytes, DefaultTailCacheTotalBytes),
		stop:                    make(chan struct{}),
		logReads:                make(chan struct{}, logReadSlots),
		wmDone:                  make(chan struct{}),
		compact:                 compactQueue{q: make(map[*Stream]struct{})},
		compactWake:             make(chan struct{}, 1),
		compactDone:             make(chan struct{}),
		streams:                 streamRegistry{byName: make(map[string]*Stream)},
	}
	db.hooks = opts.hooks
	db.tailsCheckpointChunks = orDefault(opts.tailsCheckpointChunks, tailsCheckpointChunks)
	db.onFail = opts.OnFail
	if db.hooks == nil {
		db.hooks = &engine.Hooks{}
	}
	eng, err := engine.Open(engine.Options{
		Dir:               opts.Dir,
		Logger:            opts.Logger,
		MemTableBytes:     opts.MemTableBytes,
		CacheBytes:        opts.CacheBytes,
		ValueLogFileBytes: opts.ValueLogFileBytes,
		BootIDPath:        opts.BootIDPath,
		OnCommit:          opts.OnCommit,
		OnFail:            db.failed,
		WriteFault:        opts.WriteFault,
		OnGroup:           db.groupMeta,
		OnWritten:         opWritten,
		OnDone:            opDone,
		Recover:           markUnsure,
		Hooks:             db.hooks,
	})
	if err != nil {
		return nil, err
	}
	db.eng = eng
	db.maxEntryBytes = int(eng.TxnBytes() / 2)
	rec := eng.Recovery()
	db.checkAll = rec.ValuesLost
	// Until the loops below start, Close must not wait for them.
	fail := func(err error) (*DB, error) {
		close(db.wmDone)
		close(db.compactDone)
		_ = db.Close()
		return nil, err
	}
	dropping, err := db.foldTails()
	if err != nil {
		return fail(err)
	}
	if err := db.finishDrops(dropping); err != nil {
		return fail(err)
	}
	if err := db.settle(); err != nil {
		return fail(err)
	}
	go db.every(watermarkPersistInterval, db.wmDone, func() { db.flushWatermarks(false) })
	go db.compactLoop()
	return db, nil
}

// every runs fn every interval until the DB closes, then closes done.
func (db *DB) every(interval time.Duration, done chan struct{}, fn func()) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-db.stop:
			return
		case <-t.C:
			fn()
		}
	}
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
	db.closing.mu.Lock()
	defer db.closing.mu.Unlock()
	if db.closing.closed {
		return nil
	}
	db.closing.closed = true
	// The committer writes every op accepted before this, then a tails
	// checkpoint, last, so a clean close leaves no tails entries
	// (tails.go): the metadata is whole on disk. Queued by the engine
	// behind every other write, it cannot be overtaken by a write racing
	// the close (a watermark flush, an append still in flight).
	last := &op{checkpoint: true}
	last.b.Tag = last
	db.eng.StopWritesAfter(&last.b)
	close(db.stop)
	<-db.wmDone
	<-db.compactDone

	db.streams.mu.Lock()
	for _, s := range db.streams.byName {
		s.close()
	}
	db.streams.byName = map[string]*Stream{}
	db.streams.mu.Unlock()
	return db.eng.Close()
}

// MayHaveLostWritten reports that the last stop of this store was unclean
// and the machine has rebooted since (or that cannot be told): records that
// were written but not yet synced then, which an owner may already have
// shipped to followers, may be missing (engine/boot.go).
func (db *DB) MayHaveLostWritten() bool { return db.eng.Recovery().MayHaveLostWritten }

// Open returns the stream copy called name, creating it (empty, epoch 0) if
// it does not exist. Every call for a name returns the same *Stream until it
// is dropped or the DB is closed.
func (db *DB) Open(name string) (*Stream, error) {
	if err := validStreamName(name); err != nil {
		return nil, err
	}
	db.streams.mu.Lock()
	defer db.streams.mu.Unlock()
	if err := db.usable(); err != nil {
		return nil, err
	}
	if s, ok := db.streams.byName[name]; ok {
		return s, nil
	}
	s, err := db.loadStream(name)
	if err != nil {
		return nil, err
	}
	db.streams.byName[name] = s
	return s, nil
}

// StatusGeneration moves after every change of any open stream's Status,
// never before it: a caller that reads it, then reads Status, and later
// reads it unchanged, has seen every stream's current Status. The broker's
// heartbeat skips its read of every copy's status on an idle broker with
// it (docs/etcd-schema.md, "Heartbeat shards").
func (db *DB) StatusGeneration() uint64 { return db.statusGen.Load() }

// Streams lists the streams stored (opened or not), sorted.
func (db *DB) Streams() ([]string, error) {
	if err := db.usable(); err != nil {
		return nil, err
	}
	var names []string
	err := eachMeta(db.eng, func(name string, _ []byte, m meta) {
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
	db.streams.mu.Lock()
	defer db.streams.mu.Unlock()
	if err := db.usable(); err != nil {
		return err
	}
	if s, ok := db.streams.byName[name]; ok {
		delete(db.streams.byName, name)
		s.close()
		// A new copy's first metadata may still be queued (loadStream
		// does not wait for it): the drop reads what is stored, so it
		// waits for everything queued before it, or that write would land
		// after the drop and leave the dropped stream listed. The same op
		// has the metadata written whole if the stream's newest tails are
		// only in tails entries (tails.go): a checkpoint before the drop's
		// marker would delete them, and a crash then would bring the copy
		// back with older tails, cutting records it had made durable.
		if err := db.do(context.Background(), &op{whole: s}); err != nil {
			return fmt.Errorf("storage: drop %q: %w", name, err)
		}
	}
	return db.drop(name)
}

func (db *DB) drop(name string) error {
	ctx := context.Background()
	mk := streamKey(kindMeta, name)
	var m meta
	found := false
	err := db.eng.View(func(txn *engine.Txn) error {
		item, err := txn.Get(mk)
		if errors.Is(err, engine.ErrNotFound) {
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
	if hook := db.beforeDropMarker; hook != nil {
		hook()
	}
	if !m.Dropping {
		m.Dropping = true
		o := &op{}
		o.add(mk, encodeMeta(&m))
		if err := db.do(ctx, o); err != nil {
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
	last := &op{}
	last.del(streamKey(kindSnapshot, name))
	last.del(mk)
	if err := db.do(ctx, last); err != nil {
		return fmt.Errorf("storage: drop %q: %w", name, err)
	}
	return nil
}

// viewer is what eachMeta reads: the engine, or the store a recovery
// works on (engine.Recovering).
type viewer interface {
	View(fn func(*engine.Txn) error) error
}

// eachMeta calls fn with every stream copy's name, meta key and meta, in
// key order. A meta that does not decode stops it with an error naming the
// stream.
func eachMeta(v viewer, fn func(name string, key []byte, m meta)) error {
	return v.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefix: []byte{kindMeta}})
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

// finishDrops completes the drops that a crash interrupted: the streams
// whose metadata Open found marked (foldTails).
func (db *DB) finishDrops(pending []string) error {
	for _, name := range pending {
		if err := db.drop(name); err != nil {
			return err
		}
	}
	return nil
}

// failed is the engine's OnFail: the first write error, after which the
// store refuses every write until it is opened again.
func (db *DB) failed(err error) {
	if db.onFail != nil {
		db.onFail(err)
	}
}

// usable reports ErrClosed once the DB is closed or a write failed.
func (db *DB) usable() error { return db.eng.Err() }

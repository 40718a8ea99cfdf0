package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/logging"
)

// ErrClosed: the engine is closed, or stopped after a write failure.
var ErrClosed = errors.New("storage: closed")

// ErrNotFound: Get found no value under the key.
var ErrNotFound = errors.New("storage: key not found")

// ReservedKeyByte is the first byte of keys the engine keeps for itself:
// the caller never writes a key starting with it. The value log GC drops
// that prefix to make Badger flush its rotated memtables (vlog.go).
const ReservedKeyByte byte = 'g'

// Options configures an engine.
type Options struct {
	Dir    string
	Logger zerolog.Logger
	// MemTableBytes and CacheBytes bound Badger's memory; 0 picks small defaults.
	MemTableBytes int64
	CacheBytes    int64
	// ValueLogFileBytes is the size of one value log file (0 or less:
	// 64 MiB; Badger takes 1 MiB to 2 GiB). Tests only set it, small:
	// below Badger's transaction bound (15% of MemTableBytes) a batch can
	// outgrow its file, and Badger then rotates it without an msync of the
	// bytes written since it grew it, which DB.Sync (the new file only)
	// does not cover either.
	ValueLogFileBytes int64
	// BootIDPath is read for the id of the running boot (boot.go);
	// empty means BootIDPath.
	BootIDPath string

	// OnCommit, when set, is called on the committer after every group it
	// wrote: how long the Badger write took and its fsync (synced is
	// always true: every group is synced).
	OnCommit func(write, sync time.Duration, synced bool)
	// OnFail, when set, is called once, on the committer or the value log
	// GC (whichever failed first; it must not block), with the first
	// write error: the engine refuses every later write until it is
	// opened again (after a failed fsync the page cache no longer says
	// what the disk holds).
	OnFail func(error)
	// WriteFault, when set, is called before each group is written; an
	// error fails the group as a failed Badger write or fsync would. For
	// fault tests of what a failed disk does.
	WriteFault func() error

	// OnGroup, when set, is called on the committer with each group of
	// batches it writes together, in queue order, after their entries are
	// in the transaction; the entries it returns are written after all of
	// them, in the group's last transaction. The model writes its
	// metadata there: a group split by Badger's transaction bound may
	// leave entries past a durable tail, never a tail past its entries.
	OnGroup func(group []*Batch) []Entry
	// OnWritten, when set, is called on the committer for each batch of a
	// group once Badger has taken the group, before its fsync, in queue
	// order: the batch is in Badger's files (the page cache), safe from a
	// crash of the process, not of the machine.
	OnWritten func(*Batch)
	// OnDone, when set, is called on the committer for each batch once
	// its group is durable (nil) or failed, in queue order.
	OnDone func(*Batch, error)

	// Recover, when set, is the caller's step of a recovery after a stop
	// that may have lost written data (doc.go), run after the engine
	// rolled back a torn transaction and repaired an interrupted value
	// log GC, before Open returns. What it writes (Recovering.Write) is
	// synced. It must be idempotent: a crash in a recovery runs it again.
	Recover func(*Recovering) error

	// Hooks are for tests only; the engine reads their fields when it
	// reaches each moment, so a test may set them after Open (before the
	// write it means to stop).
	Hooks *Hooks
}

// Hooks lets tests stop the engine at the moments a crash matters. Nil
// fields do nothing.
type Hooks struct {
	// BeforeSync runs on the committer between a group's Badger commit
	// and its fsync: the group is written, not yet durable.
	BeforeSync func()
	// AfterPartSync runs on the committer after each transaction but the
	// last of a group that Badger's transaction bound split is committed
	// and synced, before the next is written.
	AfterPartSync func()
	// AfterGCRewrite runs in the value log GC after Badger rewrote a
	// file, before the rewrite is made durable.
	AfterGCRewrite func()
	// GCStallLimit, when above 0, replaces gcStallLimit.
	GCStallLimit time.Duration
	// AfterRecoveryStep runs after each step of a recovery ("roll back",
	// "repair", "mark"); an error stops it there, as a crash would.
	AfterRecoveryStep func(step string) error
	// WriteBackSplit, when above 0, makes a recovery's write back stop
	// after that many keys, in their own synced transaction, with an
	// error, as a crash there would.
	WriteBackSplit int
	// BeforeWriteBackSync runs in a recovery's write back between its last
	// commit and its fsync.
	BeforeWriteBackSync func()
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

// Recovery is what an open learned about the last stop.
type Recovery struct {
	// MayHaveLostWritten: the last stop was unclean and the machine has
	// rebooted since (or that cannot be told): data that was written but
	// not yet synced then may be missing (boot.go). The newest transaction,
	// if torn, was rolled back.
	MayHaveLostWritten bool
	// ValuesLost: values a value log GC had moved before a power loss
	// were found nowhere; keys whose value was lost read as older
	// versions or as empty values. The caller must read back what it
	// relies on before Settle.
	ValuesLost bool
	// Pending: Settle has not been called yet.
	Pending bool
}

// Engine is a broker's log engine: one Badger database and its single
// committer (commit.go).
type Engine struct {
	bdb   *badger.DB
	log   zerolog.Logger
	dir   string
	hooks *Hooks

	txnBytes int64

	recovery Recovery
	// pin, while a recovery is not settled (unsureFile), is a read
	// transaction that keeps compaction from dropping the versions a roll
	// back after another crash would need (torn.go).
	pin *badger.Txn

	batches chan *Batch
	stop    chan struct{}
	stopped chan struct{}
	// gcDone is closed when the value log GC loop has returned (at once
	// if it never started).
	gcDone chan struct{}

	// Each lock below lives in a type of its own with exactly the state
	// it guards (doc.go, "Locks").
	gate     enqueueGate
	stopping stopGuard
	failure  failureLatch

	// writeMu is held by the committer from a group's commit through its
	// fsync, and by the value log GC from its rewrite through the flush
	// that makes the rewrite durable (vlog.go): Badger's two writers never
	// interleave. It guards no state, only serialises those two writers,
	// so it stays a lone field. Lock order: writeMu, then gate.mu or
	// failure.mu (Err); stopping.mu before failure.mu (Close); gate.mu and
	// failure.mu are leaves.
	writeMu sync.Mutex

	// advisor is the committer's alone (commitLoop): it gives only
	// advice that is harmless whatever holds a range by then
	// (mappings_linux.go), so nothing orders it against the value log GC.
	advisor *mapAdvisor

	onCommit   func(write, sync time.Duration, synced bool)
	onFail     func(error)
	writeFault func() error
	onGroup    func([]*Batch) []Entry
	onWritten  func(*Batch)
	onDone     func(*Batch, error)
}

// enqueueGate orders enqueueing against Close, with the flag it guards
// (doc.go, "Locks"): senders hold mu shared while they check closed and
// send, StopWrites takes it exclusively to set closed, so the committer
// sees every batch that was accepted.
type enqueueGate struct {
	mu     sync.RWMutex
	closed bool
}

// stopGuard orders starting the value log GC (Settle) against stopping it
// (StopWrites), and Close against itself (doc.go, "Locks"): writesStopped
// is set by StopWrites, gcStarted by Settle once it started the GC loop.
type stopGuard struct {
	mu            sync.Mutex
	writesStopped bool
	gcStarted     bool
}

// failureLatch holds the first write error (doc.go, "Locks"); once set the
// committer refuses all later work until restart.
type failureLatch struct {
	mu  sync.Mutex
	err error
}

// get returns the first write error, nil while none.
func (f *failureLatch) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// set records err unless an earlier error is kept, and reports whether err
// was the first.
func (f *failureLatch) set(err error) (first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	first = f.err == nil
	if first {
		f.err = err
	}
	return first
}

// Open opens (or creates) the engine in opts.Dir: it repairs what a power
// loss left of Badger's log files (repair.go), recovers from a stop that
// may have lost written data (torn.go), opens Badger and starts the
// committer. The value log GC starts at Settle, which the caller calls
// once it has done its own open (it must not delete a file a recovery
// still reads).
func Open(opts Options) (*Engine, error) {
	if opts.Dir == "" {
		return nil, errors.New("storage: empty Dir")
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
		WithSyncWrites(false). // the committer fsyncs once per group (commit.go)
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
	hooks := opts.Hooks
	if hooks == nil {
		hooks = &Hooks{}
	}
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
		// Written data may be missing: recover first (torn.go). A new
		// store has nothing to recover.
		if _, err := recoverStore(bo, opts.Dir, bootIDPath, opts.Logger, hooks, opts.Recover); err != nil {
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
	e := &Engine{
		bdb:        bdb,
		log:        opts.Logger,
		dir:        opts.Dir,
		hooks:      hooks,
		txnBytes:   maxBatch,
		recovery:   Recovery{MayHaveLostWritten: lost, ValuesLost: lost && rec.CheckAll, Pending: true},
		batches:    make(chan *Batch, 4096),
		stop:       make(chan struct{}),
		stopped:    make(chan struct{}),
		gcDone:     make(chan struct{}),
		onCommit:   opts.OnCommit,
		onFail:     opts.OnFail,
		writeFault: opts.WriteFault,
		onGroup:    opts.OnGroup,
		onWritten:  opts.OnWritten,
		onDone:     opts.OnDone,
	}
	if lost {
		e.pin = bdb.NewTransaction(false)
	}
	e.advisor = newMapAdvisor(opts.Dir)
	go e.commitLoop()
	if !lost && fileExists(opts.Dir, gcMarkerFile) {
		// A GC marker without a reboot: the page cache kept every write
		// of the rewrite, nothing to repair. (Checked first: the removal
		// syncs the directory, which every clean open would pay.)
		if err := removeFileSync(opts.Dir, gcMarkerFile); err != nil {
			_ = e.Close()
			return nil, err
		}
	}
	return e, nil
}

// TxnBytes is Badger's bound on one transaction: a batch's entry must be
// well below it (a group larger than it is split into several
// transactions, each synced).
func (e *Engine) TxnBytes() int64 { return e.txnBytes }

// Recovery reports what Open learned about the last stop.
func (e *Engine) Recovery() Recovery { return e.recovery }

// Settle ends the open: the caller has done what Recovery asked of it (and
// its writes are durable). A recovery's markers go, and its read
// transaction; the value log GC starts. A crash before Settle returns does
// the recovery again on the next open.
func (e *Engine) Settle() error {
	if !e.recovery.Pending {
		return nil
	}
	if e.recovery.MayHaveLostWritten {
		if err := removeFileSync(e.dir, gcMarkerFile); err != nil {
			return err
		}
		if err := removeFileSync(e.dir, unsureFile); err != nil {
			return err
		}
		e.pin.Discard()
		e.pin = nil
	}
	e.recovery.Pending, e.recovery.ValuesLost = false, false
	e.stopping.mu.Lock()
	defer e.stopping.mu.Unlock()
	if !e.stopping.writesStopped {
		e.stopping.gcStarted = true
		go e.gcLoop()
	}
	return nil
}

// Err reports ErrClosed once the engine is closed or a write failed.
func (e *Engine) Err() error {
	e.gate.mu.RLock()
	closed := e.gate.closed
	e.gate.mu.RUnlock()
	if closed {
		return fmt.Errorf("%w: db", ErrClosed)
	}
	if failed := e.failure.get(); failed != nil {
		return fmt.Errorf("%w: db stopped after a write failure: %w", ErrClosed, failed)
	}
	return nil
}

// StopWrites refuses every later batch, waits until the committer wrote
// every accepted one, and stops the value log GC. Reads go on until Close.
func (e *Engine) StopWrites() { e.StopWritesAfter(nil) }

// StopWritesAfter is StopWrites with last, when not nil, written after
// every other accepted batch: the gate closes and last is queued under its
// lock, which every Enqueue in flight holds shared, so nothing can be
// queued behind it. Its outcome reaches OnDone as any batch's does.
func (e *Engine) StopWritesAfter(last *Batch) {
	e.gate.mu.Lock()
	if e.gate.closed {
		e.gate.mu.Unlock()
		return
	}
	e.gate.closed = true
	if last != nil {
		// The committer takes batches without the gate's lock, so a
		// full queue drains.
		e.batches <- last
	}
	e.gate.mu.Unlock()
	e.stopping.mu.Lock()
	e.stopping.writesStopped = true
	started := e.stopping.gcStarted
	e.stopping.mu.Unlock()
	close(e.stop)
	<-e.stopped
	if started {
		<-e.gcDone
	}
}

// Close stops writes (StopWrites) and closes Badger. After a clean close
// (no write failed) the next open trusts every written entry whatever the
// boot.
func (e *Engine) Close() error {
	e.StopWrites()
	e.stopping.mu.Lock()
	defer e.stopping.mu.Unlock()
	if e.bdb == nil {
		return nil
	}
	if e.pin != nil {
		e.pin.Discard()
		e.pin = nil
	}
	err := e.bdb.Close()
	e.bdb = nil
	if err != nil {
		return fmt.Errorf("storage: closing badger: %w", err)
	}
	if e.failure.get() != nil {
		return nil
	}
	// Badger synced everything on close: the next open may trust the
	// written data whatever the boot.
	return markClean(e.dir)
}

// DeleteRange deletes every key in [start, end) (end nil: every key from
// start that starts with prefix), in bounded batches through the
// committer, each durable before the next is read.
func (e *Engine) DeleteRange(ctx context.Context, prefix, start, end []byte) error {
	const batch = 1024
	for {
		var keys [][]byte
		err := e.View(func(txn *Txn) error {
			it := txn.NewIterator(IterOptions{Prefix: prefix})
			defer it.Close()
			for it.Seek(start); it.Valid() && len(keys) < batch; it.Next() {
				k := it.Item().KeyCopy(nil)
				if end != nil && string(k) >= string(end) {
					break
				}
				keys = append(keys, k)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			return nil
		}
		b := &Batch{}
		for _, k := range keys {
			b.Delete(k)
		}
		if err := e.Do(ctx, b); err != nil {
			return err
		}
		if len(keys) < batch {
			return nil
		}
		start = append(keys[len(keys)-1], 0) // the next key after it
	}
}

// FlushAndCompact writes every memtable to a table and compacts every
// level into one, so Badger's count of each value log file's garbage is
// current. Tests and tools only: it holds compaction for its duration,
// and the committer out (writeMu) as the value log GC does: dropping the
// prefix makes Badger refuse every write meanwhile (ErrBlockedWrites),
// which the committer would take for a failed disk and stop the engine.
func (e *Engine) FlushAndCompact() error {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	key := []byte{ReservedKeyByte, 'x'}
	if err := e.bdb.Update(func(txn *badger.Txn) error { return txn.Set(key, nil) }); err != nil {
		return err
	}
	// Dropping a prefix that holds a key flushes the active memtable too.
	if err := e.bdb.DropPrefix(key); err != nil {
		return err
	}
	return e.bdb.Flatten(1)
}

func orDefault[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
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

package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Group commit. Every write to Badger goes through one committer goroutine
// per DB. Callers build an op under their stream's lock (so ops of one
// stream enter the queue in the order their offsets were assigned) and wait
// for it outside the lock. The committer takes every op queued at that
// moment, writes them in one Badger transaction (more only when Badger's
// transaction bound forces a split), then calls db.Sync once, which fsyncs
// the active memtable's WAL and the current value log file (badger v4
// DB.Sync). Only then are the ops applied to the streams' durable state and
// their callers released. Concurrent appends to one or many streams thus
// share one fsync, and throughput grows with concurrency.
//
// The committer syncs after every transaction, and the only other writer,
// the value log GC (vlog.go), never writes between a commit and its sync
// (both hold writeMu), so a memtable that Badger rotates out (its WAL is not
// synced on rotation) never holds an unsynced write of the committer; a
// value log file is msynced by Badger when it rotates. Ops that nobody waits for (cursor commits, lazy watermark writes)
// are made durable by the same sync, just not waited for.

// maxBatchBytes bounds how much one drain of the queue takes.
const maxBatchBytes = 4 << 20

type kv struct {
	key, val []byte
	del      bool
}

// op is one unit of work for the committer.
type op struct {
	s   *Stream
	kvs []kv
	// meta, when set, is the stream's metadata after this op, numbered by
	// version (assigned under the stream's lock, so versions follow queue
	// order). The committer writes the newest one of each stream once per
	// batch, after every entry of the batch.
	meta    *meta
	version uint64
	// touchWM asks for the stream's newest metadata to be rewritten with the
	// current confirm watermark (SetConfirmWatermark's lazy persistence).
	touchWM bool
	// written runs on the committer once Badger has taken the op, before
	// the fsync, in queue order (Stream.WrittenTail).
	written func()
	// apply runs on the committer after the op is durable, in queue order.
	apply func()
	// snap, when set, is the cursor snapshot the op writes: once durable it
	// is the copy's durable snapshot and the events below its boundary may
	// go (compact.go).
	snap *snapshot
	// done receives the outcome; nil when nobody waits.
	done chan error
	size int
}

func (o *op) add(key, val []byte) {
	o.kvs = append(o.kvs, kv{key: key, val: val})
	o.size += len(key) + len(val)
}

func (o *op) del(key []byte) {
	o.kvs = append(o.kvs, kv{key: key, del: true})
	o.size += len(key)
}

// enqueue hands o to the committer. Ops of one stream must be enqueued under
// that stream's lock to keep their order.
func (db *DB) enqueue(ctx context.Context, o *op) error {
	db.gate.RLock()
	defer db.gate.RUnlock()
	if db.closed {
		return fmt.Errorf("%w: db", ErrClosed)
	}
	select {
	case db.ops <- o:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryEnqueue enqueues o unless the queue is full.
func (db *DB) tryEnqueue(o *op) bool {
	db.gate.RLock()
	defer db.gate.RUnlock()
	if db.closed {
		return false
	}
	select {
	case db.ops <- o:
		return true
	default:
		return false
	}
}

// wait waits for an enqueued op. Cancelling ctx stops the wait, not the op:
// the op may still become durable.
func wait(ctx context.Context, o *op) error {
	select {
	case err := <-o.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// do enqueues o and waits until it is durable.
func (db *DB) do(ctx context.Context, o *op) error {
	o.done = make(chan error, 1)
	if err := db.enqueue(ctx, o); err != nil {
		return err
	}
	return wait(ctx, o)
}

func (db *DB) commitLoop() {
	defer close(db.stopped)
	batch := make([]*op, 0, 256)
	// The mapping advice also runs while nothing is written (readers
	// fault value log pages in too).
	tick := time.NewTicker(lookEvery)
	defer tick.Stop()
	unadvised := 0
	for {
		var first *op
		select {
		case first = <-db.ops:
		case <-tick.C:
			unadvised = db.advise(unadvised)
			continue
		case <-db.stop:
			// Close let every accepted sender finish; write what is queued.
			for {
				select {
				case o := <-db.ops:
					db.commit([]*op{o})
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
		size := first.size
	drain:
		for size < maxBatchBytes {
			select {
			case o := <-db.ops:
				batch = append(batch, o)
				size += o.size
			default:
				break drain
			}
		}
		db.commit(batch)
		clear(batch)
		unadvised = db.advise(unadvised + size)
	}
}

// The mapping advice (mappings_linux.go) looks at Badger's mappings at
// least every lookEvery, writes or not, and drops value log pages from the
// resident set each time: a reader catching up faults them in at disk or
// page cache speed, and the resident set is bounded by what it can fault in
// between two looks. Table pages are paged out every trimEvery.
const (
	lookEvery = 500 * time.Millisecond
	trimEvery = 2 * time.Second
)

// advise gives the mapping advice (mappings_linux.go) for written bytes
// committed since the last advice. It runs on the committer between its
// writes, so Badger is not rotating a value log file under it, after the
// batch's waiters are released. While the value log GC runs (it holds
// vlogMu, for seconds when it rewrites a file) it skips its turn rather
// than hold writes up, and returns the bytes still unadvised.
func (db *DB) advise(written int) int {
	if !db.vlogMu.TryLock() {
		return written
	}
	defer db.vlogMu.Unlock()
	db.advisor.wrote(written)
	return 0
}

// commit writes a batch durably, then applies and releases its ops.
func (db *DB) commit(batch []*op) {
	// writeMu: the value log GC writes too, and must not between this
	// batch's commit and its fsync (vlog.go).
	db.writeMu.Lock()
	db.failMu.Lock()
	err := db.failed
	db.failMu.Unlock()
	if err == nil {
		if db.writeFault != nil {
			err = db.writeFault()
		}
		if err == nil {
			err = db.write(batch)
		}
		if err != nil {
			db.fail(err)
		}
		db.writeMu.Unlock()
	} else {
		db.writeMu.Unlock()
		err = fmt.Errorf("%w: db stopped after a write failure: %w", ErrClosed, err)
	}
	for _, o := range batch {
		if err == nil && o.apply != nil {
			o.apply()
		}
		if err == nil && o.snap != nil {
			o.s.snapshotDurable(o.snap)
		}
		if err != nil && o.s != nil {
			// Waiters on durable state (a duplicate publish waiting for its
			// original) re-check and find the DB stopped.
			o.s.wakeAll()
		}
		if o.done != nil {
			o.done <- err
		}
	}
}

// fail stops the DB after a failed write or fsync: every later write is
// refused until restart, as etcd stops on a failed fsync, because what the
// failed write left on disk is not known.
func (db *DB) fail(err error) {
	db.failMu.Lock()
	first := db.failed == nil
	if first {
		db.failed = err
	}
	db.failMu.Unlock()
	if !first {
		return
	}
	db.log.Error().Err(err).Msg("storage write failed; refusing further writes until restart")
	forgetBoot(db.dir)
	if db.onFail != nil {
		db.onFail(err)
	}
}

func (db *DB) write(batch []*op) error {
	start := time.Now()
	txn := db.bdb.NewTransaction(true)
	defer func() { txn.Discard() }()
	flush := func() error {
		if err := txn.Commit(); err != nil {
			return err
		}
		// Sync before the next transaction: see the note on memtable
		// rotation above.
		if err := db.bdb.Sync(); err != nil {
			return err
		}
		txn = db.bdb.NewTransaction(true)
		return nil
	}
	put := func(k kv) error {
		var err error
		for range 2 {
			if k.del {
				err = txn.Delete(k.key)
			} else {
				err = txn.Set(k.key, k.val)
			}
			if !errors.Is(err, badger.ErrTxnTooBig) {
				return err
			}
			if err := flush(); err != nil {
				return err
			}
		}
		return err
	}
	var touched []*Stream
	for _, o := range batch {
		for _, k := range o.kvs {
			if err := put(k); err != nil {
				return fmt.Errorf("storage: writing batch: %w", err)
			}
		}
		s := o.s
		// A closed stream's metadata is not written: the stream is being
		// dropped (DB.Close stops the committer before it closes streams),
		// and an op queued before the drop, in the same batch as the drop's
		// marker, would otherwise rewrite its metadata without the marker,
		// last, and a crash later in the drop would leave a stream whose
		// entries are gone and whose metadata still names them: Open would
		// refuse it for ever instead of finishing the drop.
		if s == nil || (o.meta == nil && !o.touchWM) || s.Closed() {
			continue
		}
		if !s.cmTouched {
			s.cmTouched = true
			touched = append(touched, s)
		}
		if o.meta != nil && o.version > s.cmVersion {
			s.cmMeta, s.cmVersion = o.meta, o.version
		}
	}
	// Metadata goes last: a split batch may leave entries past a durable
	// tail (ignored and cleaned on open), never a tail past its entries.
	for _, s := range touched {
		s.cmTouched = false
		if s.cmMeta == nil {
			continue
		}
		m := *s.cmMeta
		m.ConfirmWatermark = s.persistedWatermark(m.RecordTail)
		if err := put(kv{key: s.metaKey, val: encodeMeta(&m)}); err != nil {
			return fmt.Errorf("storage: writing batch: %w", err)
		}
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("storage: committing batch: %w", err)
	}
	for _, o := range batch {
		if o.written != nil {
			o.written()
		}
	}
	written := time.Now()
	// Every batch is synced, a batch of nothing but watermark touches too:
	// only the newest transaction may then be torn by a machine crash,
	// which is what recovery rolls back (torn.go).
	if hook := db.beforeSync; hook != nil {
		hook()
	}
	if err := db.bdb.Sync(); err != nil {
		return fmt.Errorf("storage: syncing batch: %w", err)
	}
	if db.onCommit != nil {
		db.onCommit(written.Sub(start), time.Since(written), true)
	}
	return nil
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Group commit. Every write to Badger goes through one committer goroutine
// per engine. Callers build a batch (a stream copy's model under its own
// lock, so that its batches enter the queue in the order it assigned their
// offsets) and enqueue it. The committer takes every batch queued at that
// moment (a group), writes them in one Badger transaction (more only when
// Badger's transaction bound forces a split), then calls DB.Sync once,
// which fsyncs the active memtable's WAL and the current value log file
// (badger v4 DB.Sync). Only then is each batch's OnDone called. Concurrent
// writers thus share one fsync, and throughput grows with concurrency.
//
// The committer syncs after every transaction, and the only other writer,
// the value log GC (vlog.go), never writes between a commit and its sync
// (both hold writeMu), so a memtable that Badger rotates out (its WAL is not
// synced on rotation) never holds an unsynced write of the committer; a
// value log file is msynced by Badger when it rotates. Batches that nobody
// waits for are made durable by the same sync, just not waited for.

// maxBatchBytes bounds how much one drain of the queue takes.
const maxBatchBytes = 4 << 20

// Entry is one key to set to a value, or to delete.
type Entry struct {
	Key, Value []byte
	Delete     bool
}

// Batch is a unit of work for the committer: entries written in queue
// order, in one transaction with the rest of its group unless Badger's
// transaction bound splits the group.
type Batch struct {
	entries []Entry
	size    int
	// Tag is the caller's; the engine hands the batch back to OnGroup,
	// OnWritten and OnDone.
	Tag any
	// done, when set (Do), receives the outcome.
	done chan error
}

// Set adds an entry that sets key to val.
func (b *Batch) Set(key, val []byte) {
	b.entries = append(b.entries, Entry{Key: key, Value: val})
	b.size += len(key) + len(val)
}

// Delete adds an entry that deletes key.
func (b *Batch) Delete(key []byte) {
	b.entries = append(b.entries, Entry{Key: key, Delete: true})
	b.size += len(key)
}

// Len is how many entries the batch holds.
func (b *Batch) Len() int { return len(b.entries) }

// Enqueue hands b to the committer. It fails only once the engine is
// closed, or when ctx ends while the queue is full.
func (e *Engine) Enqueue(ctx context.Context, b *Batch) error {
	e.gate.mu.RLock()
	defer e.gate.mu.RUnlock()
	if e.gate.closed {
		return fmt.Errorf("%w: db", ErrClosed)
	}
	select {
	case e.batches <- b:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryEnqueue enqueues b unless the queue is full or the engine closed.
func (e *Engine) TryEnqueue(b *Batch) bool {
	e.gate.mu.RLock()
	defer e.gate.mu.RUnlock()
	if e.gate.closed {
		return false
	}
	select {
	case e.batches <- b:
		return true
	default:
		return false
	}
}

// Queued is how many batches wait for the committer to take them.
func (e *Engine) Queued() int { return len(e.batches) }

// Do enqueues b and waits until it is durable. Cancelling ctx stops the
// wait, not the batch: it may still become durable.
func (e *Engine) Do(ctx context.Context, b *Batch) error {
	b.done = make(chan error, 1)
	if err := e.Enqueue(ctx, b); err != nil {
		return err
	}
	select {
	case err := <-b.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Engine) commitLoop() {
	defer close(e.stopped)
	group := make([]*Batch, 0, 256)
	// The mapping advice also runs while nothing is written (the value
	// log GC and compactions fault pages in too).
	tick := time.NewTicker(lookEvery)
	defer tick.Stop()
	for {
		var first *Batch
		select {
		case first = <-e.batches:
		case <-tick.C:
			e.advisor.wrote(0)
			continue
		case <-e.stop:
			// Close let every accepted sender finish; write what is queued.
			for {
				select {
				case b := <-e.batches:
					e.commit([]*Batch{b})
				default:
					return
				}
			}
		}
		group = append(group[:0], first)
		size := first.size
	drain:
		for size < maxBatchBytes {
			select {
			case b := <-e.batches:
				group = append(group, b)
				size += b.size
			default:
				break drain
			}
		}
		e.commit(group)
		clear(group)
		// After the group's waiters are released: the advice is no part
		// of a commit.
		e.advisor.wrote(size)
	}
}

// The mapping advice (mappings_linux.go) looks at Badger's mappings at
// least every lookEvery, writes or not, so a new file is advised
// MADV_RANDOM soon after Badger maps it; table pages and older value log
// files' pages are paged out every trimEvery.
const (
	lookEvery = 500 * time.Millisecond
	trimEvery = 2 * time.Second
)

// commit writes a group durably, then reports each batch's outcome.
func (e *Engine) commit(group []*Batch) {
	// writeMu: the value log GC writes too, and must not between this
	// group's commit and its fsync (vlog.go).
	e.writeMu.Lock()
	err := e.failure.get()
	if err == nil {
		if e.writeFault != nil {
			err = e.writeFault()
		}
		if err == nil {
			err = e.write(group)
		}
		if err != nil {
			e.fail(err)
		}
		e.writeMu.Unlock()
	} else {
		e.writeMu.Unlock()
		err = fmt.Errorf("%w: db stopped after a write failure: %w", ErrClosed, err)
	}
	for _, b := range group {
		if e.onDone != nil {
			e.onDone(b, err)
		}
		if b.done != nil {
			b.done <- err
		}
	}
}

// fail stops the engine after a failed write or fsync: every later write
// is refused until restart, as etcd stops on a failed fsync, because what
// the failed write left on disk is not known.
func (e *Engine) fail(err error) {
	if !e.failure.set(err) {
		return
	}
	e.log.Error().Err(err).Msg("storage write failed; refusing further writes until restart")
	forgetBoot(e.dir)
	if e.onFail != nil {
		e.onFail(err)
	}
}

func (e *Engine) write(group []*Batch) error {
	start := time.Now()
	txn := e.bdb.NewTransaction(true)
	defer func() { txn.Discard() }()
	flush := func() error {
		if err := txn.Commit(); err != nil {
			return err
		}
		// Sync before the next transaction: see the note on memtable
		// rotation above.
		if err := e.bdb.Sync(); err != nil {
			return err
		}
		if hook := e.hooks.AfterPartSync; hook != nil {
			hook()
		}
		txn = e.bdb.NewTransaction(true)
		return nil
	}
	put := func(k Entry) error {
		var err error
		for range 2 {
			if k.Delete {
				err = txn.Delete(k.Key)
			} else {
				err = txn.Set(k.Key, k.Value)
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
	for _, b := range group {
		for _, k := range b.entries {
			if err := put(k); err != nil {
				return fmt.Errorf("storage: writing batch: %w", err)
			}
		}
	}
	if e.onGroup != nil {
		// Last: a split group may leave the batches' entries in an
		// earlier transaction than these, never these in an earlier one.
		for _, k := range e.onGroup(group) {
			if err := put(k); err != nil {
				return fmt.Errorf("storage: writing batch: %w", err)
			}
		}
	}
	if err := txn.Commit(); err != nil {
		return fmt.Errorf("storage: committing batch: %w", err)
	}
	if e.onWritten != nil {
		for _, b := range group {
			e.onWritten(b)
		}
	}
	written := time.Now()
	// Every group is synced, a group of nothing but watermark touches too:
	// only the newest transaction may then be torn by a machine crash,
	// which is what recovery rolls back (torn.go).
	if hook := e.hooks.BeforeSync; hook != nil {
		hook()
	}
	if err := e.bdb.Sync(); err != nil {
		return fmt.Errorf("storage: syncing batch: %w", err)
	}
	if e.onCommit != nil {
		e.onCommit(written.Sub(start), time.Since(written), true)
	}
	return nil
}

package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/strandhq/strand/internal/logging"
)

// valueLogGCInterval is how often the value log is checked for space that
// retention, cuts and drops freed.
const valueLogGCInterval = time.Minute

// gcStallLimit bounds how long one file's rewrite may hold every write
// (rewriteValueLogFile) before the store fails.
const gcStallLimit = 30 * time.Second

// gcFlushPrefix is a key prefix nothing is ever written under (ReservedKeyByte). Dropping it makes Badger flush every rotated memtable into a
// synced table and write nothing else: the one way Badger offers to do
// that on demand.
var gcFlushPrefix = []byte{ReservedKeyByte}

// valueLogGC reclaims value log space. Payloads above the value threshold
// live in the value log (e.go), which Badger only shrinks when asked: a file
// at least half garbage is rewritten. Each round rewrites at most a few
// files, one at a time, so appends wait for one file's rewrite at most.
func (e *Engine) valueLogGC() {
	for range 4 {
		err := e.rewriteValueLogFile()
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) && e.Err() == nil {
			// The marker could not be written or removed; a failed
			// rewrite stopped the engine, and fail logged it.
			e.log.Warn().Err(err).Msg("value log GC failed; will retry next round")
		}
		break
	}
}

// rewriteValueLogFile asks Badger to rewrite one value log file, and makes
// the rewrite durable before the old file is deleted.
//
// Badger's GC (badger v4.9.6 value.go, rewrite) writes a file's live values
// again through its write path, which with SyncWrites off does not fsync,
// and then deletes the file. A power loss after that would lose the values
// (confirmed records among them) on this copy: the new copies unsynced, the
// old file gone. And writes that fill Badger's memtable rotate it, so a
// batch the committer had committed but not yet synced would be left in a
// memtable whose log DB.Sync no longer syncs. Invariant 1 (a confirmed
// record is never lost) needs neither to happen, so:
//
//   - writeMu keeps the committer out for the whole rewrite: its batches
//     are committed and synced before the GC's writes, or after them;
//   - an iterator held open defers the old file's deletion: Badger deletes
//     a rewritten file only once no iterator is open (decrIteratorCount);
//   - DB.Sync makes the active memtable log and value log file durable,
//     and dropping gcFlushPrefix flushes every rotated memtable into a
//     synced table; only then is the iterator closed and the file deleted.
//
// If making the rewrite durable fails, the engine stops as after a failed write
// and the iterator is left open, so the old file stays until restart. If
// the rewrite and its flush take longer than gcStallLimit (Badger retries a
// failed memtable flush for ever), the engine stops too: every write waits on
// writeMu meanwhile, and a store that takes none must fail, so the broker
// stops and its streams fail over, rather than keep its lease.
//
// Until the Sync, the kernel may write the rewrite's new pointers (memtable
// log) back before the values they point to (value log), two separate
// files: a power loss in that window can leave the newest version of a
// moved record pointing at bytes never written. The old file is kept, so
// gcMarkerFile is written (and synced) before the rewrite and removed only
// once it is durable; an open after such a power loss finds it and reads
// the moved values back from the old file (repairValueLogGC, torn.go).
func (e *Engine) rewriteValueLogFile() error {
	if err := writeFileSync(e.dir, gcMarkerFile, nil); err != nil {
		return err
	}
	err := e.rewriteValueLogFileMarked()
	if e.Err() != nil && !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
		// The store failed part way: whether the rewrite is durable is not
		// known, so the marker stays for the next open.
		return err
	}
	if rerr := removeFileSync(e.dir, gcMarkerFile); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func (e *Engine) rewriteValueLogFileMarked() error {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	start := time.Now()
	limit := gcStallLimit
	if e.hooks.GCStallLimit > 0 {
		limit = e.hooks.GCStallLimit
	}
	stall := time.AfterFunc(limit, func() {
		e.fail(fmt.Errorf("storage: the value log GC has held every write for %s", limit))
	})
	defer stall.Stop()
	if err := e.Err(); err != nil {
		return err
	}
	txn := e.bdb.NewTransaction(false)
	pin := txn.NewIterator(badger.IteratorOptions{Prefix: gcFlushPrefix})
	release := func() {
		pin.Close()
		txn.Discard()
	}
	if err := e.bdb.RunValueLogGC(0.5); err != nil {
		if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
			// Nothing rewritten: nothing to make durable.
			release()
			return err
		}
		// A rewrite that failed part way (a write that failed, a full
		// disk, an entry it could not read) may have moved some values
		// without syncing them, and what a failed write left on disk is
		// not known: the engine stops as after a failed write. The iterator
		// stays open, so Badger keeps the old file, and so does the
		// marker, for the next open.
		err = fmt.Errorf("storage: value log GC: %w", err)
		e.fail(err)
		return err
	}
	if hook := e.hooks.AfterGCRewrite; hook != nil {
		hook()
	}
	if err := e.bdb.Sync(); err != nil {
		err = fmt.Errorf("storage: syncing value log GC rewrite: %w", err)
		e.fail(err)
		return err
	}
	if err := e.bdb.DropPrefix(gcFlushPrefix); err != nil {
		err = fmt.Errorf("storage: flushing memtables after value log GC: %w", err)
		e.fail(err)
		return err
	}
	release()
	// Every write waited this long: an operator sees why (docs/operating.md,
	// "Metrics").
	e.log.Info().Dur(logging.WritesHeld, time.Since(start)).Msg("value log GC rewrote a file")
	return nil
}

// gcLoop runs the value log GC every valueLogGCInterval until the engine
// stops writes, then closes gcDone.
func (e *Engine) gcLoop() {
	defer close(e.gcDone)
	t := time.NewTicker(valueLogGCInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.valueLogGC()
		}
	}
}

// RunValueLogGC rewrites one value log file now, if one is at least half
// garbage, as the GC loop does every valueLogGCInterval. It returns
// ErrNoRewrite when none is. For tests and tools.
func (e *Engine) RunValueLogGC() error {
	err := e.rewriteValueLogFile()
	if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
		return fmt.Errorf("%w: %w", ErrNoRewrite, err)
	}
	return err
}

// ErrNoRewrite: RunValueLogGC found no value log file to rewrite.
var ErrNoRewrite = errors.New("storage: no value log file to rewrite")

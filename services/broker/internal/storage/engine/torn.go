package engine

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/dgraph-io/badger/v4"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/logging"
)

// Torn writes. Badger writes a transaction's values above the value
// threshold to its value log, and its keys, pointers and small
// values to the memtable's write-ahead log: two files whose dirty pages
// (one written through a memory mapping, the other with pwrite, see
// third_party/badger) the kernel writes back in no particular order until
// the committer's fsync. A machine crash between a commit and its fsync can thus leave
// the transaction's keys on disk and its values not. Badger does not
// notice: on open it truncates the value log at its first torn entry and
// replays the write-ahead log as it is, and a read past the value log's
// end yields an empty value with no error (readable). The model's
// metadata could claim records no read returns, or not decode at all, and
// a copy that reported such a tail would break invariant 1
// (docs/protocol.md, "Safety argument": a copy counts toward W only for
// what it holds durably).
//
// Only the newest transaction can be torn: the committer syncs every
// transaction before it writes the next (commit.go), and Badger numbers
// transactions in commit order. Nothing in it was synced, so no confirm
// counted on it: an owner counts itself only once durable, a follower
// reports durable tails only. So after a stop that may have lost written
// data (boot.go), Open first recovers, on Badger opened without
// compactions (which could drop the older versions it needs):
//
//  1. if any value written at or above rec.From (the newest transaction's
//     version, at first) cannot be read, nor found whole where a value log
//     GC cut short moved it from, everything written from there is rolled
//     back: each such key gets its newest version below rec.From back, or
//     goes (rollBack). The store is then what the last fsync left, which is
//     all any confirm counted on;
//  2. a value log GC rewrite that was not durable (gcMarkerFile) gets its
//     moved values back from the file it moved them from
//     (repairValueLogGC);
//  3. the caller's step runs (Options.Recover): the model marks every copy
//     unsure of its epoch (State.UnsureEpoch), for the broker (replica,
//     "unsure owner").
//
// The recovery's own writes can be torn by a power loss as well, and so can
// the open's writes that follow until the recovery is done (Settle: the
// model's pending drops and cuts): each step moves rec.From past its synced writes, unsureFile keeps
// rec until the open is done, and the open holds a read transaction until
// then, so compaction keeps the versions below From; a crash anywhere rolls
// back to the last synced step and does the rest again. When values a GC
// moved are found nowhere, Recovery.ValuesLost tells the caller to read
// back what it relies on before Settle (the model cuts a copy below the
// lowest segment it cannot read).

// gcMarkerFile exists while the value log GC rewrites a file and the
// rewrite is not yet durable (vlog.go).
const gcMarkerFile = "STRAND_VLOG_GC"

// unsureRecord is what unsureFile holds.
type unsureRecord struct {
	// From: every version below it is synced; what was written at or
	// above it may be torn. First Badger's newest version (the newest
	// transaction), then past each synced write of the recovery.
	From uint64 `json:"from"`
	// RollBack: a value written at or above From cannot be read, and
	// everything written from From is being rolled back.
	RollBack bool `json:"roll_back,omitempty"`
	// CheckAll: values the value log GC moved are lost
	// (Recovery.ValuesLost); the caller reads back what it relies on.
	CheckAll bool `json:"check_all,omitempty"`
	// Newest is Badger's newest version when the recovery began: only
	// versions at or below it can have been moved by a value log GC (it
	// runs only once a recovery is done). Above it, a value log entry of
	// the same key and version is stale: Badger reuses the version of a
	// transaction a crash dropped from the write-ahead log, whose values
	// may have reached the value log.
	Newest uint64 `json:"newest,omitempty"`
}

// recoverStore runs the recovery on Badger opened with bo but without
// compactions, and closes it. It records the new boot (checkBoot), so the
// open after it finds only unsureFile, and returns what it holds.
func recoverStore(bo badger.Options, dir, bootIDPath string, log zerolog.Logger, hooks *Hooks, mark func(*Recovering) error) (unsureRecord, error) {
	bdb, err := badger.Open(bo.WithNumCompactors(0).WithNumLevelZeroTablesStall(math.MaxInt32))
	if err != nil {
		return unsureRecord{}, fmt.Errorf("storage: opening badger in %s for recovery: %w", dir, err)
	}
	r := &recovery{bdb: bdb, dir: dir, log: log, hooks: hooks, mark: mark}
	err = r.run(bootIDPath)
	if cerr := bdb.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("storage: closing badger after recovery: %w", cerr)
	}
	return r.rec, err
}

// recovery is one run of the recovery (see above). It keeps nothing
// between its steps but rec, which is saved: a run cut short anywhere is
// redone from rec alone.
type recovery struct {
	bdb *badger.DB
	dir string
	log zerolog.Logger
	rec unsureRecord
	// hooks are Options.Hooks; mark is Options.Recover.
	hooks *Hooks
	mark  func(*Recovering) error
}

func (r *recovery) run(bootIDPath string) error {
	lost, rec, err := checkBoot(r.dir, bootIDPath, r.bdb.MaxVersion)
	if err != nil || !lost {
		return err
	}
	r.rec = rec
	steps := []struct {
		name string
		do   func() error
	}{
		{"roll back", r.rollBack},
		{"repair", r.repairValueLogGC},
		{"mark", func() error {
			if r.mark == nil {
				return nil
			}
			return r.mark(&Recovering{bdb: r.bdb, hooks: r.hooks})
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			return err
		}
		// What the step wrote is synced (and so is what a process that
		// died on this boot left in the page cache, which reads back
		// whole): below From from here on.
		if err := r.bdb.Sync(); err != nil {
			return err
		}
		if from := r.bdb.MaxVersion() + 1; from > r.rec.From || r.rec.RollBack {
			r.rec.From, r.rec.RollBack = max(from, r.rec.From), false
			if err := saveUnsure(r.dir, r.rec); err != nil {
				return err
			}
		}
		if hook := r.hooks.AfterRecoveryStep; hook != nil {
			if err := hook(st.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// note sets a decision of rec and saves rec before it is acted on, so a
// crash after it acts the same way again.
func (r *recovery) note(flag *bool) error {
	if *flag {
		return nil
	}
	*flag = true
	return saveUnsure(r.dir, r.rec)
}

// versionKey names a key at a version: the form valueLogEntries takes.
func versionKey(key []byte, version uint64) string { return string(versionedKey(key, version)) }

// moved returns, after a value log GC rewrite a power loss cut short
// (gcMarkerFile), the values of want (versionKey) that are whole in some
// value log file; without such a rewrite, none.
func (r *recovery) moved(want map[string]struct{}) (map[string][]byte, error) {
	if len(want) == 0 || !fileExists(r.dir, gcMarkerFile) {
		return nil, nil
	}
	vals, err := valueLogEntries(r.dir, math.MaxUint32, want)
	if err != nil {
		return nil, fmt.Errorf("storage: reading the value log after an interrupted value log GC: %w", err)
	}
	return vals, nil
}

// readable reports whether Badger can read item's value. A value log read
// that fails (a pointer past the value log's end, a file that is gone, a
// checksum that does not match) is logged by Badger and yields an empty
// value, not an error (badger v4.9.6 iterator.go, yieldItemValue); nothing
// this store writes to the value log is empty.
func readable(item *badger.Item) bool {
	n := 0
	err := item.Value(func(v []byte) error {
		n = len(v)
		return nil
	})
	return err == nil && (n > 0 || item.ValueSize() <= 0)
}

// repairValueLogGC runs when gcMarkerFile says a value log GC rewrite
// was not yet durable: a value it moved may be torn at its new place though
// whole at its old one, which Badger deletes only after the rewrite is
// durable (vlog.go). Every newest value is read (readable); each that
// cannot be is looked up in the value log files by its key and version
// (moved) and written again. A value found nowhere is left, and every
// copy's segments are read back once the store is open (CheckAll).
func (r *recovery) repairValueLogGC() error {
	if !fileExists(r.dir, gcMarkerFile) {
		return nil
	}
	type torn struct {
		key     []byte
		version uint64
	}
	var found []torn
	want := map[string]struct{}{}
	err := r.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if readable(item) {
				continue
			}
			t := torn{key: item.KeyCopy(nil), version: item.Version()}
			found = append(found, t)
			if t.version <= r.rec.Newest {
				want[versionKey(t.key, t.version)] = struct{}{}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: reading back values after an interrupted value log GC: %w", err)
	}
	vals, err := r.moved(want)
	if err != nil {
		return err
	}
	var fixes []Entry
	for _, t := range found {
		// vals holds only keys of want.
		if v, ok := vals[versionKey(t.key, t.version)]; ok {
			fixes = append(fixes, Entry{Key: t.key, Value: v})
		}
	}
	missing := len(found) - len(fixes)
	if missing > 0 {
		if err := r.note(&r.rec.CheckAll); err != nil {
			return err
		}
	}
	if err := writeBack(r.bdb, fixes, r.hooks); err != nil {
		return fmt.Errorf("storage: writing back values after an interrupted value log GC: %w", err)
	}
	if len(found) > 0 {
		ev := r.log.Warn()
		if missing > 0 {
			ev = r.log.Error()
		}
		ev.Int(logging.Torn, len(found)).Int(logging.Repaired, len(fixes)).Int(logging.Lost, missing).
			Msg("a power loss interrupted a value log GC rewrite: values it moved were read back from the file it moved them from")
	}
	return nil
}

// rollBack rolls back everything written at or above rec.From when any
// value written there cannot be read (in place, nor, after a GC rewrite cut
// short, where the GC moved it from): every key whose newest version is at
// or above From gets its newest version below From written again, or is
// deleted when it had none (or was deleted there). The decision is saved
// first; the roll back reads only versions below From, which are synced
// (or found whole in the value log), so a crash in the middle of it does it
// again, and it writes in bounded, synced pieces.
func (r *recovery) rollBack() error {
	from := r.rec.From
	// First: is anything written from From torn? want collects the values
	// that cannot be read in place: the newest (at or above From) and the
	// one below From of each key written there.
	want := map[string]struct{}{}
	var newest []string // versionKey of each key's unreadable newest version
	never := 0          // unreadable newest versions no GC saw
	err := r.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{AllVersions: true})
		defer it.Close()
		var last []byte
		written, below := false, false // last was written from From; its version below From was seen
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if !bytes.Equal(item.Key(), last) {
				last = item.KeyCopy(last[:0])
				written, below = item.Version() >= from, false
				if written && !item.IsDeletedOrExpired() && !readable(item) {
					if item.Version() > r.rec.Newest {
						never++ // no GC moved it: torn
						continue
					}
					vk := versionKey(last, item.Version())
					want[vk] = struct{}{}
					newest = append(newest, vk)
				}
				continue
			}
			if !written || below || item.Version() >= from {
				continue
			}
			below = true
			if !item.IsDeletedOrExpired() && !readable(item) && item.Version() <= r.rec.Newest {
				want[versionKey(last, item.Version())] = struct{}{}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: reading back what was written last: %w", err)
	}
	vals, err := r.moved(want)
	if err != nil {
		return err
	}
	torn := never
	for _, vk := range newest {
		if _, ok := vals[vk]; !ok {
			torn++
		}
	}
	if torn == 0 && !r.rec.RollBack {
		// All of it reached the disk (what the GC moved, the repair puts
		// back in place).
		return nil
	}
	if err := r.note(&r.rec.RollBack); err != nil {
		return err
	}

	// Then the roll back, piece by piece.
	const pieceKeys, pieceBytes = 4096, 16 << 20
	var piece []Entry
	size, keys, lost := 0, 0, 0
	flush := func() error {
		err := writeBack(r.bdb, piece, r.hooks)
		keys += len(piece)
		piece, size = nil, 0
		return err
	}
	err = r.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{AllVersions: true})
		defer it.Close()
		// pending is the key seen last while its value to restore is
		// not found yet.
		var last, pending []byte
		restore := func(k Entry) error {
			piece = append(piece, k)
			size += len(k.Key) + len(k.Value)
			pending = nil
			if len(piece) >= pieceKeys || size >= pieceBytes {
				return flush()
			}
			return nil
		}
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if !bytes.Equal(item.Key(), last) {
				if pending != nil {
					// No older version: the key goes.
					if err := restore(Entry{Key: pending, Delete: true}); err != nil {
						return err
					}
				}
				last = item.KeyCopy(last[:0])
				if item.Version() >= from {
					pending = item.KeyCopy(nil)
				}
				continue
			}
			if pending == nil || item.Version() >= from {
				continue
			}
			switch {
			case item.IsDeletedOrExpired():
				if err := restore(Entry{Key: pending, Delete: true}); err != nil {
					return err
				}
			case readable(item):
				v, err := item.ValueCopy(nil)
				if err != nil {
					return err
				}
				if err := restore(Entry{Key: pending, Value: v}); err != nil {
					return err
				}
			default:
				if v, ok := vals[versionKey(pending, item.Version())]; ok {
					if err := restore(Entry{Key: pending, Value: v}); err != nil {
						return err
					}
					continue
				}
				// Synced, yet found nowhere: a value a GC moved before a
				// power loss took the old file too. An older version stands
				// in, and every copy's segments are read back (CheckAll).
				lost++
			}
		}
		if pending != nil {
			return restore(Entry{Key: pending, Delete: true})
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return fmt.Errorf("storage: rolling back what was written last: %w", err)
	}
	if lost > 0 {
		if err := r.note(&r.rec.CheckAll); err != nil {
			return err
		}
	}
	ev := r.log.Warn()
	if lost > 0 {
		ev = r.log.Error()
	}
	ev.Uint64(logging.FromVersion, from).Int(logging.Torn, torn).Int(logging.Keys, keys).Int(logging.Lost, lost).
		Msg("writes made before an unclean stop did not fully reach the disk: rolled back to what the last synced write left")
	return nil
}

// writeBack writes kvs durably: while the store is recovered, before the
// committer runs.
func writeBack(bdb *badger.DB, kvs []Entry, hooks *Hooks) error {
	if len(kvs) == 0 {
		return nil
	}
	txn := bdb.NewTransaction(true)
	defer func() { txn.Discard() }()
	put := func(k Entry) error {
		if k.Delete {
			return txn.Delete(k.Key)
		}
		return txn.Set(k.Key, k.Value)
	}
	for i, k := range kvs {
		if i > 0 && i == hooks.WriteBackSplit {
			// Tests only: a write back cut short after its first
			// transaction, as a crash there would.
			if err := txn.Commit(); err != nil {
				return err
			}
			if err := bdb.Sync(); err != nil {
				return err
			}
			return errors.New("injected: crash in the middle of a write back")
		}
		err := put(k)
		if errors.Is(err, badger.ErrTxnTooBig) {
			// Synced before the next one, as the committer does: a
			// memtable Badger rotates out is never synced.
			if err = txn.Commit(); err == nil {
				err = bdb.Sync()
			}
			if err == nil {
				txn = bdb.NewTransaction(true)
				err = put(k)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := txn.Commit(); err != nil {
		return err
	}
	if hook := hooks.BeforeWriteBackSync; hook != nil {
		hook()
	}
	return bdb.Sync()
}

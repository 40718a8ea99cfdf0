package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/dgraph-io/badger/v4"
)

// Torn value log writes. A segment's value lives in Badger's value log and
// its key, with a pointer to the value, in the memtable's write-ahead log:
// two memory-mapped files that the kernel writes back in no particular
// order until the committer's fsync. A machine crash between a batch's
// commit and its fsync can thus leave the batch's keys (and the stream
// metadata counting them, which rides in the same log) on disk while
// the values they point to never got there. Badger does not notice: on
// open it truncates the value log at its first torn entry and replays the
// write-ahead log as it is, so the metadata claims records that no read
// can return. A copy that reported such a tail would break invariant 1
// (seed "Safety argument": a copy counts toward W only for what it holds
// durably): a follower could be counted for records it cannot serve, and
// a recovery could pick it as the furthest copy.
//
// Those records were never synced here, so no confirm counted this copy
// for them (an owner counts itself only once durable, a follower reports
// durable tails only). After a stop that may have lost written records
// (boot.go), each copy's newest segments are read back and checked, and
// the copy is cut
// (cut.go, crash-safe and idempotent) below the lowest one that cannot be
// read: it then claims exactly what it holds, and catches up from its
// owner like any follower behind.
//
// Only the last transaction can be torn this way: the committer syncs
// after every transaction before it writes the next one (commit.go), and
// Badger numbers transactions in commit order. So the walk down from the
// tail stops at the first segment committed before the newest
// transaction's version; the value log GC is the one writer that puts
// older versions at the end of the value log (vlog.go), and it leaves a
// marker while it does (gcMarkerFile), after which every segment is read.

// gcMarkerFile exists while the value log GC rewrites a file and the
// rewrite is not yet durable (vlog.go).
const gcMarkerFile = "STRAND_VLOG_GC"

// tornCheck says which of a copy's segments loadStream reads back: none
// when the store was stopped cleanly or only its process died (the page
// cache kept every write); those committed at or after since; or all.
type tornCheck struct {
	since uint64
	all   bool
}

func (c tornCheck) on() bool { return c.all || c.since > 0 }

// findTorn returns the first offset of the lowest record segment of the
// copy that does not hold what it was written with, and whether there is
// one. Badger does not always say: a value past the torn end of the value
// log reads as an error, but one inside the file as Badger sized it reads
// as zeros. So each segment is decoded and its records checked against the
// chain (chain.go), which covers every byte of every record: its offsets
// must follow on, and each record's chain must be Chain(previous, record).
//
// The segments checked are those committed at or after check.since (or all
// for check.all): a walk down from the tail finds where they start, and the
// record just below them, committed and synced before, gives the chain to
// start from.
func (s *Stream) findTorn(head, tail uint64, check tornCheck) (from uint64, found bool, err error) {
	if tail == head {
		return 0, false, nil
	}
	err = s.db.bdb.View(func(txn *badger.Txn) error {
		start := head
		if !check.all {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: s.recPrefix, Reverse: true})
			for it.Seek(offsetKey(s.recPrefix, tail-1)); it.Valid(); it.Next() {
				item := it.Item()
				if last := keyOffset(item.Key()); item.Version() < check.since || last < head {
					start = max(last+1, head)
					break
				}
			}
			it.Close()
		}
		prev, ok := uint64(0), false
		if start == head {
			s.mu.Lock()
			prev, ok = s.m.HeadChain, true
			s.mu.Unlock()
		} else if err := s.scanRecords(txn, start-1, start, false, ErrCorrupt, func(rec Record, _ int) bool {
			prev, ok = rec.Chain, true
			return true
		}); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: no chain at offset %d", ErrCorrupt, start)
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: s.recPrefix})
		defer it.Close()
		next := start
		for it.Seek(offsetKey(s.recPrefix, start)); it.Valid() && next < tail; it.Next() {
			item := it.Item()
			segStart := next
			err := item.Value(func(seg []byte) error {
				return eachSegmentRecord(seg, func(enc []byte) (bool, error) {
					rec, err := decodeRecordFields(enc, payloadAlias)
					if err != nil {
						return false, err
					}
					if rec.Offset < next && next == head {
						return true, nil // below the head, in the segment that straddles it
					}
					if rec.Offset != next || rec.Chain != Chain(prev, &rec) {
						return false, fmt.Errorf("%w: record %d", ErrCorrupt, next)
					}
					prev = rec.Chain
					next++
					return true, nil
				})
			})
			if err == nil && next != keyOffset(item.Key())+1 {
				err = fmt.Errorf("%w: segment %d ends at %d", ErrCorrupt, keyOffset(item.Key()), next)
			}
			if err != nil {
				from, found = segStart, true
				return nil
			}
		}
		if next < tail {
			// Segments missing altogether: the write-ahead log lost them.
			from, found = next, true
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("storage: reading back the newest segments of stream %q: %w", s.name, err)
	}
	return from, found, nil
}

// cutTornTail cuts the copy below its lowest segment that cannot be read
// (findTorn), through the cut intent, which loadStream then completes.
// The chain and bytes after the cut are computed from what remains, which
// all reads.
func (s *Stream) cutTornTail(ctx context.Context, check tornCheck) error {
	s.mu.Lock()
	head, rt, et := s.m.Head, s.m.RecordTail, s.m.CursorEventTail
	s.mu.Unlock()
	from, found, err := s.findTorn(head, rt, check)
	if err != nil || !found {
		return err
	}
	var chain, bytes uint64
	err = s.db.bdb.View(func(txn *badger.Txn) error {
		if from == head {
			s.mu.Lock()
			chain = s.m.HeadChain
			s.mu.Unlock()
		}
		return s.scanRecords(txn, head, from, false, ErrCorrupt, func(rec Record, size int) bool {
			chain = rec.Chain
			bytes += uint64(size)
			return true
		})
	})
	if err != nil {
		return fmt.Errorf("storage: preparing the cut of stream %q below its torn segments: %w", s.name, err)
	}
	s.db.log.Warn().Str("stream", s.name).Uint64("record_tail", rt).Uint64("cut_to", from).
		Msg("records written before an unclean stop did not reach the disk: cutting this copy to the records it holds; it catches up from its owner")
	intent := &cutIntent{RecordTail: from, CursorEventTail: et, Chain: chain, Bytes: bytes}
	return s.commitMeta(ctx, func(m *meta) error {
		if m.Cut != nil {
			return errors.New("storage: a cut is already pending")
		}
		m.Cut = intent
		return nil
	})
}

// segmentStartsAt reports whether a segment starts at from: the segment
// below it ends at from-1, or from is at or below the head (what a segment
// holds below the head is not part of the log). truncateRecords uses it to
// delete a segment it cannot read (cutTornTail) without reading it.
func (s *Stream) segmentStartsAt(txn *badger.Txn, from uint64) bool {
	s.mu.Lock()
	head := s.m.Head
	s.mu.Unlock()
	if from <= head {
		return true
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: s.recPrefix, Reverse: true})
	defer it.Close()
	it.Seek(offsetKey(s.recPrefix, from-1))
	return it.Valid() && keyOffset(it.Item().Key()) == from-1
}

// settle runs after an open that may have lost written records: it loads
// every stream copy, which reads back its newest segments and records the
// unsure epoch in its metadata (loadStream), then removes the marker that
// made this open unsure (boot.go). A crash before the marker goes leaves
// it for the next open to do all of this again.
func (db *DB) settle() error {
	names, err := db.Streams()
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, err := db.Open(name); err != nil {
			return err
		}
	}
	// Every copy that could hold a torn write is checked; streams made
	// from here on cannot.
	db.tornCheck = tornCheck{}
	if err := removeFileSync(db.dir, gcMarkerFile); err != nil {
		return err
	}
	return removeFileSync(db.dir, unsureFile)
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

// repairValueLogGC runs on an open that may have lost written records
// while gcMarkerFile says a value log GC rewrite was not yet durable: a
// value it moved may be torn at its new place though whole at its old one,
// which Badger deletes only after the rewrite is durable (vlog.go). Every
// value is read (Badger checks each one's checksum); each that fails
// (readable) is
// looked up in the value log files by its key and version
// (valueLogEntries) and written again, then synced. A value found nowhere
// is left: a segment's copy is then cut below it (loadStream reads every
// segment back, check.all), anything else fails its stream's load, loudly.
func (db *DB) repairValueLogGC() error {
	type torn struct {
		key     []byte
		version uint64
	}
	var found []torn
	want := map[string]struct{}{}
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if readable(item) {
				continue
			}
			t := torn{key: item.KeyCopy(nil), version: item.Version()}
			found = append(found, t)
			want[string(versionedKey(t.key, t.version))] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: reading back values after an interrupted value log GC: %w", err)
	}
	if len(found) == 0 {
		return nil
	}
	vals, err := valueLogEntries(db.dir, math.MaxUint32, want)
	if err != nil {
		return fmt.Errorf("storage: reading the value log after an interrupted value log GC: %w", err)
	}
	var fixes []kv
	for _, t := range found {
		if v, ok := vals[string(versionedKey(t.key, t.version))]; ok {
			fixes = append(fixes, kv{key: t.key, val: v})
		}
	}
	if err := db.writeBack(fixes); err != nil {
		return fmt.Errorf("storage: writing back values after an interrupted value log GC: %w", err)
	}
	ev := db.log.Warn()
	if repaired := len(fixes); repaired < len(found) {
		ev = db.log.Error()
		db.tornCheck.all = true
	}
	ev.Int("torn", len(found)).Int("repaired", len(fixes)).
		Msg("a power loss interrupted a value log GC rewrite: values it moved were read back from the file it moved them from")
	return nil
}

// restoreTorn runs on an open that may have lost written records, before
// any stream is read. The newest transaction's metadata, cursor snapshots
// and producer table chunks may be torn just as its segments (they go to
// the value log once above the value threshold: a meta with a few log
// epochs does). For every such key whose newest version is of the newest
// transaction (since) and cannot be read, the newest older version that
// can is written back: the state the last synced transaction left, which
// is all any confirm counted on. The segments that transaction added then
// lie past the restored tails and go when the stream is loaded. A torn
// snapshot or producer chunk with no older version is deleted (cursors are
// then rebuilt from the cursor event log, the producer table from an older
// checkpoint and the records); a torn meta with none is left, and its
// stream fails to load, loudly.
func (db *DB) restoreTorn(since uint64) error {
	var fixes []kv
	var left []string
	err := db.bdb.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{AllVersions: true})
		defer it.Close()
		var last, torn []byte // the key seen last; that key when its newest version is torn
		settle := func() {
			if torn == nil {
				return
			}
			if torn[0] == kindMeta {
				left = append(left, string(torn))
			} else {
				fixes = append(fixes, kv{key: torn, del: true})
			}
			torn = nil
		}
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k := item.Key()
			if bytes.Equal(k, last) {
				// An older version of the key seen last.
				if torn == nil {
					continue
				}
				switch {
				case item.IsDeletedOrExpired():
					fixes = append(fixes, kv{key: torn, del: true})
					torn = nil
				case readable(item):
					v, err := item.ValueCopy(nil)
					if err != nil {
						return err
					}
					fixes = append(fixes, kv{key: torn, val: v})
					torn = nil
				}
				continue
			}
			settle() // the key before had no readable older version
			last = item.KeyCopy(last[:0])
			if k[0] == kindRecord || item.Version() < since || item.IsDeletedOrExpired() || readable(item) {
				continue
			}
			torn = item.KeyCopy(nil)
		}
		settle()
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: reading back the newest transaction: %w", err)
	}
	if len(left) > 0 {
		db.log.Error().Strs("keys", left).Msg("metadata written before an unclean stop did not reach the disk and no earlier version is left; those streams will not load")
	}
	if len(fixes) == 0 {
		return nil
	}
	if err := db.writeBack(fixes); err != nil {
		return fmt.Errorf("storage: restoring torn keys: %w", err)
	}
	db.log.Warn().Int("keys", len(fixes)).
		Msg("metadata written before an unclean stop did not reach the disk: restored what the last synced write left")
	return nil
}

// writeBack writes kvs durably, on Open, before the store takes writes;
// writeMu keeps the value log GC out.
func (db *DB) writeBack(kvs []kv) error {
	if len(kvs) == 0 {
		return nil
	}
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	txn := db.bdb.NewTransaction(true)
	defer func() { txn.Discard() }()
	put := func(k kv) error {
		if k.del {
			return txn.Delete(k.key)
		}
		return txn.Set(k.key, k.val)
	}
	for _, k := range kvs {
		err := put(k)
		if errors.Is(err, badger.ErrTxnTooBig) {
			// Synced before the next one, as the committer does: a
			// memtable Badger rotates out is never synced.
			if err = txn.Commit(); err == nil {
				err = db.bdb.Sync()
			}
			if err == nil {
				txn = db.bdb.NewTransaction(true)
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
	return db.bdb.Sync()
}

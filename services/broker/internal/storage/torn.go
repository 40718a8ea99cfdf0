package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Torn writes, as the model sees them. A machine crash between a commit
// and its fsync can leave the newest transaction's keys on disk and its
// values not; the engine rolls that transaction back on open
// (engine/torn.go), so the store is what the last fsync left, which is all
// any confirm counted on. What the model adds:
//
//   - markUnsure, the recovery's last step (engine.Options.Recover): every
//     copy is marked unsure of its epoch (State.UnsureEpoch), for the
//     broker (replica, "unsure owner");
//   - after a value log GC a power loss cut short, values it moved may be
//     found nowhere (engine.Recovery.ValuesLost): every copy's segments are
//     then read back, and a copy is cut below the lowest segment it cannot
//     read (checkAll, cutTornTail), before the open settles.

// findTorn returns the first offset of the lowest record segment of the
// copy that does not hold what it was written with, whether there is one,
// and the chain and encoded bytes of the records below it. Each segment is read (readable: a torn one reads as empty) and
// decoded, and its records are checked against the chain (chain.go), which
// covers every byte of every record: offsets must follow on, and each
// record's chain must be Chain(previous, record).
func (s *Stream) findTorn(head, tail uint64) (from uint64, found bool, chain, size uint64, err error) {
	s.assigned.mu.Lock()
	chain = s.assigned.m.HeadChain
	s.assigned.mu.Unlock()
	if tail == head {
		return 0, false, chain, 0, nil
	}
	err = s.db.eng.View(func(txn *engine.Txn) error {
		it := txn.NewIterator(engine.IterOptions{Prefix: s.recPrefix})
		defer it.Close()
		next := head
		for it.Seek(offsetKey(s.recPrefix, head)); it.Valid() && next < tail; it.Next() {
			item := it.Item()
			segStart, segChain, segSize := next, chain, size
			err := item.Value(func(seg []byte) error {
				return eachSegmentRecord(seg, func(enc []byte) (bool, error) {
					rec, err := decodeRecordFields(enc, payloadAlias)
					if err != nil {
						return false, err
					}
					if rec.Offset < next && next == head {
						return true, nil // below the head, in the segment that straddles it
					}
					if rec.Offset != next || rec.Chain != Chain(chain, &rec) {
						return false, fmt.Errorf("%w: record %d", ErrCorrupt, next)
					}
					chain = rec.Chain
					size += uint64(len(enc))
					next++
					return true, nil
				})
			})
			if err == nil && next != keyOffset(item.Key())+1 {
				err = fmt.Errorf("%w: segment %d ends at %d", ErrCorrupt, keyOffset(item.Key()), next)
			}
			if err != nil {
				from, found, chain, size = segStart, true, segChain, segSize
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
		return 0, false, 0, 0, fmt.Errorf("storage: reading back the segments of stream %q: %w", s.name, err)
	}
	return from, found, chain, size, nil
}

// cutTornTail cuts the copy below its lowest segment that cannot be read
// (findTorn), through the cut intent, which loadStream then completes.
func (s *Stream) cutTornTail(ctx context.Context) error {
	s.assigned.mu.Lock()
	head, rt, et := s.assigned.m.Head, s.assigned.m.RecordTail, s.assigned.m.CursorEventTail
	s.assigned.mu.Unlock()
	from, found, chain, size, err := s.findTorn(head, rt)
	if err != nil || !found {
		return err
	}
	s.db.log.Error().Str(logging.Stream, s.name).Uint64(logging.RecordTail, rt).Uint64(logging.CutTo, from).
		Msg("records a value log GC moved before a power loss are lost here: cutting this copy to the records it holds; it catches up from its owner")
	intent := &cutIntent{RecordTail: from, CursorEventTail: et, Chain: chain, Bytes: size}
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
func (s *Stream) segmentStartsAt(txn *engine.Txn, from uint64) bool {
	s.assigned.mu.Lock()
	head := s.assigned.m.Head
	s.assigned.mu.Unlock()
	if from <= head {
		return true
	}
	it := txn.NewIterator(engine.IterOptions{Prefix: s.recPrefix, Reverse: true})
	defer it.Close()
	it.Seek(offsetKey(s.recPrefix, from-1))
	return it.Valid() && keyOffset(it.Item().Key()) == from-1
}

// markUnsure marks every copy but a sealed one unsure of its epoch
// (State.UnsureEpoch): the recovery's last step (engine.Options.Recover).
// Marking a marked copy again changes nothing, so a crash may repeat it.
func markUnsure(r *engine.Recovering) error {
	var fixes []engine.Entry
	err := eachMeta(r, func(_ string, key []byte, m meta) {
		if m.Dropping || m.SealEpoch != 0 || m.UnsureEpoch >= m.Epoch {
			// A sealed copy took nothing at its epoch after its seal,
			// and the seal returned only once everything before it was
			// durable: nothing written can be missing at that epoch. (A
			// seal the crash tore was rolled back, with the epoch.)
			return
		}
		m.UnsureEpoch = m.Epoch
		fixes = append(fixes, engine.Entry{Key: bytes.Clone(key), Value: encodeMeta(&m)})
	})
	if err != nil {
		return fmt.Errorf("storage: marking copies unsure: %w", err)
	}
	return r.Write(fixes)
}

// settle finishes the open: after a recovery that lost values a GC moved
// (checkAll) it loads every stream copy, which reads back its segments and
// cuts it below any it cannot read (loadStream); then the engine settles
// (engine.Engine.Settle: the recovery's markers go). A crash before that
// does all of it again.
func (db *DB) settle() error {
	if db.checkAll {
		names, err := db.Streams()
		if err != nil {
			return err
		}
		for _, name := range names {
			if _, err := db.Open(name); err != nil {
				return err
			}
		}
	}
	db.checkAll = false
	return db.eng.Settle()
}

package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Cursor event log compaction. A copy's cursor state is its cursor snapshot
// plus the events after the snapshot's boundary, so once a snapshot is
// durable the events below its boundary are not needed to rebuild the state
// and are deleted. Every copy does it on its own, after its own durable
// snapshot (the snapshot rule in cursor.go runs on owner and followers
// alike); nothing of it is replicated. A follower whose cursor event tail is
// below what its owner retains takes the owner's snapshot instead of the
// events (InstallCursorSnapshot).
//
// Crash safety, in three steps, each atomic or idempotent:
//
//  1. The snapshot is written in one transaction with the metadata that
//     counts its events (or, in a batch split at Badger's transaction
//     bound, before it: the open then lowers its boundary to the tail).
//     Nothing is deleted before that transaction is synced, so a torn one,
//     which Open rolls back (engine/torn.go), has lost no events.
//  2. The events in [CursorEventsPurged, boundary) are deleted in bounded
//     batches; each batch and the purge mark it advances are one
//     transaction. A delete repeated finds nothing and only moves the mark.
//  3. Open finishes whatever step 2 left (loadStream), before the copy is
//     used: a stop between the snapshot and the first delete, or between
//     two batches, leaves the mark below the boundary.
//
// Readers never see a half-deleted range: dEvHead, the lowest event
// ReadCursorEvents serves, moves past a batch before the batch is deleted.

// CursorSnapshot is a copy's durable cursor snapshot: the cursor state
// folded over every cursor event below Boundary.
type CursorSnapshot struct {
	Boundary uint64
	// Epoch is the epoch of the event at Boundary-1 as the copy's log
	// epochs say (0 when Boundary is 0).
	Epoch   uint64
	Cursors map[string]uint64
}

// CursorEventHead returns the lowest cursor event offset ReadCursorEvents
// serves: the events below it were compacted away, and CursorSnapshot
// stands for them (its boundary is at or above it).
func (s *Stream) CursorEventHead() uint64 {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	return s.dEvHead
}

// CursorSnapshot returns the copy's durable cursor snapshot. An owner ships
// it to a follower whose cursor event tail is below CursorEventHead.
func (s *Stream) CursorSnapshot() CursorSnapshot {
	s.mu.Lock()
	les := s.m.LogEpochs // copy-on-write: never changed in place
	s.mu.Unlock()
	s.dmu.Lock()
	snap := s.dSnap
	s.dmu.Unlock()
	var epoch uint64
	for _, e := range les {
		if e.CursorEventStart < snap.Boundary {
			epoch = e.Epoch
		}
	}
	return CursorSnapshot{Boundary: snap.Boundary, Epoch: epoch, Cursors: maps.Clone(snap.Cursors)}
}

// InstallCursorSnapshot makes the owner's cursor snapshot this follower's:
// the cursor state becomes snap's and the cursor event log continues at
// snap.Boundary, with the events this copy held below it compacted away. An
// owner sends it when the follower's cursor event tail is below the events
// it retains, so snap.Boundary must be above this copy's cursor event tail
// (else ErrOffsetMismatch) and its epoch at most the copy's (else
// ErrFenced); a sealed copy or one being cut takes nothing (ErrFenced). The
// events it stands for are counted to snap.Epoch from this copy's old tail.
// It returns once the snapshot and the new tail are durable, so events
// after it are only ever applied on top of an installed snapshot. On any
// error nothing is stored.
func (s *Stream) InstallCursorSnapshot(ctx context.Context, snap CursorSnapshot) error {
	for name := range snap.Cursors {
		if err := validCursorName(name); err != nil {
			return fmt.Errorf("cursor snapshot: %w", err)
		}
	}
	s.mu.Lock()
	if err := s.checkReplicatedLocked(nil, nil); err != nil {
		s.mu.Unlock()
		return err
	}
	if snap.Boundary <= s.m.CursorEventTail {
		s.mu.Unlock()
		return fmt.Errorf("%w: cursor snapshot at %d, at or below cursor event tail %d", ErrOffsetMismatch, snap.Boundary, s.m.CursorEventTail)
	}
	if snap.Epoch > s.m.Epoch {
		s.mu.Unlock()
		return fmt.Errorf("%w: cursor snapshot of epoch %d above copy epoch %d", ErrFenced, snap.Epoch, s.m.Epoch)
	}
	prev, prevCursors, prevSnap := s.m, s.cursors, s.snapState()
	noteEpoch(&s.m, snap.Epoch, s.m.RecordTail, s.m.CursorEventTail)
	s.m.CursorEventTail = snap.Boundary
	st := &snapshot{Boundary: snap.Boundary, Cursors: maps.Clone(snap.Cursors)}
	enc := encodeSnapshot(st)
	o := &op{s: s, snap: st, done: make(chan error, 1)}
	o.add(s.snapKey, enc)
	s.cursors = maps.Clone(snap.Cursors)
	if s.cursors == nil {
		s.cursors = map[string]uint64{}
	}
	s.snapBoundary, s.snapBytes, s.evBytes = st.Boundary, len(enc), 0
	o.meta, o.version = s.snapshotMeta()
	o.apply = func() {
		// The events below the boundary are not served from here on,
		// before the tail moves past the ones this copy never held.
		s.dmu.Lock()
		s.dEvHead = max(s.dEvHead, st.Boundary)
		s.dmu.Unlock()
		s.advanceDurableEvents(st.Boundary)
	}
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.cursors = prevCursors
		s.restoreSnapState(prevSnap)
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	return wait(ctx, o)
}

// snapshotDurable runs on the committer once an op's cursor snapshot is
// durable: it becomes the copy's durable snapshot, and the events below its
// boundary may go.
func (s *Stream) snapshotDurable(snap *snapshot) {
	s.dmu.Lock()
	s.dSnap = snap
	s.dmu.Unlock()
	s.db.queueCompaction(s)
}

// compactBatch bounds the events one compaction transaction deletes.
const compactBatch = 1024

// compactCursorEvents deletes the cursor events in [CursorEventsPurged,
// durable snapshot boundary), a batch per transaction together with the
// purge mark, until none is left. It is idempotent and resumes after a stop
// (loadStream calls it). A pending cut is left to finish first: it rewrites
// the snapshot, and compacts after; a sealed copy is left as it is.
func (s *Stream) compactCursorEvents(ctx context.Context) error {
	s.admin.Lock()
	defer s.admin.Unlock()
	for !s.db.holdCompaction.Load() {
		s.mu.Lock()
		closed, cutting, from := s.closed, s.m.Cut != nil, s.m.CursorEventsPurged
		sealed := s.m.SealEpoch != 0
		s.mu.Unlock()
		if closed {
			return s.closedErr()
		}
		if cutting || sealed {
			// A sealed copy has reported the tails its next cut leaves
			// (CursorEventTailAfterCut), which depend on the purge mark:
			// it stays until the seal is released (AdvanceEpoch compacts).
			return nil
		}
		s.dmu.Lock()
		to := s.dSnap.Boundary
		s.dmu.Unlock()
		if from >= to {
			return nil
		}
		var keys [][]byte
		err := s.db.eng.View(func(txn *engine.Txn) error {
			it := txn.NewIterator(engine.IterOptions{Prefix: s.eventPrefix})
			defer it.Close()
			for it.Seek(offsetKey(s.eventPrefix, from)); it.Valid() && len(keys) < compactBatch; it.Next() {
				k := it.Item().KeyCopy(nil)
				if keyOffset(k) >= to {
					break
				}
				keys = append(keys, k)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("storage: compacting cursor events of stream %q: %w", s.name, err)
		}
		upTo := to
		if len(keys) == compactBatch {
			upTo = keyOffset(keys[len(keys)-1]) + 1
		}
		// Readers leave the range before its keys go.
		s.dmu.Lock()
		s.dEvHead = max(s.dEvHead, upTo)
		s.dmu.Unlock()
		err = s.commitOp(ctx, func(m *meta) error {
			if m.Cut != nil {
				return errNoChange // a cut took over; it compacts after
			}
			m.CursorEventsPurged = max(m.CursorEventsPurged, upTo)
			return nil
		}, func(o *op) {
			for _, k := range keys {
				o.del(k)
			}
		})
		if errors.Is(err, errNoChange) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("storage: compacting cursor events of stream %q: %w", s.name, err)
		}
		if hook := s.db.afterCompactBatch; hook != nil {
			if err := hook(); err != nil {
				return err
			}
		}
	}
	return nil
}

// queueCompaction asks the compaction loop to compact s.
func (db *DB) queueCompaction(s *Stream) {
	db.compactMu.Lock()
	db.compactQ[s] = struct{}{}
	db.compactMu.Unlock()
	select {
	case db.compactWake <- struct{}{}:
	default:
	}
}

// compactLoop compacts the streams whose snapshots became durable, off the
// committer (which must not wait on its own writes), until the DB stops.
func (db *DB) compactLoop() {
	defer close(db.compactDone)
	for {
		select {
		case <-db.stop:
			return
		case <-db.compactWake:
		}
		db.compactMu.Lock()
		q := db.compactQ
		db.compactQ = make(map[*Stream]struct{})
		db.compactMu.Unlock()
		for s := range q {
			select {
			case <-db.stop:
				return
			default:
			}
			if err := s.compactCursorEvents(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
				// The events stay until the next snapshot or open
				// compacts them; the cursor state does not depend on it.
				db.log.Warn().Err(err).Str(logging.Stream, s.name).Msg("cursor event compaction failed")
			}
		}
	}
}

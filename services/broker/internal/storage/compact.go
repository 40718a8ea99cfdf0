package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

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
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	return s.durable.dEvHead
}

// CursorSnapshot returns the copy's durable cursor snapshot. An owner ships
// it to a follower whose cursor event tail is below CursorEventHead.
func (s *Stream) CursorSnapshot() CursorSnapshot {
	s.assigned.mu.Lock()
	les := s.assigned.m.LogEpochs // copy-on-write: never changed in place
	s.assigned.mu.Unlock()
	s.durable.dmu.Lock()
	snap := s.durable.dSnap
	s.durable.dmu.Unlock()
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
	s.assigned.mu.Lock()
	if err := s.checkReplicatedLocked(nil, nil); err != nil {
		s.assigned.mu.Unlock()
		return err
	}
	if snap.Boundary <= s.assigned.m.CursorEventTail {
		s.assigned.mu.Unlock()
		return fmt.Errorf("%w: cursor snapshot at %d, at or below cursor event tail %d", ErrOffsetMismatch, snap.Boundary, s.assigned.m.CursorEventTail)
	}
	if snap.Epoch > s.assigned.m.Epoch {
		s.assigned.mu.Unlock()
		return fmt.Errorf("%w: cursor snapshot of epoch %d above copy epoch %d", ErrFenced, snap.Epoch, s.assigned.m.Epoch)
	}
	prev, prevCursors, prevSnap := s.assigned.m, s.assigned.cursors, s.assigned.snapState()
	noteEpoch(&s.assigned.m, snap.Epoch, s.assigned.m.RecordTail, s.assigned.m.CursorEventTail)
	s.assigned.m.CursorEventTail = snap.Boundary
	st := &snapshot{Boundary: snap.Boundary, Cursors: maps.Clone(snap.Cursors)}
	enc := encodeSnapshot(st)
	o := &op{s: s, snap: st, done: make(chan error, 1)}
	o.add(s.snapKey, enc)
	s.assigned.cursors = maps.Clone(snap.Cursors)
	if s.assigned.cursors == nil {
		s.assigned.cursors = map[string]uint64{}
	}
	s.assigned.snapBoundary, s.assigned.snapBytes, s.assigned.evBytes = st.Boundary, len(enc), 0
	o.meta, o.version = s.assigned.snapshotMeta()
	o.apply = func() {
		// The events below the boundary are not served from here on,
		// before the tail moves past the ones this copy never held.
		s.durable.dmu.Lock()
		s.durable.dEvHead = max(s.durable.dEvHead, st.Boundary)
		s.durable.dmu.Unlock()
		s.durable.advanceDurableEvents(st.Boundary)
	}
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.cursors = prevCursors
		s.assigned.restoreSnapState(prevSnap)
		s.assigned.mu.Unlock()
		return err
	}
	s.assigned.mu.Unlock()
	return wait(ctx, o)
}

// snapshotDurable runs on the committer once an op's cursor snapshot is
// durable: it becomes the copy's durable snapshot, and the events below its
// boundary may go.
func (s *Stream) snapshotDurable(snap *snapshot) {
	s.durable.dmu.Lock()
	s.durable.dSnap = snap
	s.durable.dmu.Unlock()
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
		s.assigned.mu.Lock()
		closed, cutting, from := s.assigned.closed, s.assigned.m.Cut != nil, s.assigned.m.CursorEventsPurged
		sealed := s.assigned.m.SealEpoch != 0
		s.assigned.mu.Unlock()
		if closed {
			return s.closedErr()
		}
		if cutting || sealed {
			// A sealed copy has reported the tails its next cut leaves
			// (CursorEventTailAfterCut), which depend on the purge mark:
			// it stays until the seal is released (AdvanceEpoch compacts).
			return nil
		}
		s.durable.dmu.Lock()
		to := s.durable.dSnap.Boundary
		s.durable.dmu.Unlock()
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
		s.durable.dmu.Lock()
		s.durable.dEvHead = max(s.durable.dEvHead, upTo)
		s.durable.dmu.Unlock()
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

// compactQueue is the set of streams waiting for the compaction loop,
// with the lock that guards it (doc.go, "Locks"). A leaf: nothing else is
// locked while mu is held.
type compactQueue struct {
	mu sync.Mutex
	q  map[*Stream]struct{}
}

// add queues s (once, however often it is added before the next take).
func (c *compactQueue) add(s *Stream) {
	c.mu.Lock()
	c.q[s] = struct{}{}
	c.mu.Unlock()
}

// take empties the queue and returns what it held.
func (c *compactQueue) take() map[*Stream]struct{} {
	c.mu.Lock()
	q := c.q
	c.q = make(map[*Stream]struct{})
	c.mu.Unlock()
	return q
}

// queueCompaction asks the compaction loop to compact s.
func (db *DB) queueCompaction(s *Stream) {
	db.compact.add(s)
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
		for s := range db.compact.take() {
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

package storage

import (
	"context"
	"fmt"
	"maps"
)

// CursorEvent is one cursor commit in the cursor event log.
type CursorEvent struct {
	Offset   uint64
	Epoch    uint64
	Cursor   string
	Position uint64
}

// MaxCursorName is the longest cursor name accepted, in bytes.
const MaxCursorName = 256

func validCursorName(name string) error {
	if name == "" || len(name) > MaxCursorName {
		return fmt.Errorf("%w: cursor name of %d bytes (want 1..%d)", ErrInvalidArgument, len(name), MaxCursorName)
	}
	return nil
}

// clamp bounds a cursor position to [head, tail].
func clamp(v, head, tail uint64) uint64 {
	return max(head, min(v, tail))
}

// CommitCursor moves cursor to position as the owner at epoch. The position
// is clamped to [head, record tail]. Cursors only move forward: a position
// at or below the cursor's current one appends nothing and returns an event
// carrying the current position, with Offset the cursor event tail (where
// nothing was written). Otherwise it appends a cursor event and returns it.
//
// The event is not fsynced before return (docs/protocol.md, "Cursors"): it is handed to
// the committer, which makes it durable with the next batch's fsync, and it
// becomes visible to ReadCursorEvents (and so to followers) only then. A
// crash may lose commits that were returned; a reader resuming from an
// older cursor receives records again, which at-least-once allows.
func (s *Stream) CommitCursor(ctx context.Context, epoch uint64, cursor string, position uint64) (CursorEvent, error) {
	if err := validCursorName(cursor); err != nil {
		return CursorEvent{}, err
	}
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	if err := s.checkOwnerLocked(epoch); err != nil {
		return CursorEvent{}, err
	}
	s.durable.dmu.Lock()
	tail := s.durable.dTail
	s.durable.dmu.Unlock()
	position = clamp(position, s.assigned.m.Head, tail)
	cur, ok := s.assigned.cursors[cursor]
	if ok {
		cur = clamp(cur, s.assigned.m.Head, tail)
		if position <= cur {
			return CursorEvent{Offset: s.assigned.m.CursorEventTail, Epoch: epoch, Cursor: cursor, Position: cur}, nil
		}
	}
	prev := s.assigned.m
	ev := CursorEvent{Offset: s.assigned.m.CursorEventTail, Epoch: epoch, Cursor: cursor, Position: position}
	noteEpoch(&s.assigned.m, epoch, s.assigned.m.RecordTail, ev.Offset)
	o := &op{s: s}
	enc := encodeEvent(nil, &ev)
	o.add(offsetKey(s.eventPrefix, ev.Offset), enc)
	s.assigned.m.CursorEventTail++
	s.assigned.cursors[cursor] = position
	prevSnap := s.assigned.snapState()
	s.assigned.evBytes += len(enc)
	s.maybeSnapshotLocked(o)
	o.meta, o.version = s.assigned.snapshotMeta()
	evTail := s.assigned.m.CursorEventTail
	o.apply = func() { s.durable.advanceDurableEvents(evTail) }
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		if ok {
			s.assigned.cursors[cursor] = cur
		} else {
			delete(s.assigned.cursors, cursor)
		}
		s.assigned.restoreSnapState(prevSnap)
		return CursorEvent{}, err
	}
	return ev, nil
}

// Cursor returns the cursor's position, clamped to [head, record tail], and
// whether it exists. The state is the last snapshot plus the events after
// its boundary.
func (s *Stream) Cursor(name string) (uint64, bool) {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	v, ok := s.assigned.cursors[name]
	if !ok {
		return 0, false
	}
	s.durable.dmu.Lock()
	tail := s.durable.dTail
	s.durable.dmu.Unlock()
	return clamp(v, s.assigned.m.Head, tail), true
}

// ReadCursorEvents returns up to max durable cursor events from offset from
// (max of 0 or less: no bound). from must be at most the cursor event tail.
func (s *Stream) ReadCursorEvents(from uint64, max int) ([]CursorEvent, error) {
	s.durable.dmu.Lock()
	head, tail := s.durable.dEvHead, s.durable.dEvTail
	s.durable.dmu.Unlock()
	if from > tail {
		return nil, fmt.Errorf("%w: cursor events from %d past tail %d", ErrOutOfRange, from, tail)
	}
	if from < head {
		// Compacted: the cursor snapshot (CursorSnapshot) stands for them.
		return nil, fmt.Errorf("%w: cursor events from %d below the retained %d", ErrOutOfRange, from, head)
	}
	end := tail
	if max > 0 && uint64(max) < end-from {
		end = from + uint64(max)
	}
	var out []CursorEvent
	err := s.scanEvents(from, end, func(ev CursorEvent) bool {
		out = append(out, ev)
		return true
	})
	if err != nil {
		s.durable.dmu.Lock()
		head = s.durable.dEvHead
		s.durable.dmu.Unlock()
		if from < head {
			// Compaction passed from while we read.
			return nil, fmt.Errorf("%w: cursor events from %d below the retained %d", ErrOutOfRange, from, head)
		}
		return nil, fmt.Errorf("storage: stream %q: reading cursor events: %w", s.name, err)
	}
	return out, nil
}

// Snapshot persists the cursor state at boundary = the cursor event tail,
// and the producer table at the record tail (checkpoint.go), and returns
// once both are durable and the cursor events below the boundary are
// compacted away (compact.go).
//
// ctx bounds the waits for the committer. A call it cancels before the
// snapshot was queued returns ctx.Err() with nothing changed; one
// cancelled after returns ctx.Err() with the snapshot written in order
// (it stands for the same cursor state either way) and the compaction of
// the events below it left to the compactor.
func (s *Stream) Snapshot(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.assigned.mu.Lock()
	if s.assigned.closed {
		s.assigned.mu.Unlock()
		return s.closedErr()
	}
	prev, prevSnap, prevProd := s.assigned.m, s.assigned.snapState(), s.assigned.prodBoundary
	o := &op{s: s, done: make(chan error, 1)}
	s.addSnapshotLocked(o)
	var dropped, taken []producerGen
	if s.assigned.m.Cut == nil { // a pending cut rebuilds and checkpoints the table itself
		dropped, taken = s.addProducerCheckpointLocked(o, s.assigned.producers, s.assigned.m.RecordTail, keepAll, true)
		o.meta, o.version = s.assigned.snapshotMeta()
		o.apply = func() { s.retireProducerGens(dropped) }
	}
	if err := s.enqueueLocked(ctx, o, prev); err != nil {
		s.assigned.restoreSnapState(prevSnap)
		s.assigned.prodBoundary = prevProd
		s.retireProducerGens(taken)
		s.assigned.mu.Unlock()
		return err
	}
	s.assigned.mu.Unlock()
	if err := wait(ctx, o); err != nil {
		return err
	}
	return s.compactCursorEvents(ctx)
}

// When a cursor snapshot is taken. A commit (or a replicated batch) folds
// the cursor state into a new snapshot once the events after the last
// boundary number snapshotEvery or hold snapshotEveryBytes encoded bytes,
// so what each copy retains of its cursor event log, replays on open and
// ships to a follower that is behind is bounded by both. But never before
// those events hold as many bytes as the last snapshot: a stream with many
// cursors then snapshots less often, and writing snapshots costs at most as
// many bytes as the events they replace (the cursor log's writes at most
// double). This is the one place the rule lives; owner and followers apply
// it each to their own log.
const (
	snapshotEvery      = 4096
	snapshotEveryBytes = 256 << 10
)

// snapshotDueLocked reports whether the rule above asks for a snapshot.
func (a *assignedView) snapshotDueLocked() bool {
	n := a.m.CursorEventTail - a.snapBoundary
	if n == 0 || a.evBytes < a.snapBytes {
		return false
	}
	return n >= snapshotEvery || a.evBytes >= snapshotEveryBytes
}

// maybeSnapshotLocked folds the cursor state into a snapshot when the rule
// above says so.
func (s *Stream) maybeSnapshotLocked(o *op) {
	if s.assigned.snapshotDueLocked() {
		s.addSnapshotLocked(o)
	}
}

// addSnapshotLocked adds the snapshot of the assigned cursor state to o.
func (s *Stream) addSnapshotLocked(o *op) {
	snap := &snapshot{Boundary: s.assigned.m.CursorEventTail, Cursors: maps.Clone(s.assigned.cursors)}
	enc := encodeSnapshot(snap)
	o.add(s.snapKey, enc)
	o.snap = snap
	s.assigned.snapBoundary, s.assigned.snapBytes, s.assigned.evBytes = snap.Boundary, len(enc), 0
}

// snapState is what a snapshot changes in the assigned view, for rolling
// back an op that could not be queued.
type snapState struct {
	boundary         uint64
	snapBytes, bytes int
}

func (a *assignedView) snapState() snapState {
	return snapState{boundary: a.snapBoundary, snapBytes: a.snapBytes, bytes: a.evBytes}
}

func (a *assignedView) restoreSnapState(st snapState) {
	a.snapBoundary, a.snapBytes, a.evBytes = st.boundary, st.snapBytes, st.bytes
}

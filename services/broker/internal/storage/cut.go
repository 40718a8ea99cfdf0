package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/strandhq/strand/services/broker/internal/storage/engine"
)

// Cut brings a copy with a longer tail back onto the history of a new epoch
// (docs/protocol.md, "Copies with a longer tail"): it truncates the record log to
// recordTail and the cursor event log to cursorEventTail. The caller computes
// the cut point from the copy's log epochs (SealedLogEpochs when sealed) and
// the recorded history starts; storage only executes it.
//
//   - It never goes below the retained head (recordTail is raised to it) and
//     never touches entries below the given tails; a tail at or past the log
//     end leaves that log alone, so a copy already on the target history is
//     untouched.
//   - The cursor snapshot is replaced by one at boundary cursorEventTail:
//     a snapshot that covered events past the cut keeps its state (its
//     boundary is lowered), one below the cut absorbs the events up to it;
//     either way the new owner's events from the cut on replay over it.
//     A cut below the cursor events the copy retains (compaction deleted
//     them) instead restarts the cursor event log empty at 0, with no
//     cursors, so the copy takes the new owner's state when it next
//     follows (docs/protocol.md, "Copies with a longer tail").
//   - Every cursor above the new record tail is clamped down to it, and the
//     clamp is written into the snapshot, so a returning reader resumes at
//     the cut (receiving records again), never past records it has not seen.
//   - Log epochs that start past the cut are removed (SealedLogEpochs too);
//     the confirm watermark is lowered to the new record tail.
//
// Crash safety: the intent (both tails, the chain at the new record tail,
// the bytes left) is written durably into the metadata first; then the
// record log is cut, then the cursor event log, then one transaction writes
// the snapshot and the final metadata and clears the intent. A crash at any
// point leaves the intent, and the next open completes the same cut; deletes
// are idempotent and nothing below the tails is read back from the cut part,
// so repeating a cut gives the same result. While the intent is set, appends,
// cursor commits, epoch changes and retention are refused.
//
// ctx bounds the wait for the committer to take and write the intent. A
// call it cancels before the intent was queued returns ctx.Err() with the
// copy unchanged. One cancelled while the intent was queued returns
// ctx.Err() with the cut pending, as a crash leaves it; the next Cut,
// AdvanceEpoch, ResetTo or Open finishes it before anything else. Once
// the intent is durable the cut runs to the end whatever ctx says: it is
// bounded local work, and stopping half way would only leave the copy
// refusing writes until someone finishes it.
func (s *Stream) Cut(ctx context.Context, recordTail, cursorEventTail uint64) error {
	s.admin.Lock()
	defer s.admin.Unlock()
	return s.cutLocked(ctx, recordTail, cursorEventTail)
}

func (s *Stream) cutLocked(ctx context.Context, recordTail, cursorEventTail uint64) error {
	s.assigned.mu.Lock()
	if s.assigned.closed {
		s.assigned.mu.Unlock()
		return s.closedErr()
	}
	pending := s.assigned.m.Cut
	head, rt, et, bytes := s.assigned.m.Head, s.assigned.m.RecordTail, s.assigned.m.CursorEventTail, s.assigned.m.Bytes
	purged := s.assigned.m.CursorEventsPurged
	s.assigned.mu.Unlock()
	if pending != nil {
		// An earlier call stopped part way (its context ended while the
		// intent was queued, a test failpoint or a write error); finish
		// it before anything else.
		if err := s.finishCutLocked(ctx); err != nil {
			return err
		}
		return s.cutLocked(ctx, recordTail, cursorEventTail)
	}

	newRT := min(max(recordTail, head), rt)
	newET := min(cursorEventTail, et)
	if newRT == rt && newET == et {
		return nil
	}
	chain, cutBytes, err := s.cutPoint(head, newRT, rt)
	if err != nil {
		return err
	}
	// Below the retained cursor events the cursor state at the cut is not
	// known here: compaction deleted events of the shared history, and the
	// snapshot standing for them also folded events past the cut. Rather
	// than keep that state, the cursor event log restarts empty at 0 and
	// the copy takes the new owner's (its snapshot, or every event, on its
	// next follow). Compaction runs under admin, so purged is current.
	reset := newET < purged
	newET = cursorEventTailAfterCut(newET, purged)
	intent := &cutIntent{RecordTail: newRT, CursorEventTail: newET, Chain: chain, Bytes: bytes - min(bytes, cutBytes), ResetCursors: reset}
	err = s.commitMeta(ctx, func(m *meta) error {
		if m.RecordTail != rt || m.CursorEventTail != et || m.Head != head || m.Cut != nil {
			return fmt.Errorf("%w: stream %q changed while preparing a cut", ErrFenced, s.name)
		}
		m.Cut = intent
		return nil
	})
	if err != nil {
		return err
	}
	return s.finishCut(context.WithoutCancel(ctx))
}

// finishPendingCut finishes a cut a cancelled Cut left pending (see Cut).
func (s *Stream) finishPendingCut(ctx context.Context) error {
	s.assigned.mu.Lock()
	pending := s.assigned.m.Cut != nil
	s.assigned.mu.Unlock()
	if !pending {
		return nil
	}
	s.admin.Lock()
	defer s.admin.Unlock()
	return s.finishCutLocked(ctx)
}

// finishCutLocked finishes a pending cut, under admin.
func (s *Stream) finishCutLocked(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.finishCut(context.WithoutCancel(ctx))
}

// cursorEventTailAfterCut is the cursor event tail a cut to et leaves on a
// copy whose cursor events below purged are compacted: et, or 0 when et is
// below them (the cursor event log restarts empty; see Cut).
func cursorEventTailAfterCut(et, purged uint64) uint64 {
	if et < purged {
		return 0
	}
	return et
}

// CursorEventTailAfterCut returns the cursor event tail a Cut to
// cursorEventTail would leave on this copy. A sealed copy reports it in its
// seal answer, so the start recorded for it is what it holds after the cut
// its next role change makes; compaction is held while a copy is sealed
// (compact.go), so the answer stays true until that cut.
func (s *Stream) CursorEventTailAfterCut(cursorEventTail uint64) uint64 {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	return cursorEventTailAfterCut(min(cursorEventTail, s.assigned.m.CursorEventTail), s.assigned.m.CursorEventsPurged)
}

// cutPoint returns the chain at newRT and the encoded bytes of [newRT, rt).
func (s *Stream) cutPoint(head, newRT, rt uint64) (chain, bytes uint64, err error) {
	err = s.db.eng.View(func(txn *engine.Txn) error {
		if newRT == head {
			s.assigned.mu.Lock()
			chain = s.assigned.m.HeadChain
			s.assigned.mu.Unlock()
		} else if err := s.scanRecords(txn, newRT-1, newRT, false, ErrCorrupt, func(rec Record, _ int) bool {
			chain = rec.Chain
			return true
		}); err != nil {
			return err
		}
		return s.scanRecords(txn, newRT, rt, false, ErrCorrupt, func(_ Record, size int) bool {
			bytes += uint64(size)
			return true
		})
	})
	if err != nil {
		return 0, 0, fmt.Errorf("storage: preparing cut of stream %q: %w", s.name, err)
	}
	return chain, bytes, nil
}

// finishCut executes the pending cut intent (see Cut).
func (s *Stream) finishCut(ctx context.Context) error {
	s.assigned.mu.Lock()
	c := s.assigned.m.Cut
	s.assigned.mu.Unlock()
	if c == nil {
		return nil
	}
	if err := s.truncateRecords(ctx, c.RecordTail); err != nil {
		return fmt.Errorf("storage: cutting record log of stream %q: %w", s.name, err)
	}
	if hook := s.db.afterRecordCut; hook != nil {
		if err := hook(); err != nil {
			return err
		}
	}
	if err := s.db.deleteRange(ctx, s.eventPrefix, c.CursorEventTail, maxOffset); err != nil {
		return fmt.Errorf("storage: cutting cursor event log of stream %q: %w", s.name, err)
	}

	// The cursor state at the cut: the stored snapshot (as the last
	// transaction before the intent left it) plus the events below the cut
	// after its boundary, clamped to the new record tail. That never needs
	// a compacted event: compaction deletes only below a durable
	// snapshot's boundary, and the events read here are at or above the
	// boundary. A cut below the retained events starts empty instead
	// (ResetCursors, see Cut).
	snap, err := s.readSnapshot()
	if err != nil {
		return err
	}
	if c.ResetCursors {
		snap = snapshot{}
	}
	cursors := make(map[string]uint64, len(snap.Cursors))
	for k, v := range snap.Cursors {
		cursors[k] = v
	}
	if snap.Boundary < c.CursorEventTail {
		err := s.scanEvents(snap.Boundary, c.CursorEventTail, func(ev CursorEvent) bool {
			cursors[ev.Cursor] = ev.Position
			return true
		})
		if err != nil {
			return fmt.Errorf("storage: cut of stream %q: %w", s.name, err)
		}
	}
	for k, v := range cursors {
		cursors[k] = min(v, c.RecordTail)
	}
	newSnap := snapshot{Boundary: c.CursorEventTail, Cursors: cursors}

	// The producer table at the cut: records cut away leave it (doc.go,
	// "Idempotent publish"). Appends are refused while the intent is set,
	// so the table and checkpoints read here stay as they are.
	s.assigned.mu.Lock()
	gens, head := s.assigned.m.ProducerTables, s.assigned.m.Head
	s.assigned.mu.Unlock()
	producers, _, err := s.rebuildProducers(gens, head, c.RecordTail)
	if err != nil {
		return fmt.Errorf("storage: cut of stream %q: %w", s.name, err)
	}

	return s.commitOp(ctx, func(m *meta) error {
		m.RecordTail, m.Chain = c.RecordTail, c.Chain
		m.CursorEventTail = c.CursorEventTail
		m.CursorEventsPurged = min(m.CursorEventsPurged, c.CursorEventTail)
		m.Bytes = c.Bytes
		m.LogEpochs = cutLogEpochs(m.LogEpochs, c.RecordTail, c.CursorEventTail)
		m.SealedLogEpochs = cutLogEpochs(m.SealedLogEpochs, c.RecordTail, c.CursorEventTail)
		m.Cut = nil
		return nil
	}, func(o *op) {
		enc := encodeSnapshot(&newSnap)
		o.add(s.snapKey, enc)
		o.snap = &snapshot{Boundary: newSnap.Boundary, Cursors: maps.Clone(cursors)}
		s.assigned.cursors = cursors
		s.assigned.snapBoundary, s.assigned.snapBytes, s.assigned.evBytes = newSnap.Boundary, len(enc), 0
		// Checkpoints past the cut cover cut-away records: retired.
		dropped, _ := s.addProducerCheckpointLocked(o, producers, c.RecordTail, func(g producerGen) bool {
			return g.Boundary <= c.RecordTail
		}, false)
		s.assigned.producers = producers
		o.apply = func() {
			s.durable.dmu.Lock()
			wm := s.durable.watermark
			s.durable.dmu.Unlock()
			s.durable.setDurable(c.RecordTail, c.Chain, c.CursorEventTail, min(wm, c.RecordTail))
			s.retireProducerGens(dropped)
		}
	})
}

// cutLogEpochs drops the log epochs that start past the cut in both logs and
// clamps the others' starts to it; an epoch whose clamped range still holds
// entries in either log stays.
func cutLogEpochs(les []LogEpoch, rt, et uint64) []LogEpoch {
	if les == nil {
		return nil
	}
	out := make([]LogEpoch, 0, len(les))
	for _, e := range les {
		if e.RecordStart <= rt && e.CursorEventStart <= et {
			out = append(out, e)
			continue
		}
		if e.RecordStart < rt || e.CursorEventStart < et {
			e.RecordStart, e.CursorEventStart = min(e.RecordStart, rt), min(e.CursorEventStart, et)
			out = append(out, e)
		}
	}
	return out
}

func (s *Stream) readSnapshot() (snapshot, error) {
	var snap snapshot
	err := s.db.eng.View(func(txn *engine.Txn) error {
		item, err := txn.Get(s.snapKey)
		if errors.Is(err, engine.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) (err error) {
			snap, err = decodeSnapshot(v)
			return err
		})
	})
	if err != nil {
		return snapshot{}, fmt.Errorf("storage: stream %q: reading cursor snapshot: %w", s.name, err)
	}
	return snap, nil
}

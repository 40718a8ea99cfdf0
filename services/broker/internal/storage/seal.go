package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// FenceBelow starts a role change to epoch: from now on the copy refuses
// owner writes (Append, CommitCursor) at epochs below epoch, and replicated
// batches until AdvanceEpoch reaches it. A broker fences before it cuts the
// copy onto the history of epoch and advances it (docs/protocol.md, "Copies with a
// longer tail"): a publish or a follow batch of the old role that was
// already past the role check must not land between the cut and the
// advance, where the advance would count it as the new epoch's history and
// no later cut would remove it. Only ever raised; in memory only, since a
// restarted broker takes its roles from the assignment again.
func (s *Stream) FenceBelow(epoch uint64) {
	s.assigned.mu.Lock()
	defer s.assigned.mu.Unlock()
	s.assigned.roleFence = max(s.assigned.roleFence, epoch)
}

// AdvanceEpoch is the role change at epoch (owner promotion or following a
// new owner). Below the copy's epoch it is ErrFenced; at the copy's epoch on
// an unsealed copy it is a no-op. Otherwise it appends LogEpoch{epoch,
// record tail, cursor event tail} (replacing a last entry that starts at the
// same tails and so holds no entries), sets the epoch and releases any seal
// in place: SealEpoch, SealTransition and SealedLogEpochs are cleared, since
// the cut that needed them ran before this role change (docs/protocol.md, "Copies with a
// longer tail"). A cut an earlier Cut call left pending (its caller's
// context ended while the cut intent was queued) is finished first, as
// Cut and Open finish one: it was begun for this copy's history.
//
// ctx bounds the waits for the committer. A call it cancels returns
// ctx.Err() and leaves the copy unchanged if it ended before the change was
// queued; otherwise the change is applied at once in memory and becomes
// durable in order with everything after it, as a retry would find it (a
// retry at the same epoch is a no-op).
func (s *Stream) AdvanceEpoch(ctx context.Context, epoch uint64) error {
	if err := s.finishPendingCut(ctx); err != nil {
		return err
	}
	err := s.commitMeta(ctx, func(m *meta) error {
		if epoch < m.Epoch {
			return fmt.Errorf("%w: advance to epoch %d below copy epoch %d", ErrFenced, epoch, m.Epoch)
		}
		if m.Cut != nil {
			return fmt.Errorf("%w: stream %q: cut in progress", ErrFenced, s.name)
		}
		if epoch == m.Epoch && m.SealEpoch == 0 {
			return errNoChange
		}
		m.LogEpochs = addLogEpoch(m.LogEpochs, LogEpoch{Epoch: epoch, RecordStart: m.RecordTail, CursorEventStart: m.CursorEventTail})
		m.Epoch = epoch
		m.SealEpoch, m.SealTransition, m.SealedLogEpochs = 0, "", nil
		if epoch > m.UnsureEpoch {
			// The copy's log is the new epoch's from here (State.UnsureEpoch).
			m.UnsureEpoch = 0
		}
		return nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	if err == nil || ctx.Err() != nil {
		// Also when ctx ended: the change may be queued, and a waiter
		// woken for nothing only looks again.
		s.durable.wakeAll()
		// Compaction held while sealed (compact.go) may go on.
		s.db.queueCompaction(s)
	}
	return err
}

// errNoChange aborts a commitMeta that has nothing to write.
var errNoChange = fmt.Errorf("storage: no change")

// Seal fences the copy at fenceEpoch for transition and returns its state
// once every entry accepted before the seal is durable. It costs O(1): it
// reports tails and the chain at the tail, reading nothing from the log.
//
//   - fenceEpoch below the copy's epoch: ErrFenced (a stale fence).
//   - sealed at fenceEpoch by the same transition: idempotent (nothing
//     changes; it still waits for earlier entries to be durable).
//   - sealed at fenceEpoch by another transition: the newer one takes over.
//   - otherwise: SealEpoch = Epoch = fenceEpoch. The first seal keeps the
//     log epochs it replaces in SealedLogEpochs and adds LogEpoch{fenceEpoch,
//     tails}, since the seal advances the epochs without data; a later,
//     higher fence keeps SealedLogEpochs.
//
// While sealed, Append and CommitCursor return ErrSealed (and ErrFenced for
// an epoch below the fence) and AppendReplicated returns ErrFenced, until
// AdvanceEpoch at or above the fence releases the seal.
//
// ctx bounds the wait for the committer; a recoverer's seal call carries
// its --seal-timeout. A call it cancels returns ctx.Err() and leaves the
// copy unchanged if it ended before the seal was queued; otherwise the
// seal is in place at once and becomes durable in order, exactly as the
// recoverer's retry with the same transition finds it (idempotent).
func (s *Stream) Seal(ctx context.Context, fenceEpoch uint64, transition string) (State, error) {
	err := s.commitMeta(ctx, func(m *meta) error {
		if fenceEpoch < m.Epoch {
			return fmt.Errorf("%w: seal at epoch %d below copy epoch %d", ErrFenced, fenceEpoch, m.Epoch)
		}
		if fenceEpoch == m.Epoch && m.SealEpoch == 0 && m.Epoch != 0 {
			// The copy already applied an assignment at this epoch, which
			// the recovery that fenced at it committed: the seal is stale
			// (a late retry) and must not stop a serving copy.
			return fmt.Errorf("%w: seal at epoch %d, which the copy already serves", ErrFenced, fenceEpoch)
		}
		if m.SealEpoch != 0 && m.SealEpoch == fenceEpoch {
			if m.SealTransition == transition {
				return nil // rewrite nothing new; still a barrier for the tails
			}
			m.SealTransition = transition
			return nil
		}
		if m.SealEpoch == 0 {
			m.SealedLogEpochs = slices.Clone(m.LogEpochs)
		}
		m.LogEpochs = addLogEpoch(m.LogEpochs, LogEpoch{Epoch: fenceEpoch, RecordStart: m.RecordTail, CursorEventStart: m.CursorEventTail})
		m.Epoch, m.SealEpoch, m.SealTransition = fenceEpoch, fenceEpoch, transition
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			s.durable.wakeAll() // the seal may be queued; waiters look again
		}
		return State{}, err
	}
	s.durable.wakeAll()
	return s.State(), nil
}

// ClearUnsure forgets the copy's unsure epoch (State.UnsureEpoch): the
// broker decided the copy may go on at its epoch (a single copy, which no
// follower can be ahead of). ctx bounds the wait for the committer (see
// Seal for what a cancelled call leaves).
func (s *Stream) ClearUnsure(ctx context.Context) error {
	err := s.commitMeta(ctx, func(m *meta) error {
		if m.UnsureEpoch == 0 {
			return errNoChange
		}
		m.UnsureEpoch = 0
		return nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}

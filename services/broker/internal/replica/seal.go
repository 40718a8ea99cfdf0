package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Seal fences this broker's copy at fenceEpoch and reports its tails (docs/protocol.md,
// "Stream failover"). Fencing happens first, in storage, so the tail cannot
// grow from the old owner while the recoverer decides; then the copy's role
// ends. Seals are idempotent; a newer transition at the same fence epoch
// takes over an existing seal. Its cost does not grow with the log: the
// chain value at the tail replaces a whole-log digest.
func (m *Manager) Seal(ctx context.Context, stream string, fenceEpoch uint64, transition, incarnation string) (storage.State, error) {
	select {
	case m.seals <- struct{}{}:
		defer func() { <-m.seals }()
	case <-ctx.Done():
		return storage.State{}, ctx.Err()
	}
	// select may take the slot even when ctx ended at the same time; a
	// late seal must not run after its recoverer gave up on it.
	if err := ctx.Err(); err != nil {
		return storage.State{}, err
	}
	// A recovery seals the incarnation it was recorded for. A seal that
	// arrives after the stream was deleted and created again under its
	// name (a slow broker, a recoverer that gave up late) would fence the
	// new stream's copy at an epoch its assignments have not reached, and
	// it would wait there for a recovery that never comes.
	m.mu.RLock()
	a, known := m.assignments[stream]
	current := m.assignmentsCurrent
	m.mu.RUnlock()
	if incarnation != "" && known && a.Incarnation != "" && a.Incarnation != incarnation {
		return storage.State{}, fmt.Errorf("%w: seal of incarnation %q, assignment of %q", ErrOtherIncarnation, incarnation, a.Incarnation)
	}
	c := m.copy(stream)
	if c != nil && incarnation != "" {
		if inc := c.st.State().Incarnation; inc != "" && inc != incarnation {
			return storage.State{}, fmt.Errorf("%w: seal of incarnation %q, copy of %q", ErrOtherIncarnation, incarnation, inc)
		}
	}
	if c == nil {
		if !known && !current {
			// An assignment not seen yet may name this broker.
			return storage.State{}, m.unknown(ctx, stream, current)
		}
		if !known || !a.Includes(m.cfg.Node) {
			// The stream may well exist: this broker holds no copy of it.
			return storage.State{}, fmt.Errorf("%w: %q", ErrNoCopy, stream)
		}
		var err error
		if c, err = m.openCopy(stream); err != nil {
			return storage.State{}, err
		}
	}
	// Held until the seal is reported, so an orphan check does not
	// delete the copy between its seal and its report (dropIfOrphan).
	c.dropMu.Lock()
	defer c.dropMu.Unlock()
	if c.dropped {
		return storage.State{}, errDropped
	}
	s, err := c.st.Seal(ctx, fenceEpoch, transition)
	if err != nil {
		if errors.Is(err, storage.ErrFenced) {
			return storage.State{}, fmt.Errorf("%w: %v", ErrStaleFence, err)
		}
		return storage.State{}, err
	}
	c.endRole(cluster.RoleSealed)
	if s, err = c.effectiveTails(ctx, s, fenceEpoch); err != nil {
		return storage.State{}, err
	}
	m.log.Info().Str(logging.Stream, stream).Uint64(logging.FenceEpoch, fenceEpoch).Str(logging.Transition, transition).
		Uint64(logging.RecordTail, s.RecordTail).Uint64(logging.CursorEventTail, s.CursorEventTail).Msg("copy sealed")
	return s, nil
}

// effectiveTails caps a sealed copy's reported tails at the cut its next
// role change will make. A copy whose broker did not apply its last role
// change before being sealed holds an older owner's unconfirmed suffix past
// a history start (docs/limits.md); reporting the raw tail could win
// it the pick and record a start its own cut then undercuts, losing records
// confirmed at the epoch it missed. Nothing is cut here: a seal only fences
// and reports.
func (c *Copy) effectiveTails(ctx context.Context, s storage.State, fenceEpoch uint64) (storage.State, error) {
	own := s.SealedLogEpochs
	if len(own) == 0 {
		own = s.LogEpochs
	}
	if len(own) == 0 || own[len(own)-1].Epoch+1 >= fenceEpoch {
		return s, nil // on the latest history: no start can lie after its own epoch
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	history, err := c.m.cfg.History(hctx, c.name, 0)
	if err != nil {
		return storage.State{}, fmt.Errorf("%w: history starts unreadable: %v", ErrUnavailable, err)
	}
	cut, ok, err := cutPoint(c.m.cfg.Node, own, s.RecordTail, s.CursorEventTail, history, fenceEpoch)
	if err != nil {
		return storage.State{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if !ok {
		return s, nil
	}
	s.RecordTail = max(min(s.RecordTail, cut.RecordTail), s.Head)
	// Below its compacted cursor events the cut restarts the cursor log
	// empty (storage, Cut): report what the copy will hold.
	s.CursorEventTail = c.st.CursorEventTailAfterCut(min(s.CursorEventTail, cut.CursorEventTail))
	if chain, err := c.st.ChainAt(s.RecordTail); err == nil {
		s.Chain = chain
	}
	c.m.log.Warn().Str(logging.Stream, c.name).Uint64(logging.FenceEpoch, fenceEpoch).Uint64(logging.RecordTail, s.RecordTail).
		Uint64("start_epoch", cut.Epoch).Str("start_node", cut.Node).
		Msg("sealed copy missed a role change; reporting its tails as of the history start it will be cut to")
	return s, nil
}

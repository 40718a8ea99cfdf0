package replica

import (
	"context"
	"errors"
	"fmt"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Seal fences this broker's copy at fenceEpoch and reports its tails (seed,
// "Stream failover"). Fencing happens first, in storage, so the tail cannot
// grow from the old owner while the recoverer decides; then the copy's role
// ends. Seals are idempotent; a newer transition at the same fence epoch
// takes over an existing seal. Its cost does not grow with the log: the
// chain value at the tail replaces a whole-log digest.
func (m *Manager) Seal(ctx context.Context, stream string, fenceEpoch uint64, transition string) (storage.State, error) {
	select {
	case m.seals <- struct{}{}:
		defer func() { <-m.seals }()
	case <-ctx.Done():
		return storage.State{}, ctx.Err()
	}
	c := m.copy(stream)
	if c == nil {
		m.mu.RLock()
		a, known := m.assignments[stream]
		m.mu.RUnlock()
		if !known || !a.Includes(m.cfg.Node) {
			return storage.State{}, fmt.Errorf("%w: no copy of %q on this broker", ErrUnknownStream, stream)
		}
		var err error
		if c, err = m.openCopy(stream); err != nil {
			return storage.State{}, err
		}
	}
	s, err := c.st.Seal(fenceEpoch, transition)
	if err != nil {
		if errors.Is(err, storage.ErrFenced) {
			return storage.State{}, fmt.Errorf("%w: %v", ErrStaleFence, err)
		}
		return storage.State{}, err
	}
	c.endRole(cluster.RoleSealed)
	m.log.Info().Str(logging.Stream, stream).Uint64(logging.FenceEpoch, fenceEpoch).Str(logging.Transition, transition).
		Uint64(logging.RecordTail, s.RecordTail).Uint64(logging.CursorEventTail, s.CursorEventTail).Msg("copy sealed")
	return s, nil
}

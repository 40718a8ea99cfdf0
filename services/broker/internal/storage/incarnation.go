package storage

import (
	"context"
	"errors"
	"fmt"
)

// SetIncarnation records which incarnation of the stream name this copy
// belongs to, durably. A copy already bound to another incarnation is not
// changed: ErrIncarnation tells the caller to drop it, since its records
// belong to a deleted stream of the same name.
//
// ctx bounds the wait for the committer (see Seal for what a cancelled
// call leaves).
func (s *Stream) SetIncarnation(ctx context.Context, incarnation string) error {
	err := s.commitMeta(ctx, func(m *meta) error {
		switch m.Incarnation {
		case incarnation:
			return errNoChange
		case "":
			m.Incarnation = incarnation
			return nil
		}
		return fmt.Errorf("%w: copy of %q belongs to incarnation %q, not %q", ErrIncarnation, s.name, m.Incarnation, incarnation)
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}

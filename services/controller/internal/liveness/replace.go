package liveness

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// MissingSince says since when the controller has seen a member of a
// stream's assignment (one incarnation of its name) missing, its broker not
// live; zero when it has not. The app wires it to attention.Memory, the one
// place the controller remembers between snapshots.
type MissingSince func(stream, incarnation, node string) time.Time

// plans returns the replacement plans of a's missing members at now.
func (l *loop) plans(s *state.Snapshot, a cluster.Assignment, now time.Time) []transition.Replacement {
	var since func(string) time.Time
	if l.cfg.MissingSince != nil {
		since = func(node string) time.Time { return l.cfg.MissingSince(a.Stream, a.Incarnation, node) }
	}
	return transition.PlanReplacements(s, a, since, l.cfg.ReplaceAfter, now)
}

// decideReplacement decides what to replace of a's missing members now,
// with replacements placement picks that pass the probe (a killed broker
// stays registered until its lease ends). It returns the plans it judged
// too, for the reason.
func (l *loop) decideReplacement(ctx context.Context, s *state.Snapshot, a cluster.Assignment, shrink bool) ([]transition.Replacement, transition.ReplaceDecision) {
	now := l.cfg.Now()
	plans := l.plans(s, a, now)
	due := 0
	for _, p := range plans {
		if p.Due(now) {
			due++
		}
	}
	if due == 0 {
		return plans, transition.ReplaceDecision{Next: a}
	}
	var down, cands []string
	for range maxPlacementRounds {
		cands = transition.ReplacementCandidates(s, l.placementLoad(s), a, due, down)
		failed := l.probePicks(ctx, s, cands)
		if len(failed) == 0 {
			break
		}
		down = append(down, slices.Collect(maps.Keys(failed))...)
		cands = nil
	}
	return plans, transition.DecideReplacement(a, plans, cands, now, shrink)
}

// withDueReplacements makes a lost-owner recovery rec of a also replace
// the members due for replacement now: with the stream unable to confirm
// with its live members (local_durable loses any copy, a two-copy
// majority its owner) the replacement is not worth a second seal, and
// without a replacement such a member is left out, as the lost owner's
// recovery always left out copies that did not answer.
func (l *loop) withDueReplacements(ctx context.Context, s *state.Snapshot, a cluster.Assignment, rec cluster.Recovery) cluster.Recovery {
	plans, d := l.decideReplacement(ctx, s, a, true)
	if len(d.Remove) == 0 {
		return rec
	}
	rec = transition.WithReplacement(rec, a, d)
	rec.Reason += "; " + transition.ReplaceReason(plans, d, l.replaceAfter())
	return rec
}

func (l *loop) replaceAfter() time.Duration {
	if l.cfg.ReplaceAfter <= 0 {
		return transition.DefaultReplaceAfter
	}
	return l.cfg.ReplaceAfter
}

// replace replaces the members of stream missing past --replace-after, or
// at once when the stream cannot confirm with its live members
// (docs/protocol.md, "Replacing a missing copy"). It runs only while the
// owner is live and no recovery is pending (an owner loss is handled by
// its own recovery first). A change the removal rule allows commits on the
// fast path (cluster.IsFastPath); any other goes through a pending
// recovery whose proposed owner is the current owner. It reports whether
// it wrote.
func (l *loop) replace(ctx context.Context, s *state.Snapshot, stream string) bool {
	av, ok := s.Assignments[stream]
	if !ok {
		return false
	}
	if _, pending := s.Recoveries[stream]; pending {
		return false
	}
	a := av.Value
	if !s.Live(a.Owner) {
		return false
	}
	plans, d := l.decideReplacement(ctx, s, a, false)
	if len(d.Remove) == 0 {
		return false
	}
	reason := transition.ReplaceReason(plans, d, l.replaceAfter())
	if d.FastPath {
		if err := l.commit.FastPath(ctx, av, d.Next); err != nil {
			l.logWriteError(err, stream, "liveness: missing member not replaced; trying again at the next pass")
			return false
		}
		l.wrote, l.awaitView = true, true
		l.cfg.Log.Info().Str(logging.Stream, stream).Uint64(logging.Epoch, a.Epoch).Strs("removed", d.Remove).Strs("added", d.Add).
			Str(logging.Reason, reason).Msg("missing members replaced on the fast path")
		return true
	}
	rec, err := transition.ProposeReplacement(s, stream, d, reason)
	if err != nil {
		l.cfg.Log.Warn().Err(err).Str(logging.Stream, stream).Msg("liveness: cannot propose a replacement; retrying at the next change")
		return false
	}
	if fence, _ := SealedPast(s, a); fence > rec.FenceEpoch {
		rec.FenceEpoch = fence
	}
	rec = transition.Stamp(rec, l.cfg.Now())
	if err := l.commit.WriteRecovery(ctx, av.ModRev, rec); err != nil {
		l.logWriteError(err, stream, "liveness: replacement not recorded; trying again at the next pass")
		return false
	}
	l.wrote, l.awaitView = true, true
	l.cfg.Log.Info().Str(logging.Stream, stream).Uint64(logging.FenceEpoch, rec.FenceEpoch).Str(logging.Transition, rec.TransitionID).
		Strs("removed_members", rec.RemovedMembers).Strs("added_members", rec.AddedMembers).Str(logging.Reason, rec.Reason).
		Msg("missing members replaced through a pending recovery")
	return true
}

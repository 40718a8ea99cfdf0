package rebalance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

var (
	// ErrNotFollower refuses a handover to a node that holds no follower
	// copy of the stream's assignment.
	ErrNotFollower = errors.New("rebalance: the target is not a follower of the stream")
	// ErrAlreadyOwner refuses a handover to the stream's owner.
	ErrAlreadyOwner = errors.New("rebalance: the target already owns the stream")
	// ErrNotInSync refuses a handover to a follower that is not in sync
	// (down, draining, lagging, or not at the assignment's epoch).
	ErrNotInSync = errors.New("rebalance: the target is not an in-sync follower")
	// ErrOwnerDown refuses a handover of a stream whose owner is not
	// live: that is a failover, not a handover.
	ErrOwnerDown = errors.New("rebalance: the owner is not live")
	// ErrCatchUp: the target did not acknowledge the owner's tails within
	// the catch-up bound; the handover was abandoned and the owner resumed.
	ErrCatchUp = errors.New("rebalance: the target did not catch up")
	// ErrNoBroker: a drain of a node no broker key or assignment names.
	ErrNoBroker = errors.New("rebalance: no such broker")
	// ErrLastBroker refuses a drain that would leave a stream's copy
	// nowhere to go: no other live, non-draining broker could take it.
	ErrLastBroker = errors.New("rebalance: no other broker can take the copy")
)

// Reasons of the recoveries written here.
const (
	ReasonHandover = "handover"
	ReasonDrain    = "drain"
)

// CheckHandover decides whether stream may be handed over to target now:
// the stream has an assignment and no pending recovery, at least two
// copies, a live owner other than target, and target is an in-sync
// follower on a live, non-draining broker (attention's in-sync rule). It
// returns the assignment the handover moves from.
func CheckHandover(s *state.Snapshot, stream, target string) (state.Versioned[cluster.Assignment], error) {
	av, ok := s.Assignments[stream]
	if !ok {
		return av, fmt.Errorf("%w: %q", transition.ErrNoStream, stream)
	}
	a := av.Value
	if _, pending := s.Recoveries[stream]; pending {
		return av, fmt.Errorf("%w: stream %q", transition.ErrPending, stream)
	}
	if a.Copies() < 2 {
		return av, fmt.Errorf("%w: stream %q has no follower to hand over to", transition.ErrSingleCopy, stream)
	}
	if a.Owner == target {
		return av, fmt.Errorf("%w: %q owns %q at epoch %d", ErrAlreadyOwner, target, stream, a.Epoch)
	}
	if !slices.Contains(a.Followers, target) {
		return av, fmt.Errorf("%w: %q is not a follower of %q at epoch %d (followers %v)", ErrNotFollower, target, stream, a.Epoch, a.Followers)
	}
	if !s.Live(a.Owner) {
		return av, fmt.Errorf("%w: owner %q of %q", ErrOwnerDown, a.Owner, stream)
	}
	if !slices.Contains(Targets(s, stream), target) {
		r, _ := attention.JudgeReplication(s, stream, nil)
		st := "unknown"
		for _, c := range r.Members {
			if c.Node == target {
				st = c.State
				if s.IsDraining(target) {
					st += ", draining"
				}
			}
		}
		return av, fmt.Errorf("%w: %q of %q is %s", ErrNotInSync, target, stream, st)
	}
	return av, nil
}

// HandoverFunc sends a HandoverRequest to the broker at addr.
type HandoverFunc func(ctx context.Context, addr string, req *strandv1.HandoverRequest) (*strandv1.HandoverResponse, error)

// Mover makes handovers and replacements on a leader's term.
type Mover struct {
	Schema cluster.Schema
	Call   HandoverFunc
	// CatchUp bounds the target's catch-up (default 2 s).
	CatchUp time.Duration
	Log     zerolog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

func (m *Mover) now() time.Time {
	if m.Now == nil {
		return time.Now()
	}
	return m.Now()
}

// Handover moves stream to target (docs/protocol.md, "Handover"): the
// owner pauses and waits for target to acknowledge its tails, then the
// controller records a pending recovery proposing target (reason
// handover); the recoverer seals every copy and promotes the furthest,
// preferring target among those tied. A target that does not catch up
// within the bound leaves everything as it was (ErrCatchUp, naming its
// lag). catchUp of 0 is the Mover's.
func (m *Mover) Handover(ctx context.Context, term *leader.Term, s *state.Snapshot, stream, target string, catchUp time.Duration) (cluster.Recovery, error) {
	av, err := CheckHandover(s, stream, target)
	if err != nil {
		return cluster.Recovery{}, err
	}
	a := av.Value
	if catchUp <= 0 {
		catchUp = m.CatchUp
	}
	if catchUp <= 0 {
		catchUp = 2 * time.Second
	}
	addr := s.Brokers[a.Owner].Address
	resp, err := m.Call(ctx, addr, &strandv1.HandoverRequest{Stream: stream, Epoch: a.Epoch, Target: target,
		CatchUpMs: uint32(catchUp / time.Millisecond)})
	if err != nil {
		return cluster.Recovery{}, fmt.Errorf("%w: handover of %q: owner %s: %v", transition.ErrConflict, stream, a.Owner, err)
	}
	if !resp.GetCaughtUp() {
		return cluster.Recovery{}, fmt.Errorf("%w: %q is %d records and %d cursor events behind owner %q of %q after %v; the owner resumed",
			ErrCatchUp, target, resp.GetRecordTail()-min(resp.GetRecordTail(), resp.GetTargetRecordTail()),
			resp.GetCursorEventTail()-min(resp.GetCursorEventTail(), resp.GetTargetCursorEventTail()), a.Owner, stream, catchUp)
	}
	rec, err := transition.ProposeRecovery(s, stream, nil, ReasonHandover)
	if err == nil {
		rec.ProposedOwner = target
		rec = transition.Stamp(rec, m.now())
		err = transition.Committer{Term: term, Schema: m.Schema}.WriteRecovery(ctx, av.ModRev, rec)
	}
	if err != nil {
		// The owner would resume after its hold anyway; tell it now.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_, _ = m.Call(rctx, addr, &strandv1.HandoverRequest{Stream: stream, Resume: true})
		cancel()
		return cluster.Recovery{}, err
	}
	m.Log.Info().Str(logging.Stream, stream).Str(logging.Owner, a.Owner).Str(logging.Node, target).
		Uint64(logging.FenceEpoch, rec.FenceEpoch).Str(logging.Transition, rec.TransitionID).
		Uint64(logging.RecordTail, resp.GetRecordTail()).Msg("handover recorded as a pending recovery")
	return rec, nil
}

// Replace records the recovery that replaces member's copy of stream
// (reason drain): the owner stays the proposed owner, member is left out
// of the new assignment and a broker placement picks joins in its place.
// It is the drain loop's one call of a replacement. A member that owns the
// stream is handed over first (Handover), not replaced here; a stream whose
// owner is not live waits for that owner's recovery, as a replacement does
// (transition.ProposeReplacement).
func (m *Mover) Replace(ctx context.Context, term *leader.Term, s *state.Snapshot, stream, member string) (cluster.Recovery, error) {
	av, ok := s.Assignments[stream]
	if !ok {
		return cluster.Recovery{}, fmt.Errorf("%w: %q", transition.ErrNoStream, stream)
	}
	a := av.Value
	if _, pending := s.Recoveries[stream]; pending {
		return cluster.Recovery{}, fmt.Errorf("%w: stream %q", transition.ErrPending, stream)
	}
	if !a.Includes(member) || a.Owner == member {
		return cluster.Recovery{}, fmt.Errorf("%w: %q is not a follower of %q", ErrNotFollower, member, stream)
	}
	// The replacement path's own choice and recovery (transition,
	// replace.go), so a drain and a replacement cannot drift: the same
	// candidates (live, not draining, heard from, holding no copy) and the
	// same recovery fields, the member drained rather than removed.
	d := transition.DecideDrain(a, member, transition.ReplacementCandidates(s, transition.LoadOf(s), a, 1, nil))
	if len(d.Add) == 0 {
		return cluster.Recovery{}, fmt.Errorf("%w: replacing %q's copy of %q: no live broker that is not draining, not starting and holds no copy of it", ErrLastBroker, member, stream)
	}
	rec, err := transition.ProposeReplacement(s, stream, d, ReasonDrain)
	if err != nil {
		return cluster.Recovery{}, err
	}
	rec = transition.Stamp(rec, m.now())
	if err := (transition.Committer{Term: term, Schema: m.Schema}).WriteRecovery(ctx, av.ModRev, rec); err != nil {
		return cluster.Recovery{}, err
	}
	m.Log.Info().Str(logging.Stream, stream).Str(logging.Node, member).Strs("added_members", rec.AddedMembers).
		Uint64(logging.FenceEpoch, rec.FenceEpoch).Str(logging.Transition, rec.TransitionID).Msg("copy on a draining broker replaced: pending recovery recorded")
	return rec, nil
}

// CheckDrain decides whether node may be drained: it is a registered
// broker or a member of some assignment (else ErrNoBroker), and every
// stream with a copy on it has another live, non-draining broker, not a
// member yet, to take that copy (else ErrLastBroker, naming the stream).
func CheckDrain(s *state.Snapshot, node string) error {
	_, known := s.Brokers[node]
	names := make([]string, 0, len(s.Assignments))
	for name, av := range s.Assignments {
		if av.Value.Includes(node) {
			known = true
			names = append(names, name)
		}
	}
	if !known {
		return fmt.Errorf("%w: %q", ErrNoBroker, node)
	}
	slices.Sort(names)
	for _, name := range names {
		a := s.Assignments[name].Value
		ok := false
		for _, b := range s.LiveBrokers() {
			if b != node && !s.IsDraining(b) && !a.Includes(b) {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Errorf("%w: stream %q has copies on %v, and no other live broker that is not draining", ErrLastBroker, name, a.Members())
		}
	}
	return nil
}

// Drained reports whether node is draining and no assignment names it.
func Drained(s *state.Snapshot, node string) bool {
	if !s.IsDraining(node) {
		return false
	}
	for _, av := range s.Assignments {
		if av.Value.Includes(node) {
			return false
		}
	}
	return true
}

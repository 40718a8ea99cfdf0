package admin

import (
	"context"
	"fmt"
	"slices"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// UpdateStream changes a stream's copies or policy. A change IsFastPath
// accepts commits at once, at the same epoch; a change that raises W goes
// through a pending recovery the recoverer finishes; dropping copies is
// refused.
func (s *Service) UpdateStream(ctx context.Context, req *connect.Request[strandv1.UpdateStreamRequest]) (*connect.Response[strandv1.UpdateStreamResponse], error) {
	m := req.Msg
	name := m.GetName()
	if err := validateName("name", name); err != nil {
		return nil, err
	}
	if err := validateCopies(m.GetCopies()); err != nil {
		return nil, err
	}
	pol, err := requestPolicy(m.GetPolicy())
	if err != nil {
		return nil, err
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	term, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	av, ok := snap.Assignments[name]
	specV, hasSpec := snap.Streams[name]
	if !ok || !hasSpec {
		return nil, s.toConnect(fmt.Errorf("%w: %q", transition.ErrNoStream, name))
	}
	if _, pending := snap.Recoveries[name]; pending {
		return nil, s.toConnect(fmt.Errorf("%w: %s", transition.ErrPending, name))
	}
	a, spec := av.Value, specV.Value
	if m.GetCopies() != 0 {
		spec.Copies = int(m.GetCopies())
	}
	if pol != nil {
		spec.Policy = *pol
	}
	if spec.Copies < a.Copies() {
		return nil, rpcerr.FieldPrecondition("copies", rpcerr.PreconditionPlacement, "%v: %s has %d copies", transition.ErrDroppingCopies, name, a.Copies())
	}
	next := a
	next.Policy = spec.Policy
	var added []string
	if grow := spec.Copies - a.Copies(); grow > 0 {
		added, err = placement.Pick(s.loads.of(snap), grow, a.Members())
		if err != nil {
			return nil, rpcerr.FieldPrecondition("copies", rpcerr.PreconditionPlacement, "%v", err)
		}
		next.Followers = append(slices.Clone(a.Followers), added...)
	}
	specPut := clientv3.OpPut(s.schema.StreamKey(name), cluster.Encode(spec))
	if cluster.IsFastPath(a, next) {
		if err := s.committer(term).FastPath(ctx, av, next, specPut); err != nil {
			return nil, s.toConnect(err)
		}
		s.log.Info().Str(logging.Stream, name).Uint64(logging.Epoch, next.Epoch).Strs(logging.Followers, next.Followers).
			Str(logging.Policy, next.Policy.String()).Msg("stream changed on the fast path")
		return connect.NewResponse(&strandv1.UpdateStreamResponse{Assignment: assignmentToProto(next), FastPath: true}), nil
	}
	// W rises: records confirmed under the old W need not meet a seal of
	// R' copies, so the change seals and re-records the history start
	// through the recoverer, keeping the live owner as the proposal.
	rec := transition.Stamp(cluster.Recovery{
		Stream: name, FromEpoch: a.Epoch, FenceEpoch: a.Epoch + 1,
		OldOwner: a.Owner, OldFollowers: slices.Clone(a.Followers), ProposedOwner: a.Owner,
		AddedMembers: added, Policy: spec.Policy,
		Reason: fmt.Sprintf("stream change to %d copies under %s needs more copies to confirm", spec.Copies, spec.Policy),
	}, s.now())
	if err := s.committer(term).WriteRecovery(ctx, av.ModRev, rec, specPut); err != nil {
		return nil, s.toConnect(err)
	}
	s.log.Info().Str(logging.Stream, name).Uint64(logging.FenceEpoch, rec.FenceEpoch).Str(logging.Transition, rec.TransitionID).
		Str(logging.Reason, rec.Reason).Msg("stream change recorded as a pending recovery")
	return connect.NewResponse(&strandv1.UpdateStreamResponse{Assignment: assignmentToProto(a), FastPath: false}), nil
}

// validateOperator checks the stream field and, when set, the node field of
// an operator action.
func validateOperator(stream, node, who, why string) error {
	if err := validateName("stream", stream); err != nil {
		return err
	}
	if node != "" {
		if err := cluster.ValidateNodeName(node); err != nil {
			return rpcerr.InvalidArgument("node", "%v", err)
		}
	}
	return validateNote(who, why)
}

// validateNote bounds an operator action's who and why. They go into logs
// and, for a failover or a drain, into a stored value that every
// controller pass reads: bounded, so a long note is refused here rather
// than by etcd's request limit (which would answer Unavailable, and a
// retry would never pass).
func validateNote(who, why string) error {
	if len(who) > maxOperatorNote {
		return rpcerr.InvalidArgument("who", "at most %d bytes, got %d", maxOperatorNote, len(who))
	}
	if len(why) > maxOperatorNote {
		return rpcerr.InvalidArgument("why", "at most %d bytes, got %d", maxOperatorNote, len(why))
	}
	return nil
}

// maxOperatorNote bounds an operator action's who and why.
const maxOperatorNote = 1024

// AcceptOwnerLoss moves a stream whose owner is down to a chosen (or the
// best live) copy without sealing, recording the new owner's last published
// tails as the history start of the new epoch.
func (s *Service) AcceptOwnerLoss(ctx context.Context, req *connect.Request[strandv1.AcceptOwnerLossRequest]) (*connect.Response[strandv1.AcceptOwnerLossResponse], error) {
	m := req.Msg
	if err := validateOperator(m.GetStream(), m.GetNode(), m.GetWho(), m.GetWhy()); err != nil {
		return nil, err
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	term, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	out, err := transition.AcceptLoss(snap, m.GetStream(), m.GetNode())
	if err != nil {
		return nil, s.toConnect(err)
	}
	if err := s.committer(term).AcceptLoss(ctx, snap, out); err != nil {
		return nil, s.toConnect(err)
	}
	old := snap.Assignments[m.GetStream()].Value
	ev := s.log.Warn().Str(logging.Stream, m.GetStream()).Str(logging.Who, m.GetWho()).Str(logging.Why, m.GetWhy()).
		Str("old_owner", old.Owner).Str(logging.Owner, out.Assignment.Owner).Uint64(logging.Epoch, out.Assignment.Epoch)
	resp := &strandv1.AcceptOwnerLossResponse{Assignment: assignmentToProto(out.Assignment)}
	if out.Start != nil {
		resp.Start = startToProto(*out.Start)
		ev = ev.Uint64(logging.RecordTail, out.Start.RecordTail).Uint64(logging.CursorEventTail, out.Start.CursorEventTail)
	}
	ev.Msg("operator accepted owner loss; stream moved without sealing")
	return connect.NewResponse(resp), nil
}

// WithdrawRecovery deletes a pending recovery. Copies the recoverer already
// sealed for it stay sealed at its fence epoch, refusing publishes, since a
// copy fenced past its assignment waits for a new one. The controller's
// liveness loop records a new recovery of a replicated stream, at the same
// fence epoch with a new transition id that takes the seals over, when the
// owner is still lost or when a member of the assignment reports its copy
// sealed past the assignment's epoch (liveness.SealedPast); the latter
// covers an operator's failover or a stream change withdrawn while the
// owner is live. A single-copy stream left sealed is listed under
// attention until a recovery that adds copies takes its seal over (a stream
// update to more copies records one, and so does the liveness loop while
// the stream's spec asks for more copies than it has). If nothing was
// sealed and the owner is live, the stream goes on at its assignment.
func (s *Service) WithdrawRecovery(ctx context.Context, req *connect.Request[strandv1.WithdrawRecoveryRequest]) (*connect.Response[strandv1.WithdrawRecoveryResponse], error) {
	m := req.Msg
	if err := validateOperator(m.GetStream(), "", m.GetWho(), m.GetWhy()); err != nil {
		return nil, err
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	term, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := snap.Assignments[m.GetStream()]; !ok {
		return nil, s.toConnect(fmt.Errorf("%w: %q", transition.ErrNoStream, m.GetStream()))
	}
	rec := snap.Recoveries[m.GetStream()].Value
	if err := s.committer(term).WithdrawRecovery(ctx, snap, m.GetStream()); err != nil {
		return nil, s.toConnect(err)
	}
	s.log.Warn().Str(logging.Stream, m.GetStream()).Str(logging.Who, m.GetWho()).Str(logging.Why, m.GetWhy()).
		Str(logging.Transition, rec.TransitionID).Uint64(logging.FenceEpoch, rec.FenceEpoch).Msg("operator withdrew a pending recovery")
	return connect.NewResponse(&strandv1.WithdrawRecoveryResponse{}), nil
}

// Failover records a pending recovery for a replicated stream on an
// operator's word (eager failover by hand); the recoverer seals and commits.
// Without a target it promotes the furthest sealed copy, which for a live
// owner is usually the owner itself: the proposed owner is only a
// proposal. With a target (to) it is a handover (handover, move.go).
func (s *Service) Failover(ctx context.Context, req *connect.Request[strandv1.FailoverRequest]) (*connect.Response[strandv1.FailoverResponse], error) {
	m := req.Msg
	if err := validateOperator(m.GetStream(), "", m.GetWho(), m.GetWhy()); err != nil {
		return nil, err
	}
	if m.GetTo() != "" {
		return s.handover(ctx, m)
	}
	if m.GetCatchUpMs() != 0 {
		return nil, rpcerr.InvalidArgument("catch_up_ms", "only with to: a failover without a target pauses nothing")
	}
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	term, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	av, ok := snap.Assignments[m.GetStream()]
	if !ok {
		return nil, s.toConnect(fmt.Errorf("%w: %q", transition.ErrNoStream, m.GetStream()))
	}
	reason := fmt.Sprintf("operator failover by %s: %s", m.GetWho(), m.GetWhy())
	// The proposal is the furthest live follower; a live owner is not
	// replaced by a new member, since its copy answers the seal.
	rec, err := transition.ProposeRecovery(snap, m.GetStream(), nil, reason)
	if err != nil {
		return nil, s.toConnect(err)
	}
	rec = transition.Stamp(rec, s.now())
	if err := s.committer(term).WriteRecovery(ctx, av.ModRev, rec); err != nil {
		return nil, s.toConnect(err)
	}
	s.log.Warn().Str(logging.Stream, rec.Stream).Str(logging.Who, m.GetWho()).Str(logging.Why, m.GetWhy()).
		Str(logging.Transition, rec.TransitionID).Uint64(logging.FenceEpoch, rec.FenceEpoch).
		Str("proposed_owner", rec.ProposedOwner).Msg("operator failover recorded as a pending recovery")
	return connect.NewResponse(&strandv1.FailoverResponse{Recovery: recoveryToProto(rec)}), nil
}

package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/logging"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/services/controller/internal/rebalance"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// maxCatchUpMillis bounds the catch-up a handover may ask for.
const maxCatchUpMillis = 30_000

// commitWait bounds how long a handover call waits for the recoverer to
// commit the move it recorded.
const commitWait = 10 * time.Second

// handover is Failover with a target (docs/protocol.md, "Handover"): the
// owner pauses, the target catches up, a pending recovery proposing the
// target is recorded, and the call returns once the recoverer committed
// it, with the assignment it committed. The recoverer promotes the
// furthest sealed copy, the target when it is tied with it; the answer
// names whichever owner was committed.
func (s *Service) handover(ctx context.Context, m *strandv1.FailoverRequest) (*connect.Response[strandv1.FailoverResponse], error) {
	if err := cluster.ValidateNodeName(m.GetTo()); err != nil {
		return nil, rpcerr.InvalidArgument("to", "%v", err)
	}
	if m.GetCatchUpMs() > maxCatchUpMillis {
		return nil, rpcerr.InvalidArgument("catch_up_ms", "at most %d, got %d", maxCatchUpMillis, m.GetCatchUpMs())
	}
	if s.mover == nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("this controller makes no handovers"))
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
	rec, err := s.mover.Handover(ctx, term, snap, m.GetStream(), m.GetTo(), time.Duration(m.GetCatchUpMs())*time.Millisecond)
	if err != nil {
		return nil, s.toConnect(err)
	}
	s.log.Warn().Str(logging.Stream, rec.Stream).Str(logging.Who, m.GetWho()).Str(logging.Why, m.GetWhy()).
		Str(logging.Transition, rec.TransitionID).Uint64(logging.FenceEpoch, rec.FenceEpoch).
		Str("proposed_owner", rec.ProposedOwner).Msg("operator handover recorded as a pending recovery")
	out := &strandv1.FailoverResponse{Recovery: recoveryToProto(rec)}
	// The move is recorded: what is left is a wait on the view, which
	// reads and writes nothing in etcd, so it gives its admission slot
	// back first. A slot held for up to commitWait per handover would let
	// a few slow commits refuse every other admin call (docs/api.md, "Limits").
	release()
	if a, ok := s.waitCommitted(ctx, rec); ok {
		out.Assignment = assignmentToProto(a)
	}
	return connect.NewResponse(out), nil
}

// waitCommitted waits, at most commitWait and the call's context, for the
// stream's assignment to reach rec's fence epoch, from the view's watch.
// It holds no admission slot: its callers give theirs back before it.
func (s *Service) waitCommitted(ctx context.Context, rec cluster.Recovery) (cluster.Assignment, bool) {
	ctx, cancel := context.WithTimeout(ctx, commitWait)
	defer cancel()
	for {
		snap, changed := s.view.Current()
		if snap != nil {
			if av, ok := snap.Assignments[rec.Stream]; ok && av.Value.Epoch >= rec.FenceEpoch {
				return av.Value, true
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return cluster.Assignment{}, false
		}
	}
}

// validateNode checks a drain's node and its operator note.
func validateNode(node, who, why string) error {
	if err := cluster.ValidateNodeName(node); err != nil {
		return rpcerr.InvalidArgument("node", "%v", err)
	}
	return validateNote(who, why)
}

// DrainBroker marks a broker draining (docs/operating.md, "Draining a
// broker"), in one transaction guarded by its draining key being absent:
// a broker no broker key or assignment names is NotFound, and a drain that
// would leave some stream's copy nowhere to go is FailedPrecondition; both
// write nothing. Draining a broker that drains already changes nothing.
// The controller's rebalance loop then moves the broker's streams off it.
func (s *Service) DrainBroker(ctx context.Context, req *connect.Request[strandv1.DrainBrokerRequest]) (*connect.Response[strandv1.DrainBrokerResponse], error) {
	m := req.Msg
	if err := validateNode(m.GetNode(), m.GetWho(), m.GetWhy()); err != nil {
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
	node := m.GetNode()
	if !snap.IsDraining(node) {
		if err := rebalance.CheckDrain(snap, node); err != nil {
			return nil, s.toConnect(err)
		}
		d := cluster.Drain{Node: node, Who: m.GetWho(), Why: m.GetWhy(), Since: s.now().UTC()}
		resp, err := term.Txn(ctx, []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.schema.DrainingKey(node)), "=", 0),
		}, []clientv3.Op{clientv3.OpPut(s.schema.DrainingKey(node), cluster.Encode(d))}, nil)
		if err != nil {
			return nil, s.toConnect(err)
		}
		if resp.Succeeded {
			s.log.Warn().Str(logging.Node, node).Str(logging.Who, m.GetWho()).Str(logging.Why, m.GetWhy()).Msg("broker draining")
		}
	}
	// The snapshot is shared with other calls and loops: the answer says
	// what was written without changing it.
	return connect.NewResponse(&strandv1.DrainBrokerResponse{Broker: s.brokerOf(snap, node, true)}), nil
}

// UndrainBroker ends a drain: placement may take copies on the broker
// again. Copies already moved stay where they are. A broker that does not
// drain changes nothing; one nothing names is NotFound.
func (s *Service) UndrainBroker(ctx context.Context, req *connect.Request[strandv1.UndrainBrokerRequest]) (*connect.Response[strandv1.UndrainBrokerResponse], error) {
	m := req.Msg
	if err := validateNode(m.GetNode(), m.GetWho(), m.GetWhy()); err != nil {
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
	node := m.GetNode()
	dv, draining := snap.Draining[node]
	if !draining {
		if err := rebalance.CheckDrain(snap, node); err != nil && !isLastBroker(err) {
			return nil, s.toConnect(err)
		}
		return connect.NewResponse(&strandv1.UndrainBrokerResponse{Broker: s.brokerOf(snap, node, false)}), nil
	}
	resp, err := term.Txn(ctx, []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(s.schema.DrainingKey(node)), "=", dv.ModRev),
	}, []clientv3.Op{clientv3.OpDelete(s.schema.DrainingKey(node))}, nil)
	if err != nil {
		return nil, s.toConnect(err)
	}
	if resp.Succeeded {
		s.log.Warn().Str(logging.Node, node).Str(logging.Who, m.GetWho()).Str(logging.Why, m.GetWhy()).Msg("broker no longer draining")
	}
	return connect.NewResponse(&strandv1.UndrainBrokerResponse{Broker: s.brokerOf(snap, node, false)}), nil
}

func isLastBroker(err error) bool { return errors.Is(err, rebalance.ErrLastBroker) }

// brokerOf is node's status in snap, draining as given.
func (s *Service) brokerOf(snap *state.Snapshot, node string, draining bool) *strandv1.Broker {
	copies, owned := snap.CopyCounts()
	info, live := snap.Brokers[node]
	if !live {
		info = cluster.BrokerInfo{Node: node}
	}
	out := brokerStatus(snap, info, live, copies, owned)
	out.Draining, out.Drained = draining, draining && copies[node] == 0
	return out
}

// GetRebalancePlan returns the owner moves the rebalance loop would make
// now (rebalance.PlanOf), all of them, without making any.
func (s *Service) GetRebalancePlan(ctx context.Context, _ *connect.Request[strandv1.GetRebalancePlanRequest]) (*connect.Response[strandv1.GetRebalancePlanResponse], error) {
	release, err := s.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	_, snap, err := s.lead(ctx)
	if err != nil {
		return nil, err
	}
	moves, owned := rebalance.PlanOf(snap, len(snap.Assignments))
	out := &strandv1.GetRebalancePlanResponse{Owned: map[string]uint32{}}
	for n, c := range owned {
		out.Owned[n] = uint32(c) //nolint:gosec // a count of assignments
	}
	for _, mv := range moves {
		out.Moves = append(out.Moves, &strandv1.OwnerMove{Stream: mv.Stream, From: mv.From, To: mv.To})
	}
	return connect.NewResponse(out), nil
}

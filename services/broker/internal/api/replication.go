package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/encoding/protowire"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/rpcerr"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/services/broker/internal/replica"
)

// ReplicationService implements strand.v1.ReplicationService for peers.
type ReplicationService struct {
	strandv1connect.UnimplementedReplicationServiceHandler
	m   *replica.Manager
	log zerolog.Logger
}

// NewReplicationService returns the peer-facing handler.
func NewReplicationService(m *replica.Manager, log zerolog.Logger) *ReplicationService {
	return &ReplicationService{m: m, log: log}
}

func (s *ReplicationService) Follow(ctx context.Context, stream *connect.BidiStream[strandv1.FollowRequest, strandv1.FollowResponse]) error {
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	if perStreamFollow(first) {
		// A follower of the release before: it would wait on this call for
		// batches that never come, its streams' follows stalled unseen.
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("stream: a Follow call per stream is not served here: this broker takes one call per owner broker, carrying every stream (FollowStart); upgrade the follower"))
	}
	// The call's identity: every stream's follow on it is checked against
	// the assignment as this node's (replica.ServeFollow); the peer token
	// was checked before the handler ran.
	if err := cluster.ValidateNodeName(first.GetNode()); err != nil {
		return rpcerr.InvalidArgument("node", "invalid node id %q", first.GetNode())
	}
	// With TLS the claimed node must be the one the caller's certificate
	// names: a node may follow as itself only, so no node can take
	// another's place in an assignment's confirms (docs/operating.md,
	// "Security").
	if node, _, ok := rpcserver.PeerFromContext(ctx); ok && node != first.GetNode() {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node: the call follows as %q but its certificate is %s", first.GetNode(), certName(node)))
	}
	return toConnect(s.m.ServeFollow(ctx, first, stream, replica.FollowEdge{
		CheckStream: func(name string) error { return validStreamField("starts.stream", name) },
		Wire:        toConnect,
	}))
}

func (s *ReplicationService) Seal(ctx context.Context, req *connect.Request[strandv1.SealRequest]) (*connect.Response[strandv1.SealResponse], error) {
	resp, err := s.seal(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// seal is one Seal, as the call and each SealMany entry answer it: the
// fields checked, then replica.Manager.Seal (the incarnation check, the
// fence, the effective tails).
func (s *ReplicationService) seal(ctx context.Context, msg *strandv1.SealRequest) (*strandv1.SealResponse, error) {
	if err := validStream(msg.GetStream()); err != nil {
		return nil, err
	}
	if msg.GetFenceEpoch() == 0 {
		return nil, rpcerr.InvalidArgument("fence_epoch", "must be at least 1")
	}
	if msg.GetTransitionId() == "" || len(msg.GetTransitionId()) > 128 {
		return nil, rpcerr.InvalidArgument("transition_id", "must be 1..128 bytes")
	}
	st, err := s.m.Seal(ctx, msg.GetStream(), msg.GetFenceEpoch(), msg.GetTransitionId(), msg.GetIncarnation())
	if err != nil {
		return nil, toConnect(err)
	}
	return &strandv1.SealResponse{
		Node:            s.m.Node(),
		FenceEpoch:      msg.GetFenceEpoch(),
		RecordTail:      st.RecordTail,
		CursorEventTail: st.CursorEventTail,
		LogEpochs:       replica.LogEpochsToProto(st.SealedLogEpochs),
		Chain:           st.Chain,
	}, nil
}

// maxHandoverMillis bounds a handover's catch-up and hold: a pause is
// short, and a longer one would hold publishes up for nothing.
const maxHandoverMillis = 60_000

// Handover pauses this broker's owner copy for a move to a follower
// (replica.Manager.Handover, docs/protocol.md "Handover"), or ends such a
// pause (resume).
func (s *ReplicationService) Handover(ctx context.Context, req *connect.Request[strandv1.HandoverRequest]) (*connect.Response[strandv1.HandoverResponse], error) {
	msg := req.Msg
	if err := validStream(msg.GetStream()); err != nil {
		return nil, err
	}
	if msg.GetResume() {
		s.m.ResumeHandover(msg.GetStream())
		return connect.NewResponse(&strandv1.HandoverResponse{}), nil
	}
	if msg.GetEpoch() == 0 {
		return nil, rpcerr.InvalidArgument("epoch", "must be at least 1")
	}
	if err := cluster.ValidateNodeName(msg.GetTarget()); err != nil {
		return nil, rpcerr.InvalidArgument("target", "invalid node id %q", msg.GetTarget())
	}
	if msg.GetCatchUpMs() > maxHandoverMillis {
		return nil, rpcerr.InvalidArgument("catch_up_ms", "at most %d, got %d", maxHandoverMillis, msg.GetCatchUpMs())
	}
	if msg.GetHoldMs() > maxHandoverMillis {
		return nil, rpcerr.InvalidArgument("hold_ms", "at most %d, got %d", maxHandoverMillis, msg.GetHoldMs())
	}
	res, err := s.m.Handover(ctx, msg.GetStream(), msg.GetEpoch(), msg.GetTarget(),
		time.Duration(msg.GetCatchUpMs())*time.Millisecond, time.Duration(msg.GetHoldMs())*time.Millisecond)
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&strandv1.HandoverResponse{
		CaughtUp: res.CaughtUp, RecordTail: res.RecordTail, CursorEventTail: res.CursorEventTail,
		TargetRecordTail: res.TargetRecordTail, TargetCursorEventTail: res.TargetCursorEventTail,
	}), nil
}

func certName(node string) string {
	if node == "" {
		return "a client's, not a node's"
	}
	return fmt.Sprintf("node %q's", node)
}

// perStreamFollow reports whether m is the first message of a call that
// follows one stream, as brokers of the release before open: it names the
// stream in field 1, reserved since.
func perStreamFollow(m *strandv1.FollowRequest) bool {
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			return false
		}
		if num == 1 {
			return true
		}
		b = b[n:]
	}
	return false
}

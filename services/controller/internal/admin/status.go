package admin

import (
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// streamStatus assembles what GetStream shows about one stream from a
// snapshot: spec, assignment, per-copy status, pending recovery, history
// starts and attention entries. ok is false when the stream has neither a
// spec nor an assignment.
func streamStatus(s *state.Snapshot, stream string, mem *attention.Memory, entries []attention.Entry) (*strandv1.GetStreamResponse, bool) {
	spec, hasSpec := s.Streams[stream]
	av, hasAsg := s.Assignments[stream]
	if !hasSpec && !hasAsg {
		return nil, false
	}
	out := &strandv1.GetStreamResponse{}
	if hasSpec {
		out.Spec = specToProto(spec.Value)
	}
	if hasAsg {
		out.Assignment = assignmentToProto(av.Value)
		out.Copies = copyStatuses(s, av.Value, mem)
	}
	if r, ok := s.Recoveries[stream]; ok {
		out.PendingRecovery = recoveryToProto(r.Value)
	}
	for _, h := range s.History[stream].Value {
		out.History = append(out.History, startToProto(h))
	}
	for _, e := range entries {
		if e.Stream == stream {
			out.Attention = append(out.Attention, attentionToProto(e))
		}
	}
	return out, true
}

// copyStatuses reports every member of a, down ones included, then the
// copies the spec counts that the assignment lacks (a member a failover
// left out, named when the controller remembers it), then any other broker
// whose heartbeat still names the stream (a copy left out of the
// assignment, such as a sealed old owner). Whether a copy is in sync, and
// its lag, are attention.JudgeReplication's: one judgement for GetStream,
// attention and the controller's metrics.
func copyStatuses(s *state.Snapshot, a cluster.Assignment, mem *attention.Memory) []*strandv1.CopyStatus {
	r, _ := attention.JudgeReplication(s, a.Stream, mem)
	var out []*strandv1.CopyStatus
	shown := map[string]bool{}
	for _, c := range append(slices.Clone(r.Members), r.Missing...) {
		out = append(out, copyToProto(c))
		if c.Node != "" {
			shown[c.Node] = true
		}
	}
	var others []string
	for node, hb := range s.Heartbeats {
		if hb.Holds(a.Stream) && !shown[node] {
			others = append(others, node)
		}
	}
	slices.Sort(others)
	owner, ownerOK := s.Tails(a.Owner, a.Stream)
	for _, node := range others {
		t, _ := s.Tails(node, a.Stream)
		cs := &strandv1.CopyStatus{Node: node, Live: s.Live(node), Role: t.Role}
		setTails(cs, t)
		if ownerOK {
			cs.Lag = proto.Uint64(lagBehind(owner, t))
		}
		out = append(out, cs)
	}
	return out
}

func copyToProto(c attention.Copy) *strandv1.CopyStatus {
	cs := &strandv1.CopyStatus{Node: c.Node, Role: c.Role, Live: c.Live, State: c.State, InSync: c.State == attention.InSync}
	if c.Published {
		// What the copy published names its role best (a sealed copy).
		cs.Role = c.Tails.Role
		setTails(cs, c.Tails)
	}
	if c.LagKnown {
		cs.Lag = proto.Uint64(c.Lag)
	}
	if !c.Since.IsZero() {
		cs.Since = timestamppb.New(c.Since)
	}
	return cs
}

func setTails(cs *strandv1.CopyStatus, t cluster.CopyTails) {
	cs.Epoch = t.Epoch
	cs.RecordTail = t.RecordTail
	cs.CursorEventTail = t.CursorEventTail
	cs.ConfirmWatermark = t.ConfirmWatermark
	cs.SealEpoch = t.SealEpoch
}

func lagBehind(owner, t cluster.CopyTails) uint64 {
	if owner.RecordTail > t.RecordTail {
		return owner.RecordTail - t.RecordTail
	}
	return 0
}

package admin

import (
	"slices"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// streamStatus assembles what GetStream shows about one stream from a
// snapshot: spec, assignment, per-copy status, pending recovery, history
// starts and attention entries. ok is false when the stream has neither a
// spec nor an assignment.
func streamStatus(s *state.Snapshot, stream string, entries []attention.Entry) (*strandv1.GetStreamResponse, bool) {
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
		out.Copies = copyStatuses(s, av.Value)
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

// copyStatuses reports every member of a, then any other broker whose
// heartbeat still names the stream (a copy left out of the assignment, such
// as a sealed old owner).
//
// Lag is how far a copy's published record tail is behind the owner's. A copy
// is in sync when it is live, published tails at the assignment's epoch, and
// its record tail reaches the owner's confirm watermark: it then holds every
// confirmed record and counts toward W for them. The owner is in sync when
// live at the assignment's epoch. Lag 0 alone would call a follower out of
// sync during every publish burst, so it is not the test.
func copyStatuses(s *state.Snapshot, a cluster.Assignment) []*strandv1.CopyStatus {
	nodes := a.Members()
	var others []string
	for node, hb := range s.Heartbeats {
		if _, ok := hb.Streams[a.Stream]; ok && !a.Includes(node) {
			others = append(others, node)
		}
	}
	slices.Sort(others)
	nodes = append(nodes, others...)

	owner, ownerOK := s.Tails(a.Owner, a.Stream)
	var out []*strandv1.CopyStatus
	for _, node := range nodes {
		t, ok := s.Tails(node, a.Stream)
		cs := &strandv1.CopyStatus{Node: node, Live: s.Live(node)}
		switch {
		case ok:
			cs.Role = t.Role
		case node == a.Owner:
			cs.Role = cluster.RoleOwner
		case a.Includes(node):
			cs.Role = cluster.RoleFollower
		}
		if ok {
			cs.Epoch = t.Epoch
			cs.RecordTail = t.RecordTail
			cs.CursorEventTail = t.CursorEventTail
			cs.ConfirmWatermark = t.ConfirmWatermark
			cs.SealEpoch = t.SealEpoch
		}
		if ok && ownerOK && owner.RecordTail > t.RecordTail {
			cs.Lag = owner.RecordTail - t.RecordTail
		}
		atEpoch := cs.Live && ok && a.Includes(node) && t.Epoch == a.Epoch
		cs.InSync = atEpoch && (node == a.Owner || (ownerOK && t.RecordTail >= owner.ConfirmWatermark))
		out = append(out, cs)
	}
	return out
}

package admin

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/state"
)

func policyFromProto(p *strandv1.ConfirmPolicy) cluster.Policy {
	return cluster.Policy{Name: p.GetName(), Nodes: int(p.GetNodes())}
}

func policyToProto(p cluster.Policy) *strandv1.ConfirmPolicy {
	name := p.Name
	if name == "" {
		name = cluster.LocalDurable
	}
	return &strandv1.ConfirmPolicy{Name: name, Nodes: uint32(p.Nodes)}
}

func retentionFromProto(r *strandv1.Retention) cluster.Retention {
	var age time.Duration
	if r.GetMaxAge() != nil {
		age = r.GetMaxAge().AsDuration()
	}
	return cluster.Retention{MaxRecords: r.GetMaxRecords(), MaxBytes: r.GetMaxBytes(), MaxAge: age}
}

func retentionToProto(r cluster.Retention) *strandv1.Retention {
	out := &strandv1.Retention{MaxRecords: r.MaxRecords, MaxBytes: r.MaxBytes}
	if r.MaxAge != 0 {
		out.MaxAge = durationpb.New(r.MaxAge)
	}
	return out
}

func specToProto(s cluster.StreamSpec) *strandv1.StreamSpec {
	return &strandv1.StreamSpec{
		Name:      s.Name,
		Copies:    uint32(s.Copies),
		Policy:    policyToProto(s.Policy),
		Retention: retentionToProto(s.Retention),
	}
}

func assignmentToProto(a cluster.Assignment) *strandv1.Assignment {
	return &strandv1.Assignment{
		Stream:      a.Stream,
		Epoch:       a.Epoch,
		Owner:       a.Owner,
		Followers:   append([]string(nil), a.Followers...),
		Policy:      policyToProto(a.Policy),
		Incarnation: a.Incarnation,
	}
}

func recoveryToProto(r cluster.Recovery) *strandv1.Recovery {
	return &strandv1.Recovery{
		Stream:        r.Stream,
		FromEpoch:     r.FromEpoch,
		FenceEpoch:    r.FenceEpoch,
		TransitionId:  r.TransitionID,
		OldOwner:      r.OldOwner,
		OldFollowers:  append([]string(nil), r.OldFollowers...),
		ProposedOwner: r.ProposedOwner,
		AddedMembers:  append([]string(nil), r.AddedMembers...),
		Reason:        r.Reason,
	}
}

func startToProto(h cluster.HistoryStart) *strandv1.HistoryStart {
	return &strandv1.HistoryStart{Epoch: h.Epoch, RecordTail: h.RecordTail, CursorEventTail: h.CursorEventTail, Node: h.Node}
}

func attentionToProto(e attention.Entry) *strandv1.AttentionEntry {
	out := &strandv1.AttentionEntry{
		Stream:          e.Stream,
		Kind:            e.Kind,
		Reason:          e.Reason,
		Missing:         append([]string(nil), e.Missing...),
		StartRecordTail: e.StartRecordTail,
		StartNode:       e.StartNode,
		Node:            e.Node,
		Action:          e.Action,
	}
	if !e.Since.IsZero() {
		out.Since = timestamppb.New(e.Since)
	}
	return out
}

// brokerStatus is brokerToProto with the broker's drain state and the
// copies and owners it holds.
func brokerStatus(snap *state.Snapshot, b cluster.BrokerInfo, live bool, copies, owned map[string]int) *strandv1.Broker {
	out := brokerToProto(b, live)
	out.Draining = snap.IsDraining(b.Node)
	out.Drained = out.Draining && copies[b.Node] == 0
	out.Copies, out.Owned = uint32(copies[b.Node]), uint32(owned[b.Node]) //nolint:gosec // counts of assignments
	return out
}

func brokerToProto(b cluster.BrokerInfo, live bool) *strandv1.Broker {
	out := &strandv1.Broker{Node: b.Node, Address: b.Address, Live: live, Zone: b.Zone}
	if !b.StartTime.IsZero() {
		out.StartTime = timestamppb.New(b.StartTime)
	}
	return out
}

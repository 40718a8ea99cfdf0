package attention

import (
	"fmt"
	"slices"
	"testing"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
)

var majority = cluster.Policy{Name: cluster.MajorityDurable}

func asg(owner string, followers ...string) cluster.Assignment {
	return cluster.Assignment{Stream: "s", Epoch: 3, Owner: owner, Followers: followers, Policy: majority}
}

func rec(owner string, followers ...string) cluster.Recovery {
	return cluster.Recovery{Stream: "s", FromEpoch: 3, FenceEpoch: 4, OldOwner: owner, OldFollowers: followers, ProposedOwner: followers[0]}
}

func tails(rt uint64) cluster.CopyTails {
	return cluster.CopyTails{Epoch: 4, Role: cluster.RoleSealed, RecordTail: rt, SealEpoch: 4}
}

// brief renders entries as kind/node[/missing][/start] for comparison.
func brief(es []Entry) []string {
	var out []string
	for _, e := range es {
		s := e.Stream + ":" + e.Kind + "/" + e.Node
		if len(e.Missing) > 0 {
			s += fmt.Sprintf("/missing=%v", e.Missing)
		}
		if e.StartNode != "" {
			s += fmt.Sprintf("/start=%d@%s", e.StartRecordTail, e.StartNode)
		}
		out = append(out, s)
	}
	return out
}

func TestJudge(t *testing.T) {
	start := cluster.HistoryStart{Epoch: 3, RecordTail: 100, Node: "b1"}
	cases := []struct {
		name string
		snap *state.Snapshot
		want []string
	}{
		{
			name: "healthy",
			snap: state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(),
		},
		{
			name: "single-copy owner down",
			snap: state.Build().Stream(asg("b1")).Snapshot(),
			want: []string{"s:single_copy_owner_down/b1"},
		},
		{
			name: "follower down",
			snap: state.Build().Live("b1", "b2").Stream(asg("b1", "b2", "b3")).Snapshot(),
			want: []string{"s:broker_down/b3"},
		},
		{
			// E=3 majority: R=2; only b2 has a heartbeat.
			name: "recovery waiting for copies",
			snap: state.Build().Live("b2").Heartbeat("b2").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).Snapshot(),
			want: []string{"s:broker_down/b1", "s:broker_down/b3", "s:recovery_waiting_copies//missing=[b1 b3]"},
		},
		{
			name: "enough copies, no history: no wait",
			snap: state.Build().Live("b2", "b3").Heartbeat("b2").Heartbeat("b3").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).Snapshot(),
			want: []string{"s:broker_down/b1"},
		},
		{
			name: "every live copy below the latest start: waiting for the prefix",
			snap: state.Build().Live("b2", "b3").Tails("b2", "s", tails(60)).Tails("b3", "s", tails(99)).
				Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				History("s", cluster.HistoryStart{Epoch: 2, RecordTail: 10, Node: "b2"}, start).Snapshot(),
			want: []string{"s:broker_down/b1", "s:recovery_waiting_prefix//start=100@b1"},
		},
		{
			name: "a live copy at the start: no wait",
			snap: state.Build().Live("b2", "b3").Tails("b2", "s", tails(60)).Tails("b3", "s", tails(100)).
				Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).History("s", start).Snapshot(),
			want: []string{"s:broker_down/b1"},
		},
		{
			name: "quiet while a live copy has published nothing",
			snap: state.Build().Live("b2", "b3").Tails("b2", "s", tails(60)).Heartbeat("b3").
				Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).History("s", start).Snapshot(),
			want: []string{"s:broker_down/b1"},
		},
		{
			name: "failover suspect at the current owner only",
			snap: state.Build().Live("b1", "b2", "b3").
				Tails("b2", "s", cluster.CopyTails{Epoch: 3, Suspect: "b1"}).
				Tails("b3", "s", cluster.CopyTails{Epoch: 3, Suspect: "b0"}).
				Stream(asg("b1", "b2", "b3")).Snapshot(),
			want: []string{"s:failover_suspect/b1"},
		},
		{
			// Sealed for a recovery that was withdrawn: it refuses
			// publishes and the liveness loop records nothing for it.
			name: "single copy sealed past its assignment, no recovery pending",
			snap: state.Build().Live("b1").Tails("b1", "s", tails(9)).Stream(asg("b1")).Snapshot(),
			want: []string{"s:single_copy_sealed/b1"},
		},
		{
			name: "single copy sealed for a pending recovery: no wait",
			snap: state.Build().Live("b1").Tails("b1", "s", tails(9)).Stream(asg("b1")).
				Recovery(cluster.Recovery{Stream: "s", FromEpoch: 3, FenceEpoch: 4, OldOwner: "b1", ProposedOwner: "b1", AddedMembers: []string{"b2"}}).Snapshot(),
		},
		{
			name: "single copy sealed at its assignment's epoch: no wait",
			snap: state.Build().Live("b1").Tails("b1", "s", cluster.CopyTails{Epoch: 3, Role: cluster.RoleSealed, SealEpoch: 3}).Stream(asg("b1")).Snapshot(),
		},
		{
			// The liveness loop records a new recovery for it.
			name: "replicated copies sealed past the assignment: no entry",
			snap: state.Build().Live("b1", "b2").Tails("b1", "s", tails(9)).Tails("b2", "s", tails(9)).Stream(asg("b1", "b2")).Snapshot(),
		},
		{
			name: "chain mismatch",
			snap: state.Build().Live("b1", "b2").Tails("b2", "s", cluster.CopyTails{Epoch: 3, ChainMismatch: true}).
				Stream(asg("b1", "b2")).Snapshot(),
			want: []string{"s:chain_mismatch/b2"},
		},
	}
	for _, c := range cases {
		if got := brief(Judge(c.snap)); !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, got, c.want)
		}
	}
}

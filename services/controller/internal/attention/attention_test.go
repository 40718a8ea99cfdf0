package attention

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
)

var majority = cluster.Policy{Name: cluster.MajorityDurable}

func asg(owner string, followers ...string) cluster.Assignment {
	return cluster.Assignment{Stream: "s", Epoch: 3, Owner: owner, Followers: followers, Policy: majority}
}

func rec(owner string, followers ...string) cluster.Recovery {
	return cluster.Recovery{Stream: "s", FromEpoch: 3, FenceEpoch: 4, TransitionID: "t1", OldOwner: owner, OldFollowers: followers, ProposedOwner: followers[0]}
}

// refusals is what the recoverer records after a round of transition at
// fence that left the recovery waiting with b2 alone sealed.
func refusals(transition string, fence uint64, rs ...cluster.SealRefusal) cluster.SealRefusals {
	return cluster.SealRefusals{Stream: "s", FenceEpoch: fence, TransitionID: transition, R: 2, Sealed: []string{"b2"}, Refusals: rs}
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
			// E=3 majority: R=2. b2 and b3 are live, so heartbeats alone
			// see no wait; b3 refused its seal.
			name: "recovery waiting on a seal a live copy refused",
			snap: state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				Refusals(refusals("t1", 4, cluster.SealRefusal{Node: "b3", Code: "failed_precondition", Error: "another incarnation"})).Snapshot(),
			want: []string{"s:broker_down/b1", "s:recovery_seal_refused/b3"},
		},
		{
			name: "every live copy refusing is listed, each once",
			snap: state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				Refusals(refusals("t1", 4, cluster.SealRefusal{Node: "b3", Error: "no answer"}, cluster.SealRefusal{Node: "b1", Error: "x"})).Snapshot(),
			want: []string{"s:recovery_seal_refused/b1", "s:recovery_seal_refused/b3"},
		},
		{
			// Its broker is gone since: listed as down, not as refusing.
			name: "a refusing copy no longer live",
			snap: state.Build().Live("b2").Heartbeat("b2").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				Refusals(refusals("t1", 4, cluster.SealRefusal{Node: "b3", Error: "refused"})).Snapshot(),
			want: []string{"s:broker_down/b1", "s:broker_down/b3", "s:recovery_waiting_copies//missing=[b1 b3]"},
		},
		{
			name: "refusals of another transition",
			snap: state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				Refusals(refusals("t0", 4, cluster.SealRefusal{Node: "b3", Error: "refused"})).Snapshot(),
			want: []string{"s:broker_down/b1"},
		},
		{
			name: "refusals of another fence epoch",
			snap: state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				Refusals(refusals("t1", 5, cluster.SealRefusal{Node: "b3", Error: "refused"})).Snapshot(),
			want: []string{"s:broker_down/b1"},
		},
		{
			name: "refusals with no recovery pending",
			snap: state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).
				Refusals(refusals("t1", 4, cluster.SealRefusal{Node: "b3", Error: "refused"})).Snapshot(),
		},
		{
			name: "a refusal from a node that holds no old copy",
			snap: state.Build().Live("b2", "b3", "b4").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).
				Refusals(refusals("t1", 4, cluster.SealRefusal{Node: "b4", Error: "refused"})).Snapshot(),
			want: []string{"s:broker_down/b1"},
		},
		{
			name: "chain mismatch",
			snap: state.Build().Live("b1", "b2").Tails("b2", "s", cluster.CopyTails{Epoch: 3, ChainMismatch: true}).
				Stream(asg("b1", "b2")).Snapshot(),
			want: []string{"s:chain_mismatch/b2"},
		},
	}
	for _, c := range cases {
		// Most snapshots here publish no tails, so their copies read as
		// lagging; under_replicated has its own table.
		got := brief(slices.DeleteFunc(Judge(c.snap, nil), func(e Entry) bool { return e.Kind == UnderReplicated }))
		if !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.name, got, c.want)
		}
	}
}

// The reason names the refusing copy, what it answered and how the
// recovery stands, so an operator sees why it waits.
func TestSealRefusedReason(t *testing.T) {
	since := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	base := state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3"))
	cases := []struct {
		name     string
		refusals cluster.SealRefusals
		want     string
	}{
		{
			name: "fewer than R sealed",
			refusals: refusals("t1", 4, cluster.SealRefusal{Node: "b3", Code: "failed_precondition",
				Error: "worker: seal b3 at 127.0.0.1:9: failed_precondition: seal of another incarnation", Since: since}),
			want: "recovery to epoch 4 waits with 1 of the 2 seals it needs (sealed: b2); live copy b3 refused its seal " +
				"(failed_precondition, since 2025-03-04T05:06:07Z): worker: seal b3 at 127.0.0.1:9: failed_precondition: seal of another incarnation",
		},
		{
			name: "R sealed, below the confirmed prefix",
			refusals: cluster.SealRefusals{Stream: "s", FenceEpoch: 4, TransitionID: "t1", R: 2, Sealed: []string{"b1", "b2"},
				Refusals: []cluster.SealRefusal{{Node: "b3", Error: "worker: no seal answer in time"}}},
			want: "recovery to epoch 4 waits for a sealed copy at the confirmed prefix (sealed: b1, b2); live copy b3 refused its seal: worker: no seal answer in time",
		},
	}
	for _, c := range cases {
		var got []Entry
		for _, e := range Judge(base.Refusals(c.refusals).Snapshot(), nil) {
			if e.Kind == RecoverySealRefused {
				got = append(got, e)
			}
		}
		if len(got) != 1 || got[0].Node != "b3" || got[0].Stream != "s" || got[0].Reason != c.want {
			t.Errorf("%s: entries %+v\nwant reason %q", c.name, got, c.want)
		}
	}
}

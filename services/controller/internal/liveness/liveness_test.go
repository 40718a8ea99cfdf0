package liveness

import (
	"slices"
	"testing"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
)

func TestReplenish(t *testing.T) {
	majority := cluster.Policy{Name: cluster.MajorityDurable}
	asg := func(p cluster.Policy, owner string, followers ...string) cluster.Assignment {
		return cluster.Assignment{Stream: "s", Epoch: 2, Owner: owner, Followers: followers, Policy: p}
	}
	sealed := func(rt uint64) cluster.CopyTails {
		return cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, RecordTail: rt}
	}
	cases := []struct {
		name   string
		snap   *state.Snapshot
		a      cluster.Assignment
		copies int
		down   []string
		want   []string
	}{
		{
			name: "old owner back: rejoins (majority 2 -> 3 keeps W)",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b1", "s", sealed(9)).Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 3, want: []string{"b1"},
		},
		{
			name: "returning copy preferred over a fresh broker, furthest first",
			snap: state.Build().Live("a0", "b1", "b2", "b3", "b4").Tails("b1", "s", sealed(5)).Tails("b4", "s", sealed(9)).Snapshot(),
			a:    asg(cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}, "b2"), copies: 3, want: []string{"b4", "b1"},
		},
		{
			name: "fresh broker by placement when none returns",
			snap: state.Build().Live("b2", "b3", "b9").Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 3, want: []string{"b9"},
		},
		{
			name: "stops where W would rise (majority 3 -> 4)",
			snap: state.Build().Live("b1", "b2", "b3", "b4", "b5").Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 5, want: []string{"b1"},
		},
		{
			name: "a returning copy whose broker is not live is not added",
			snap: state.Build().Live("b2", "b3").Tails("b1", "s", sealed(9)).Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 3,
		},
		{
			name: "a killed owner whose lease has not ended yet is not added back, nor placed",
			snap: state.Build().Live("b1", "b2", "b3").Stream(asg(majority, "b2", "b3")).
				Tails("b1", "s", cluster.CopyTails{Epoch: 1, Role: cluster.RoleOwner, RecordTail: 9}).StaleHeartbeat("b1").Snapshot(),
			a: asg(majority, "b2", "b3"), copies: 3,
		},
		{
			name: "the same owner back and heard from after the assignment rejoins",
			snap: state.Build().Live("b1", "b2", "b3").Stream(asg(majority, "b2", "b3")).
				Tails("b1", "s", sealed(9)).Snapshot(),
			a: asg(majority, "b2", "b3"), copies: 3, want: []string{"b1"},
		},
		{
			name: "a broker found not serving is neither added back nor placed",
			snap: state.Build().Live("b1", "b2", "b3", "b9").Tails("b1", "s", sealed(9)).Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 3, down: []string{"b1", "b9"},
		},
		{
			name: "placement passes over a broker found not serving",
			snap: state.Build().Live("b2", "b3", "b8", "b9").Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 3, down: []string{"b8"}, want: []string{"b9"},
		},
		{
			name: "zones: the fresh broker is in the zone no member covers",
			snap: state.Build().Live("b2", "b3", "b4", "b9").Zone("a", "b2", "b4").Zone("b", "b3").Zone("c", "b9").Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 3, want: []string{"b9"},
		},
		{
			name: "zones: a silent broker covers no zone (and is not placed)",
			snap: state.Build().Live("b2", "b3", "b4", "b5", "b6").Zone("a", "b2", "b4").Zone("b", "b3").Zone("c", "b5", "b6").
				Stream(asg(majority, "b2", "b3")).Tails("b5", "s", cluster.CopyTails{Epoch: 1, Role: cluster.RoleOwner, RecordTail: 9}).StaleHeartbeat("b5").Snapshot(),
			a: asg(majority, "b2", "b3"), copies: 3, want: []string{"b6"},
		},
		{
			name: "at its copies: nothing",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b1", "s", sealed(9)).Snapshot(),
			a:    asg(majority, "b2", "b3"), copies: 2,
		},
	}
	for _, c := range cases {
		next, added, _ := Replenish(c.snap, c.a, c.copies, c.down)
		if !slices.Equal(added, c.want) {
			t.Errorf("%s: added %v, want %v", c.name, added, c.want)
			continue
		}
		if next.Epoch != c.a.Epoch || next.Owner != c.a.Owner || !slices.Equal(next.Followers, append(slices.Clone(c.a.Followers), c.want...)) {
			t.Errorf("%s: next %+v", c.name, next)
		}
		if len(added) > 0 && !cluster.IsFastPath(c.a, next) {
			t.Errorf("%s: replenished assignment is not a fast-path change", c.name)
		}
	}
}

func TestSuspecting(t *testing.T) {
	a := cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b1", Followers: []string{"b2", "b3", "b4"}}
	s := state.Build().Live("b1", "b2", "b3", "b4", "b5").
		Tails("b2", "s", cluster.CopyTails{Epoch: 4, Suspect: "b1"}).
		Tails("b3", "s", cluster.CopyTails{Epoch: 3, Suspect: "b1"}). // an older epoch's report
		Tails("b4", "s", cluster.CopyTails{Epoch: 4, Suspect: "b0"}). // another owner
		Tails("b5", "s", cluster.CopyTails{Epoch: 4, Suspect: "b1"}). // not a member
		Snapshot()
	if got := Suspecting(s, a); !slices.Equal(got, []string{"b2"}) {
		t.Fatalf("Suspecting = %v, want [b2]", got)
	}
}

func TestOwnerStandsDown(t *testing.T) {
	a := cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b1", Followers: []string{"b2", "b3"}}
	cases := []struct {
		name  string
		tails cluster.CopyTails
		node  string
		want  bool
	}{
		{"owner names itself at the epoch", cluster.CopyTails{Epoch: 4, Suspect: "b1"}, "b1", true},
		{"an older epoch's report", cluster.CopyTails{Epoch: 3, Suspect: "b1"}, "b1", false},
		{"owner names nobody", cluster.CopyTails{Epoch: 4, Role: cluster.RoleOwner}, "b1", false},
		{"a follower names the owner (eager failover, probed first)", cluster.CopyTails{Epoch: 4, Suspect: "b1"}, "b2", false},
		{"owner names another node", cluster.CopyTails{Epoch: 4, Suspect: "b2"}, "b1", false},
	}
	for _, c := range cases {
		s := state.Build().Live("b1", "b2", "b3").Tails(c.node, "s", c.tails).Snapshot()
		if got := OwnerStandsDown(s, a); got != c.want {
			t.Errorf("%s: OwnerStandsDown = %v, want %v", c.name, got, c.want)
		}
	}
}

// Under local_durable a returning old owner raises W (2 -> 3 copies): it is
// not a fast-path addition, so Replenish reports it blocked and the loop
// restores it through a recovery.
func TestReplenishBlockedWhereWRises(t *testing.T) {
	local := cluster.Policy{Name: cluster.LocalDurable}
	a := cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b2", Followers: []string{"b3"}, Policy: local}
	snap := state.Build().Live("b1", "b2", "b3").Stream(a).
		Tails("b1", "s", cluster.CopyTails{Epoch: 1, Role: cluster.RoleSealed, RecordTail: 9}).Snapshot()
	_, added, blocked := Replenish(snap, a, 3, nil)
	if len(added) != 0 || !slices.Equal(blocked, []string{"b1"}) {
		t.Fatalf("added %v blocked %v, want none added and [b1] blocked", added, blocked)
	}
}

// A member sealed past the assignment's epoch with no recovery pending is
// left over from a withdrawn recovery; copies sealed at the assignment's
// epoch (a committed recovery) or left out of the assignment are not.
func TestSealedPast(t *testing.T) {
	a := cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b1", Followers: []string{"b2", "b3"}}
	sealedAt := func(e uint64) cluster.CopyTails {
		return cluster.CopyTails{Epoch: e, Role: cluster.RoleSealed, SealEpoch: e}
	}
	cases := []struct {
		name      string
		snap      *state.Snapshot
		wantFence uint64
		wantBy    []string
	}{
		{
			name:      "every copy sealed at the next epoch (failover withdrawn before it committed)",
			snap:      state.Build().Live("b1", "b2", "b3").Tails("b1", "s", sealedAt(5)).Tails("b2", "s", sealedAt(5)).Tails("b3", "s", sealedAt(5)).Snapshot(),
			wantFence: 5, wantBy: []string{"b1", "b2", "b3"},
		},
		{
			name: "one follower sealed, the others serving",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b1", "s", cluster.CopyTails{Epoch: 4, Role: cluster.RoleOwner}).
				Tails("b3", "s", sealedAt(5)).Snapshot(),
			wantFence: 5, wantBy: []string{"b3"},
		},
		{
			name:      "the highest fence epoch",
			snap:      state.Build().Live("b1", "b2", "b3").Tails("b1", "s", sealedAt(5)).Tails("b2", "s", sealedAt(6)).Snapshot(),
			wantFence: 6, wantBy: []string{"b1", "b2"},
		},
		{
			name: "sealed at the assignment's epoch: a committed recovery not applied yet",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b1", "s", sealedAt(4)).Tails("b2", "s", sealedAt(4)).Snapshot(),
		},
		{
			name: "sealed below the assignment's epoch",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b2", "s", sealedAt(3)).Snapshot(),
		},
		{
			name: "a copy left out of the assignment stays sealed by design",
			snap: state.Build().Live("b1", "b2", "b3", "b4").Tails("b4", "s", sealedAt(5)).Snapshot(),
		},
		{
			name: "serving copies",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b1", "s", cluster.CopyTails{Epoch: 4, Role: cluster.RoleOwner}).
				Tails("b2", "s", cluster.CopyTails{Epoch: 4, Role: cluster.RoleFollower}).Snapshot(),
		},
	}
	for _, c := range cases {
		fence, by := SealedPast(c.snap, a)
		if fence != c.wantFence || !slices.Equal(by, c.wantBy) {
			t.Errorf("%s: SealedPast = %d %v, want %d %v", c.name, fence, by, c.wantFence, c.wantBy)
		}
	}
}

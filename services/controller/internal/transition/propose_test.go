package transition

import (
	"errors"
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

func TestProposeRecovery(t *testing.T) {
	cases := []struct {
		name         string
		snap         *state.Snapshot
		lost         []string
		wantProposed string
		wantErr      error
	}{
		{
			name: "furthest live follower; the spare is not added: the lost owner stays, to rejoin",
			snap: state.Build().Live("b2", "b3", "b4").Stream(asg("b1", "b2", "b3")).
				Tails("b2", "s", cluster.CopyTails{RecordTail: 4}).Tails("b3", "s", cluster.CopyTails{RecordTail: 6}).Snapshot(),
			wantProposed: "b3",
		},
		{
			name: "no spare: nothing added",
			snap: state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).
				Tails("b2", "s", cluster.CopyTails{RecordTail: 6, CursorEventTail: 2}).Tails("b3", "s", cluster.CopyTails{RecordTail: 6, CursorEventTail: 1}).Snapshot(),
			wantProposed: "b2",
		},
		{
			name: "owner lost by probe while its key is present: not replaced",
			snap: state.Build().Live("b1", "b2", "b3", "b4", "b5").Stream(asg("b1", "b2", "b3")).Snapshot(),
			lost: []string{"b1"}, wantProposed: "b2",
		},
		{
			name: "a dead follower is not proposed, and not replaced here",
			snap: state.Build().Live("b3", "b4", "b5").Stream(asg("b1", "b2", "b3")).
				Tails("b3", "s", cluster.CopyTails{RecordTail: 1}).Snapshot(),
			wantProposed: "b3",
		},
		{
			name:         "no live follower: lowest follower proposed, the recovery waits",
			snap:         state.Build().Live("b9").Stream(asg("b1", "b3", "b2")).Snapshot(),
			wantProposed: "b2",
		},
		{
			name:    "single copy",
			snap:    state.Build().Live("b2").Stream(asg("b1")).Snapshot(),
			wantErr: ErrSingleCopy,
		},
		{
			name:    "already pending",
			snap:    state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Recovery(cluster.Recovery{Stream: "s"}).Snapshot(),
			wantErr: ErrPending,
		},
	}
	for _, c := range cases {
		rec, err := ProposeRecovery(c.snap, "s", c.lost, "why")
		if !errors.Is(err, c.wantErr) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		a := c.snap.Assignments["s"].Value
		if rec.ProposedOwner != c.wantProposed || len(rec.AddedMembers) != 0 || len(rec.RemovedMembers) != 0 ||
			rec.FromEpoch != 3 || rec.FenceEpoch != 4 || rec.OldOwner != a.Owner || !slices.Equal(rec.OldFollowers, a.Followers) ||
			rec.Policy != majority || rec.Reason != "why" || rec.Copies != a.Copies() {
			t.Errorf("%s: got %+v, want proposed %s, nothing added or removed", c.name, rec, c.wantProposed)
		}
	}
}

func TestAcceptLoss(t *testing.T) {
	cases := []struct {
		name      string
		snap      *state.Snapshot
		node      string
		wantOwner string
		wantEpoch uint64
		wantFoll  []string
		wantStart *cluster.HistoryStart
		wantErr   error
	}{
		{
			name: "chosen copy: start from its heartbeat tails at the new epoch",
			snap: state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).
				Tails("b3", "s", cluster.CopyTails{Epoch: 3, RecordTail: 40, CursorEventTail: 2}).Snapshot(),
			node: "b3", wantOwner: "b3", wantEpoch: 4, wantFoll: []string{"b2"},
			wantStart: &cluster.HistoryStart{Epoch: 4, RecordTail: 40, CursorEventTail: 2, Node: "b3"},
		},
		{
			name: "best live copy picked",
			snap: state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).
				Tails("b2", "s", cluster.CopyTails{RecordTail: 50}).Tails("b3", "s", cluster.CopyTails{RecordTail: 40}).Snapshot(),
			wantOwner: "b2", wantEpoch: 4, wantFoll: []string{"b3"},
			wantStart: &cluster.HistoryStart{Epoch: 4, RecordTail: 50, Node: "b2"},
		},
		{
			name:      "published nothing: no start",
			snap:      state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Heartbeat("b2").Snapshot(),
			node:      "b2",
			wantOwner: "b2", wantEpoch: 4, wantFoll: []string{"b3"},
		},
		{
			name: "past a pending recovery's fence epoch",
			snap: state.Build().Live("b2").Stream(asg("b1", "b2")).
				Recovery(cluster.Recovery{Stream: "s", FromEpoch: 3, FenceEpoch: 4}).Snapshot(),
			wantOwner: "b2", wantEpoch: 4, wantFoll: []string{},
		},
		{
			name:      "single copy moves to a live broker, empty",
			snap:      state.Build().Live("b7").Stream(asg("b1")).Snapshot(),
			wantOwner: "b7", wantEpoch: 4, wantFoll: []string{},
		},
		{
			name:    "owner live",
			snap:    state.Build().Live("b1", "b2").Stream(asg("b1", "b2")).Snapshot(),
			wantErr: ErrOwnerLive,
		},
		{
			name:    "chosen node down",
			snap:    state.Build().Live("b3").Stream(asg("b1", "b2", "b3")).Snapshot(),
			node:    "b2",
			wantErr: ErrNotLive,
		},
		{
			name:    "chosen node holds no copy",
			snap:    state.Build().Live("b2", "b9").Stream(asg("b1", "b2")).Snapshot(),
			node:    "b9",
			wantErr: ErrNotCopy,
		},
		{
			name:    "nothing live",
			snap:    state.Build().Stream(asg("b1", "b2")).Snapshot(),
			wantErr: ErrNoCandidate,
		},
		{
			name:    "unknown stream",
			snap:    state.Build().Snapshot(),
			wantErr: ErrNoStream,
		},
	}
	for _, c := range cases {
		out, err := AcceptLoss(c.snap, "s", c.node)
		if !errors.Is(err, c.wantErr) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		a := out.Assignment
		if a.Owner != c.wantOwner || a.Epoch != c.wantEpoch || !slices.Equal(a.Followers, c.wantFoll) && len(a.Followers)+len(c.wantFoll) > 0 {
			t.Errorf("%s: assignment %+v, want owner %s epoch %d followers %v", c.name, a, c.wantOwner, c.wantEpoch, c.wantFoll)
		}
		switch {
		case (out.Start == nil) != (c.wantStart == nil):
			t.Errorf("%s: start %+v, want %+v", c.name, out.Start, c.wantStart)
		case out.Start != nil && *out.Start != *c.wantStart:
			t.Errorf("%s: start %+v, want %+v", c.name, *out.Start, *c.wantStart)
		}
	}
}

// The streams of a lost owner, their followers tied, are proposed to the
// survivors in turn by the streams each owns, counting the proposals of
// the same pass and the pending recoveries of earlier ones (CountProposals): not
// all to the follower whose id sorts first. A follower ahead is still
// proposed whatever it owns.
func TestProposalsSpreadTiedStreamsOverTheSurvivors(t *testing.T) {
	b := state.Build().Live("b2", "b3")
	var names []string
	for i := range 12 {
		name := fmt.Sprintf("s%02d", i)
		names = append(names, name)
		a := cluster.Assignment{Stream: name, Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}
		b.Stream(a).Tails("b2", name, cluster.CopyTails{RecordTail: 5}).Tails("b3", name, cluster.CopyTails{RecordTail: 5})
	}
	// One stream's b3 is ahead; and b2 already owns two other streams.
	b.Tails("b3", "s11", cluster.CopyTails{RecordTail: 6})
	b.Stream(cluster.Assignment{Stream: "o1", Epoch: 1, Owner: "b2", Followers: []string{"b3"}, Policy: majority})
	b.Stream(cluster.Assignment{Stream: "o2", Epoch: 1, Owner: "b2", Followers: []string{"b3"}, Policy: majority})
	// An earlier pass proposed b3 for a recovery still pending.
	b.Stream(cluster.Assignment{Stream: "p1", Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority})
	b.Recovery(cluster.Recovery{Stream: "p1", FromEpoch: 1, FenceEpoch: 2, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b3"})
	s := b.Snapshot()

	load := LoadOf(s)
	if load.Owned["b3"] != 0 {
		t.Fatalf("LoadOf counted a pending proposal: %v; it counts assignments only", load.Owned)
	}
	CountProposals(s, load)
	if load.Owned["b2"] != 2 || load.Owned["b3"] != 1 {
		t.Fatalf("owned before the pass %v, want b2 2 (its streams) and b3 1 (a pending proposal)", load.Owned)
	}
	proposed := map[string]int{}
	for _, name := range names {
		rec, err := ProposeRecoveryWith(s, load, name, nil, "owner lost")
		if err != nil {
			t.Fatal(err)
		}
		if name == "s11" && rec.ProposedOwner != "b3" {
			t.Fatalf("s11 proposed to %s, want b3, the furthest", rec.ProposedOwner)
		}
		proposed[rec.ProposedOwner]++
	}
	// b2 from 2, b3 from 1 and s11 to b3 whatever: they alternate from
	// the first tie, b2 ending with 7 and b3 with 8.
	if proposed["b2"] != 5 || proposed["b3"] != 7 {
		t.Fatalf("proposed %v, want b2 5 and b3 7", proposed)
	}
	// Without a load (ProposeRecovery), ties go by node id as before.
	rec, err := ProposeRecovery(s, "s00", nil, "owner lost")
	if err != nil || rec.ProposedOwner != "b2" {
		t.Fatalf("ProposeRecovery: %+v, %v; want b2", rec, err)
	}
}

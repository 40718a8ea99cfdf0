package transition

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// The replacement decision: since when each member is missing, the
// replace-after window, the candidates placement finds, and what happens
// without one (docs/protocol.md, "Replacing a missing copy").
func TestReplacementDecisionTable(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)
	after := 10 * time.Minute
	local := cluster.Policy{Name: cluster.LocalDurable}
	withPolicy := func(p cluster.Policy, owner string, followers ...string) cluster.Assignment {
		a := asg(owner, followers...)
		a.Policy = p
		return a
	}
	cases := []struct {
		name     string
		snap     *state.Snapshot
		since    map[string]time.Time
		now      time.Time
		wantPlan string // node:atOnce:at, space separated
		wantRm   []string
		wantAdd  []string
		wantWait []string
		fastPath bool
		shrink   bool // as for a lost owner's recovery
	}{
		{
			name:     "missing within the window: planned, not replaced",
			snap:     state.Build().Live("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0.Add(after - time.Second),
			wantPlan: "b3:false:07:10:00",
		},
		{
			name:     "missing past the window: replaced by the spare",
			snap:     state.Build().Live("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0.Add(after),
			wantPlan: "b3:false:07:10:00",
			wantRm:   []string{"b3"}, wantAdd: []string{"b4"},
		},
		{
			name:     "never seen missing: the clock starts now",
			snap:     state.Build().Live("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Snapshot(),
			now:      t0,
			wantPlan: "b3:false:07:10:00",
		},
		{
			name:     "past the window, no live broker without a copy: waits",
			snap:     state.Build().Live("b1", "b2").Stream(asg("b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0.Add(time.Hour),
			wantPlan: "b3:false:07:10:00",
			wantWait: []string{"b3"},
		},
		{
			name: "a broker holding a left-out copy is no candidate",
			snap: state.Build().Live("b1", "b2", "b4").Tails("b4", "s", cluster.CopyTails{RecordTail: 3}).
				Stream(asg("b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0.Add(time.Hour),
			wantPlan: "b3:false:07:10:00",
			wantWait: []string{"b3"},
		},
		{
			name:     "two missing, one spare: the earliest missing is replaced first",
			snap:     state.Build().Live("b1", "b2", "b4", "b6").Stream(asg("b1", "b2", "b3", "b4", "b5")).Snapshot(),
			since:    map[string]time.Time{"b3": t0.Add(time.Minute), "b5": t0},
			now:      t0.Add(time.Hour),
			wantPlan: "b5:false:07:10:00 b3:false:07:11:00",
			wantRm:   []string{"b5"}, wantAdd: []string{"b6"},
			wantWait: []string{"b3"},
		},
		{
			name:     "cannot confirm (local_durable): replaced at once",
			snap:     state.Build().Live("b1", "b2", "b4").Stream(withPolicy(local, "b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0.Add(time.Second),
			wantPlan: "b3:true:07:00:00",
			wantRm:   []string{"b3"}, wantAdd: []string{"b4"},
			// W 3 -> 3 with one removed: needs a seal.
		},
		{
			name:     "cannot confirm, no candidate: waits",
			snap:     state.Build().Live("b1", "b2").Stream(withPolicy(local, "b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0,
			wantPlan: "b3:true:07:00:00",
			wantWait: []string{"b3"},
		},
		{
			// A lost owner's recovery shrinks: W 3 -> 2 <= 3 - 1 lets the
			// live copies confirm.
			name:     "cannot confirm, no candidate, lost owner's recovery: removed all the same",
			snap:     state.Build().Live("b1", "b2").Stream(withPolicy(local, "b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b3": t0},
			now:      t0,
			wantPlan: "b3:true:07:00:00",
			wantRm:   []string{"b3"},
			fastPath: true,
			shrink:   true,
		},
		{
			name:     "majority of three with two missing, one spare: one replaced, one waits",
			snap:     state.Build().Live("b1", "b9").Stream(asg("b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b2": t0, "b3": t0},
			now:      t0,
			wantPlan: "b2:true:07:00:00 b3:true:07:00:00",
			wantRm:   []string{"b2"}, wantAdd: []string{"b9"},
			wantWait: []string{"b3"},
		},
		{
			name:     "majority of three with two missing, lost owner's recovery: both removed",
			snap:     state.Build().Live("b1", "b9").Stream(asg("b1", "b2", "b3")).Snapshot(),
			since:    map[string]time.Time{"b2": t0, "b3": t0},
			now:      t0,
			wantPlan: "b2:true:07:00:00 b3:true:07:00:00",
			wantRm:   []string{"b2", "b3"}, wantAdd: []string{"b9"},
			shrink: true,
		},
		{
			name: "nothing missing",
			snap: state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(),
			now:  t0,
		},
		{
			name: "single copy: nothing to replace from",
			snap: state.Build().Live("b9").Stream(asg("b1")).Snapshot(),
			now:  t0,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.snap.Assignments["s"].Value
			plans := PlanReplacements(c.snap, a, func(n string) time.Time { return c.since[n] }, after, c.now)
			var got []string
			for _, p := range plans {
				got = append(got, p.Node+":"+map[bool]string{true: "true", false: "false"}[p.AtOnce]+":"+p.At.Format("15:04:05"))
			}
			if g := strings.Join(got, " "); g != c.wantPlan {
				t.Fatalf("plans %q, want %q", g, c.wantPlan)
			}
			due := 0
			for _, p := range plans {
				if p.Due(c.now) {
					due++
				}
			}
			cands := ReplacementCandidates(c.snap, LoadOf(c.snap), a, due, nil)
			d := DecideReplacement(a, plans, cands, c.now, c.shrink)
			if !slices.Equal(d.Remove, c.wantRm) || !slices.Equal(d.Add, c.wantAdd) || !slices.Equal(d.Waiting, c.wantWait) || d.FastPath != c.fastPath {
				t.Fatalf("remove %v add %v waiting %v fast path %v; want %v %v %v %v", d.Remove, d.Add, d.Waiting, d.FastPath, c.wantRm, c.wantAdd, c.wantWait, c.fastPath)
			}
			for _, r := range d.Remove {
				if d.Next.Includes(r) {
					t.Fatalf("next %+v still includes removed %s", d.Next, r)
				}
			}
			for _, n := range d.Add {
				if !slices.Contains(d.Next.Followers, n) || a.Includes(n) {
					t.Fatalf("next %+v: added %s not a new follower", d.Next, n)
				}
			}
		})
	}
}

// The replacement recovery keeps the live owner as its proposal, removes
// the missing member, adds the replacement and bounds the copies.
func TestProposeReplacement(t *testing.T) {
	snap := state.Build().Live("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Snapshot()
	a := snap.Assignments["s"].Value
	d := ReplaceDecision{Remove: []string{"b3"}, Add: []string{"b4"}}
	rec, err := ProposeReplacement(snap, "s", d, "replace: b3")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ProposedOwner != "b1" || !slices.Equal(rec.RemovedMembers, []string{"b3"}) || !slices.Equal(rec.AddedMembers, []string{"b4"}) ||
		rec.Copies != 3 || rec.FromEpoch != a.Epoch || rec.FenceEpoch != a.Epoch+1 || rec.OldOwner != "b1" || !slices.Equal(rec.OldFollowers, a.Followers) ||
		!strings.HasPrefix(rec.Reason, ReasonReplace) {
		t.Fatalf("recovery %+v", rec)
	}
	dead := state.Build().Live("b2", "b4").Stream(asg("b1", "b2", "b3")).Snapshot()
	if _, err := ProposeReplacement(dead, "s", d, "replace"); err == nil {
		t.Fatal("owner not live: want an error, its own recovery goes first")
	}
	pending := state.Build().Live("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Recovery(cluster.Recovery{Stream: "s"}).Snapshot()
	if _, err := ProposeReplacement(pending, "s", d, "replace"); err == nil {
		t.Fatal("recovery pending: want ErrPending")
	}
}

// A drain's decision and recovery come from the replacement's: the
// draining follower is drained (left out even if it answers its seal), not
// removed, the first candidate is added, and the rest of the recovery is
// ProposeReplacement's; without a candidate nothing is added.
func TestDecideDrainRecovery(t *testing.T) {
	snap := state.Build().Live("b1", "b2", "b3", "b4").Drain("b3").Stream(asg("b1", "b2", "b3")).Snapshot()
	a := snap.Assignments["s"].Value
	d := DecideDrain(a, "b3", ReplacementCandidates(snap, LoadOf(snap), a, 1, nil))
	if d.FastPath || len(d.Remove) != 0 || !slices.Equal(d.Drain, []string{"b3"}) || !slices.Equal(d.Add, []string{"b4"}) ||
		!slices.Equal(d.Next.Followers, []string{"b2", "b4"}) {
		t.Fatalf("decision %+v", d)
	}
	rec, err := ProposeReplacement(snap, "s", d, "drain")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ProposedOwner != "b1" || len(rec.RemovedMembers) != 0 || !slices.Equal(rec.DrainedMembers, []string{"b3"}) ||
		!slices.Equal(rec.AddedMembers, []string{"b4"}) || rec.Copies != 3 || rec.FenceEpoch != a.Epoch+1 || rec.Reason != "drain" {
		t.Fatalf("recovery %+v", rec)
	}
	if d := DecideDrain(a, "b3", nil); len(d.Add) != 0 || !slices.Equal(d.Next.Followers, []string{"b2"}) {
		t.Fatalf("no candidate: decision %+v", d)
	}
}

// A replacement keeps the stream's spread over zones: the dead member's
// zone is the one no live member covers, and a live broker holding a copy
// outside the assignment covers none (docs/architecture.md, "Placement and
// zones").
func TestReplacementCandidatesKeepZones(t *testing.T) {
	asg := func(owner string, followers ...string) cluster.Assignment {
		return cluster.Assignment{Stream: "s", Epoch: 1, Owner: owner, Followers: followers, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
	}
	for _, tc := range []struct {
		name string
		snap *state.Snapshot
		down []string
		want []string
	}{
		{
			name: "a dead owner's zone is taken again",
			snap: state.Build().Live("b2", "b3", "b4", "b5").Zone("a", "b5").Zone("b", "b2", "b4").Zone("c", "b3").
				Stream(asg("b1", "b2", "b3")).Heartbeat("b4").Heartbeat("b5").Snapshot(),
			// By load and id alone b4 (zone b, covered by b2) comes first.
			want: []string{"b5"},
		},
		{
			name: "a member lost by probe covers no zone",
			snap: state.Build().Live("b1", "b2", "b3", "b4", "b5").Zone("a", "b1", "b5").Zone("b", "b2", "b4").Zone("c", "b3").
				Stream(asg("b1", "b2", "b3")).Heartbeat("b4").Heartbeat("b5").Snapshot(),
			down: []string{"b1"},
			want: []string{"b5"},
		},
		{
			name: "no zones: by load and id",
			snap: state.Build().Live("b2", "b3", "b4", "b5").Stream(asg("b1", "b2", "b3")).Heartbeat("b4").Heartbeat("b5").Snapshot(),
			want: []string{"b4"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.snap.Assignments["s"].Value
			got := ReplacementCandidates(tc.snap, LoadOf(tc.snap), a, 1, tc.down)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("candidates %v, want %v", got, tc.want)
			}
		})
	}
}

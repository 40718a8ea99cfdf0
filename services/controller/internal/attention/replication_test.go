package attention

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// at is a copy's tails at the assignment's epoch (asg's, 3).
func at(role string, rt, wm uint64) cluster.CopyTails {
	return cluster.CopyTails{Epoch: 3, Role: role, RecordTail: rt, ConfirmWatermark: wm}
}

// healthy publishes tails for every copy of asg("b1", "b2", "b3").
func healthy(live ...string) *state.Builder {
	return state.Build().Live(live...).
		Tails("b1", "s", at(cluster.RoleOwner, 100, 90)).
		Tails("b2", "s", at(cluster.RoleFollower, 100, 0)).
		Tails("b3", "s", at(cluster.RoleFollower, 95, 0))
}

// withCopies sets the spec's copies E apart from the assignment's.
func withCopies(s *state.Snapshot, copies int) *state.Snapshot {
	spec := s.Streams["s"]
	spec.Value.Copies = copies
	s.Streams["s"] = spec
	return s
}

func TestJudgeReplication(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	// A memory that saw b1 down as owner at t0, then a failover that left
	// it out: epoch 3's assignment is b2, b3.
	failedOver := func() *Memory {
		m := NewMemory()
		before := state.Build().Live("b2", "b3").Stream(cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}).Snapshot()
		m.Observe(before, t0)
		return m
	}
	cases := []struct {
		name  string
		snap  *state.Snapshot
		mem   func() *Memory
		want  string // copies as node:state[:lag], then in-sync/E
		under bool
	}{
		{
			name: "all fine",
			snap: healthy("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(),
			want: "b1:in_sync:0 b2:in_sync:0 b3:in_sync:5 3/3",
		},
		{
			name:  "dead follower: down, its lag unknown",
			snap:  state.Build().Live("b1", "b2").Tails("b1", "s", at(cluster.RoleOwner, 100, 90)).Tails("b2", "s", at(cluster.RoleFollower, 100, 0)).Stream(asg("b1", "b2", "b3")).Snapshot(),
			want:  "b1:in_sync:0 b2:in_sync:0 b3:down:? 2/3",
			under: true,
		},
		{
			name: "dead owner after a failover that left it out, named from memory",
			snap: withCopies(state.Build().Live("b2", "b3").Tails("b2", "s", at(cluster.RoleOwner, 100, 100)).Tails("b3", "s", at(cluster.RoleFollower, 100, 0)).
				Stream(asg("b2", "b3")).Snapshot(), 3),
			mem:   failedOver,
			want:  "b2:in_sync:0 b3:in_sync:0 b1:missing:? 2/3",
			under: true,
		},
		{
			name: "dead owner left out before this controller led: an unnamed slot",
			snap: withCopies(state.Build().Live("b2", "b3").Tails("b2", "s", at(cluster.RoleOwner, 100, 100)).Tails("b3", "s", at(cluster.RoleFollower, 100, 0)).
				Stream(asg("b2", "b3")).Snapshot(), 3),
			want:  "b2:in_sync:0 b3:in_sync:0 -:missing:? 2/3",
			under: true,
		},
		{
			name:  "lagging copy: further behind the watermark than the slack",
			snap:  healthy("b1", "b2", "b3").Tails("b1", "s", at(cluster.RoleOwner, 5000, 4500)).Tails("b2", "s", at(cluster.RoleFollower, 5000, 0)).Tails("b3", "s", at(cluster.RoleFollower, 3000, 0)).Stream(asg("b1", "b2", "b3")).Snapshot(),
			want:  "b1:in_sync:0 b2:in_sync:0 b3:lagging:2000 2/3",
			under: true,
		},
		{
			name: "below the watermark within the slack: in sync",
			snap: healthy("b1", "b2", "b3").Tails("b1", "s", at(cluster.RoleOwner, 5000, 4500)).Tails("b2", "s", at(cluster.RoleFollower, 5000, 0)).Tails("b3", "s", at(cluster.RoleFollower, 4001, 0)).Stream(asg("b1", "b2", "b3")).Snapshot(),
			want: "b1:in_sync:0 b2:in_sync:0 b3:in_sync:999 3/3",
		},
		{
			name:  "copy still at an older epoch",
			snap:  healthy("b1", "b2", "b3").Tails("b3", "s", cluster.CopyTails{Epoch: 2, Role: cluster.RoleFollower, RecordTail: 100}).Stream(asg("b1", "b2", "b3")).Snapshot(),
			want:  "b1:in_sync:0 b2:in_sync:0 b3:lagging:0 2/3",
			under: true,
		},
		{
			name: "copies sealed past the assignment for a recovery hold their records: in sync",
			snap: state.Build().Live("b1", "b2", "b3").Tails("b1", "s", tails(100)).Tails("b2", "s", tails(100)).Tails("b3", "s", tails(100)).
				Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).Snapshot(),
			want: "b1:in_sync:0 b2:in_sync:0 b3:in_sync:0 3/3",
		},
		{
			name: "a single copy down is single_copy_owner_down, not under-replicated",
			snap: state.Build().Live("b2").Stream(asg("b1")).Snapshot(),
			want: "b1:down:? 0/1",
		},
		{
			name: "a smaller E than the assignment's copies (shrinking): not under-replicated",
			snap: withCopies(healthy("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(), 2),
			want: "b1:in_sync:0 b2:in_sync:0 b3:in_sync:5 3/2",
		},
	}
	for _, c := range cases {
		var mem *Memory
		if c.mem != nil {
			mem = c.mem()
			mem.Observe(c.snap, t0.Add(time.Second))
		}
		r, ok := JudgeReplication(c.snap, "s", mem)
		if !ok {
			t.Fatalf("%s: no judgement", c.name)
		}
		var got []string
		for _, cp := range append(r.Members, r.Missing...) {
			lag := "?"
			if cp.LagKnown {
				lag = fmt.Sprint(cp.Lag)
			}
			node := cp.Node
			if node == "" {
				node = "-"
			}
			got = append(got, node+":"+cp.State+":"+lag)
		}
		got = append(got, fmt.Sprintf("%d/%d", r.InSync, r.Copies))
		if g := strings.Join(got, " "); g != c.want || r.Under() != c.under {
			t.Errorf("%s:\n got %s under=%v\nwant %s under=%v", c.name, g, r.Under(), c.want, c.under)
		}
		under := 0
		for _, e := range JudgeStream(c.snap, "s", mem) {
			if e.Kind == UnderReplicated {
				under++
			}
		}
		if want := map[bool]int{true: 1, false: 0}[c.under]; under != want {
			t.Errorf("%s: %d under_replicated entries, want %d", c.name, under, want)
		}
		if sum := NewMemory().Observe(c.snap, t0); (sum.UnderReplicated == 1) != c.under {
			t.Errorf("%s: Observe counted %d under-replicated streams", c.name, sum.UnderReplicated)
		}
	}
}

// The entry names what is missing, since when, and what the controller
// will do about it.
func TestUnderReplicatedEntry(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	deadFollower := func(live ...string) *state.Builder {
		return state.Build().Live(live...).Tails("b1", "s", at(cluster.RoleOwner, 100, 90)).Tails("b2", "s", at(cluster.RoleFollower, 100, 0))
	}
	afterFailover := func(live ...string) *state.Snapshot {
		return withCopies(state.Build().Live(live...).Tails("b2", "s", at(cluster.RoleOwner, 100, 100)).Tails("b3", "s", at(cluster.RoleFollower, 100, 0)).
			Stream(asg("b2", "b3")).Snapshot(), 3)
	}
	cases := []struct {
		name    string
		before  *state.Snapshot // observed at t0, when given
		snap    *state.Snapshot
		missing string
		reason  string
		action  string
		since   bool // since t0, when it was first seen
	}{
		{
			name:    "dead follower, seen down at t0",
			before:  deadFollower("b1", "b2").Stream(asg("b1", "b2", "b3")).Snapshot(),
			snap:    deadFollower("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Snapshot(),
			missing: "b3",
			reason:  "2 of 3 copies live and in sync at epoch 3; follower copy on b3 is down (since 2026-05-06T07:08:09Z)",
			action:  "b3 missing since 2026-05-06T07:08:09Z: replace at 2026-05-06T07:18:09Z, unless its broker returns first and it rejoins as a follower",
			since:   true,
		},
		{
			name:    "dead follower, no live broker without a copy",
			before:  deadFollower("b1", "b2").Stream(asg("b1", "b2", "b3")).Snapshot(),
			snap:    deadFollower("b1", "b2").Stream(asg("b1", "b2", "b3")).Snapshot(),
			missing: "b3",
			reason:  "2 of 3 copies live and in sync at epoch 3; follower copy on b3 is down (since 2026-05-06T07:08:09Z)",
			action:  "b3 missing since 2026-05-06T07:08:09Z: replace at 2026-05-06T07:18:09Z, once a live broker holds no copy (every live broker holds one now); it rejoins as a follower if its broker returns first",
			since:   true,
		},
		{
			// local_durable: W = E, so the two live copies cannot confirm.
			name:    "dead follower of a stream that cannot confirm without it",
			before:  deadFollower("b1", "b2").Stream(cluster.Assignment{Stream: "s", Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.LocalDurable}}).Snapshot(),
			snap:    deadFollower("b1", "b2", "b4").Stream(cluster.Assignment{Stream: "s", Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.LocalDurable}}).Snapshot(),
			missing: "b3",
			reason:  "2 of 3 copies live and in sync at epoch 3; follower copy on b3 is down (since 2026-05-06T07:08:09Z)",
			action:  "b3 missing since 2026-05-06T07:08:09Z: replacing now: the stream cannot confirm with its live members",
			since:   true,
		},
		{
			name:    "dead owner dropped by a failover, no live broker without a copy",
			before:  state.Build().Live("b2", "b3").Stream(cluster.Assignment{Stream: "s", Epoch: 2, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: majority}).Snapshot(),
			snap:    afterFailover("b2", "b3"),
			missing: "b1",
			reason:  "2 of 3 copies live and in sync at epoch 3; owner copy on b1 was left out of the assignment at epoch 3 (since 2026-05-06T07:08:09Z)",
			action:  "nothing: every live broker holds a copy already; one that registers, or a left-out copy whose broker comes back, is added on the fast path at the next pass",
			since:   true,
		},
		{
			name:   "dropped owner not known, a live broker without a copy",
			snap:   afterFailover("b2", "b3", "b4"),
			reason: "2 of 3 copies live and in sync at epoch 3; 1 not in the assignment (left out before this controller led)",
			action: "the controller adds followers on the fast path at its next pass (1 live brokers hold no copy; each is probed first)",
		},
		{
			name: "lagging follower",
			snap: healthy("b1", "b2", "b3").Tails("b1", "s", at(cluster.RoleOwner, 5000, 4500)).Tails("b2", "s", at(cluster.RoleFollower, 5000, 0)).
				Tails("b3", "s", at(cluster.RoleFollower, 3000, 0)).Stream(asg("b1", "b2", "b3")).Snapshot(),
			missing: "b3",
			reason:  "2 of 3 copies live and in sync at epoch 3; follower copy on b3 is 2000 records behind (since 2026-05-06T07:09:09Z)",
			action:  "nothing: a lagging copy (b3) catches up by following its owner; if its lag grows, look at its broker",
		},
		{
			name: "dead follower being replaced by a pending recovery",
			snap: deadFollower("b1", "b2", "b4").Stream(asg("b1", "b2", "b3")).Recovery(func() cluster.Recovery {
				r := rec("b1", "b2", "b3")
				r.RemovedMembers, r.AddedMembers = []string{"b3"}, []string{"b4"}
				return r
			}()).Snapshot(),
			missing: "b3",
			reason:  "2 of 3 copies live and in sync at epoch 3; follower copy on b3 is down (since 2026-05-06T07:09:09Z)",
			action:  "the pending recovery to epoch 4 goes first (see its entries); it keeps every copy it does not replace, and a returning copy rejoins as a follower; it replaces b3 with b4",
		},
		{
			name:    "dead owner with a pending recovery",
			snap:    state.Build().Live("b2", "b3").Tails("b2", "s", at(cluster.RoleFollower, 100, 0)).Tails("b3", "s", at(cluster.RoleFollower, 100, 0)).Stream(asg("b1", "b2", "b3")).Recovery(rec("b1", "b2", "b3")).Snapshot(),
			missing: "b1",
			reason:  "2 of 3 copies live and in sync at epoch 3; owner copy on b1 is down (since 2026-05-06T07:09:09Z)",
			action:  "the pending recovery to epoch 4 goes first (see its entries); it keeps every copy it does not replace, and a returning copy rejoins as a follower; after it: b1 missing since 2026-05-06T07:09:09Z: replace at 2026-05-06T07:19:09Z, once a live broker holds no copy (every live broker holds one now); it rejoins as a follower if its broker returns first",
		},
	}
	for _, c := range cases {
		mem := NewMemory()
		if c.before != nil {
			mem.Observe(c.before, t0)
		}
		mem.Observe(c.snap, t0.Add(time.Minute))
		var got []Entry
		for _, e := range Judge(c.snap, mem) {
			if e.Kind == UnderReplicated {
				got = append(got, e)
			}
		}
		if len(got) != 1 {
			t.Errorf("%s: %d under_replicated entries: %+v", c.name, len(got), got)
			continue
		}
		e := got[0]
		if strings.Join(e.Missing, ",") != c.missing || e.Reason != c.reason || e.Action != c.action || e.Since.Equal(t0) != c.since || e.Stream != "s" {
			t.Errorf("%s:\n got missing %v since %v\n  reason %q\n  action %q\nwant missing %s since t0=%v\n  reason %q\n  action %q",
				c.name, e.Missing, e.Since, e.Reason, e.Action, c.missing, c.since, c.reason, c.action)
		}
	}
}

// MissingSince is the clock of a replacement: set when the controller first
// sees a member's broker not live, kept while it stays missing (also when
// a recovery turns the missing owner into a follower), cleared when it is
// live again or leaves the assignment, and gone with a Reset (a new leader
// starts the clock again).
func TestMissingSince(t *testing.T) {
	t0 := time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)
	m := NewMemory()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	steps := []struct {
		snap *state.Snapshot
		want map[string]time.Time // node -> MissingSince after the step
	}{
		{state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(), map[string]time.Time{}},
		{state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(), map[string]time.Time{"b1": at(1)}},
		// Still missing: the clock keeps its start.
		{state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Snapshot(), map[string]time.Time{"b1": at(1)}},
		// A recovery moved the stream to b2 and kept b1 as a follower.
		{state.Build().Live("b2", "b3").Stream(cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b2", Followers: []string{"b1", "b3"}, Policy: majority}).Snapshot(), map[string]time.Time{"b1": at(1)}},
		// b1 returns: cleared.
		{state.Build().Live("b1", "b2", "b3").Stream(cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b2", Followers: []string{"b1", "b3"}, Policy: majority}).Snapshot(), map[string]time.Time{}},
		// b3 goes, and is then replaced by b4: no longer a member, cleared.
		{state.Build().Live("b1", "b2").Stream(cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b2", Followers: []string{"b1", "b3"}, Policy: majority}).Snapshot(), map[string]time.Time{"b3": at(5)}},
		{state.Build().Live("b1", "b2", "b4").Stream(cluster.Assignment{Stream: "s", Epoch: 5, Owner: "b2", Followers: []string{"b1", "b4"}, Policy: majority}).Snapshot(), map[string]time.Time{}},
	}
	for i, st := range steps {
		m.Observe(st.snap, at(i))
		a := st.snap.Assignments["s"].Value
		for _, n := range []string{"b1", "b2", "b3", "b4"} {
			if got := m.MissingSince("s", a.Incarnation, n); !got.Equal(st.want[n]) {
				t.Errorf("step %d: MissingSince(%s) = %v, want %v", i, n, got, st.want[n])
			}
		}
	}
	m.Observe(steps[1].snap, at(10))
	m.Reset()
	if got := m.MissingSince("s", "", "b1"); !got.IsZero() {
		t.Errorf("after Reset: MissingSince(b1) = %v, want zero", got)
	}
	var none *Memory
	if got := none.MissingSince("s", "", "b1"); !got.IsZero() {
		t.Errorf("nil memory: %v", got)
	}
}

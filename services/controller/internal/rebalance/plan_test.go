package rebalance

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

func owned(stream, owner string, targets ...string) Owned {
	return Owned{Stream: stream, Owner: owner, Targets: targets}
}

// The plan: owners within one of even, as the targets allow, at most max
// moves, deterministic.
func TestPlanTable(t *testing.T) {
	cases := []struct {
		name    string
		brokers []string
		streams []Owned
		max     int
		want    []Move
	}{
		{"balanced: nothing", []string{"a", "b", "c"},
			[]Owned{owned("s1", "a", "b"), owned("s2", "b", "c"), owned("s3", "c", "a")}, 10, nil},
		{"within one: nothing", []string{"a", "b"},
			[]Owned{owned("s1", "a", "b"), owned("s2", "a", "b"), owned("s3", "b", "a")}, 10, nil},
		{"all on one: spread to the fewest", []string{"a", "b", "c"},
			[]Owned{owned("s1", "a", "b", "c"), owned("s2", "a", "b", "c"), owned("s3", "a", "b", "c")}, 10,
			[]Move{{"s1", "a", "b"}, {"s2", "a", "c"}}},
		{"max bounds the moves", []string{"a", "b", "c"},
			[]Owned{owned("s1", "a", "b", "c"), owned("s2", "a", "b", "c"), owned("s3", "a", "b", "c")}, 1,
			[]Move{{"s1", "a", "b"}}},
		{"only to an in-sync follower", []string{"a", "b", "c"},
			[]Owned{owned("s1", "a", "b"), owned("s2", "a", "b"), owned("s3", "a", "b")}, 10,
			[]Move{{"s1", "a", "b"}}},
		{"no target: nothing", []string{"a", "b"},
			[]Owned{owned("s1", "a"), owned("s2", "a"), owned("s3", "a")}, 10, nil},
		{"a new broker takes its share", []string{"a", "b", "c", "d"},
			[]Owned{owned("s1", "a", "d"), owned("s2", "a", "d"), owned("s3", "b", "d"), owned("s4", "b", "d"), owned("s5", "c", "d"), owned("s6", "c", "d")}, 10,
			[]Move{{"s1", "a", "d"}}},
		{"a target that is not listed (draining, down) is not used", []string{"a", "b"},
			[]Owned{owned("s1", "a", "z"), owned("s2", "a", "z"), owned("s3", "a", "b")}, 10,
			[]Move{{"s3", "a", "b"}}},
		{"streams of owners not listed are left alone", []string{"a", "b"},
			[]Owned{owned("s1", "z", "a"), owned("s2", "z", "a"), owned("s3", "z", "a")}, 10, nil},
		{"a stream moves once per plan", []string{"a", "b", "c"},
			[]Owned{owned("s1", "a", "b", "c"), owned("s2", "a", "b", "c"), owned("s3", "a", "b", "c"), owned("s4", "a", "b", "c")}, 10,
			[]Move{{"s1", "a", "b"}, {"s2", "a", "c"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Plan(c.brokers, c.streams, c.max)
			if !slices.Equal(got, c.want) {
				t.Fatalf("plan %v, want %v", got, c.want)
			}
			again := Plan(c.brokers, slices.Clone(c.streams), c.max)
			if !slices.Equal(again, got) {
				t.Fatalf("a second plan %v differs from %v", again, got)
			}
		})
	}
}

func asg(owner string, followers ...string) cluster.Assignment {
	return cluster.Assignment{Stream: "s", Epoch: 2, Owner: owner, Followers: followers, Policy: cluster.Policy{Name: cluster.MajorityDurable}}
}

func tails(role string, tail uint64) cluster.CopyTails {
	return cluster.CopyTails{Epoch: 2, Role: role, RecordTail: tail, ConfirmWatermark: tail}
}

// inSync is b1 owning s with followers b2 and b3, every copy at tail 10.
func inSync() *state.Builder {
	return state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).
		Tails("b1", "s", tails(cluster.RoleOwner, 10)).Tails("b2", "s", tails(cluster.RoleFollower, 10)).Tails("b3", "s", tails(cluster.RoleFollower, 10))
}

// The handover decision: which targets may take a stream now.
func TestCheckHandoverTable(t *testing.T) {
	lagging := state.Build().Live("b1", "b2", "b3").Stream(asg("b1", "b2", "b3")).
		Tails("b1", "s", tails(cluster.RoleOwner, 100000)).Tails("b2", "s", tails(cluster.RoleFollower, 10)).Tails("b3", "s", tails(cluster.RoleFollower, 100000)).Snapshot()
	cases := []struct {
		name   string
		snap   *state.Snapshot
		stream string
		target string
		want   error
	}{
		{"an in-sync follower", inSync().Snapshot(), "s", "b2", nil},
		{"no such stream", inSync().Snapshot(), "t", "b2", transition.ErrNoStream},
		{"the owner itself", inSync().Snapshot(), "s", "b1", ErrAlreadyOwner},
		{"not a member", inSync().Snapshot(), "s", "b9", ErrNotFollower},
		{"a recovery pending", inSync().Recovery(cluster.Recovery{Stream: "s", FromEpoch: 2, FenceEpoch: 3}).Snapshot(), "s", "b2", transition.ErrPending},
		{"a lagging follower", lagging, "s", "b2", ErrNotInSync},
		{"a draining follower", inSync().Drain("b2").Snapshot(), "s", "b2", ErrNotInSync},
		{"a follower that is down", state.Build().Live("b1", "b3").Stream(asg("b1", "b2", "b3")).Tails("b1", "s", tails(cluster.RoleOwner, 10)).Snapshot(), "s", "b2", ErrNotInSync},
		{"the owner down", state.Build().Live("b2", "b3").Stream(asg("b1", "b2", "b3")).Tails("b2", "s", tails(cluster.RoleFollower, 10)).Snapshot(), "s", "b2", ErrOwnerDown},
		{"a single copy", state.Build().Live("b1").Stream(asg("b1")).Snapshot(), "s", "b2", transition.ErrSingleCopy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := CheckHandover(c.snap, c.stream, c.target)
			if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("CheckHandover: %v, want %v", err, c.want)
			}
		})
	}
}

// The drain decision: a known broker whose every copy has somewhere to go.
func TestCheckDrainTable(t *testing.T) {
	four := func() *state.Builder {
		return inSync().Live("b4")
	}
	cases := []struct {
		name string
		snap *state.Snapshot
		node string
		want error
	}{
		{"a fourth broker takes the copy", four().Snapshot(), "b1", nil},
		{"a broker holding nothing", four().Snapshot(), "b4", nil},
		{"unknown", four().Snapshot(), "b9", ErrNoBroker},
		{"no other broker", inSync().Snapshot(), "b1", ErrLastBroker},
		{"the other broker drains", four().Drain("b4").Snapshot(), "b1", ErrLastBroker},
		{"a down member is still known", state.Build().Live("b2", "b3", "b4").Stream(asg("b1", "b2", "b3")).Snapshot(), "b1", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckDrain(c.snap, c.node)
			if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("CheckDrain: %v, want %v", err, c.want)
			}
		})
	}
}

// PlanOf over a snapshot: draining brokers neither count nor take, and
// only in-sync followers are targets.
func TestPlanOf(t *testing.T) {
	b := state.Build().Live("b1", "b2", "b3")
	for i := range 4 {
		a := asg("b1", "b2", "b3")
		a.Stream = fmt.Sprintf("s%d", i)
		b.Stream(a).Tails("b1", a.Stream, tails(cluster.RoleOwner, 5)).Tails("b2", a.Stream, tails(cluster.RoleFollower, 5)).Tails("b3", a.Stream, tails(cluster.RoleFollower, 5))
	}
	moves, owned := PlanOf(b.Snapshot(), 10)
	if want := []Move{{"s0", "b1", "b2"}, {"s1", "b1", "b3"}}; !slices.Equal(moves, want) {
		t.Fatalf("moves %v, want %v", moves, want)
	}
	if owned["b1"] != 4 || owned["b2"] != 0 {
		t.Fatalf("owned %v", owned)
	}
	moves, _ = PlanOf(b.Drain("b3").Snapshot(), 10)
	if want := []Move{{"s0", "b1", "b2"}, {"s1", "b1", "b2"}}; !slices.Equal(moves, want) {
		t.Fatalf("with b3 draining: moves %v, want %v", moves, want)
	}
}

// planEveryStream is PlanOf as it was before it learnt to stop at a
// balanced cluster: the targets of every stream, then Plan.
func planEveryStream(s *state.Snapshot, max int) []Move {
	brokers := Eligible(s)
	var streams []Owned
	for name, av := range s.Assignments {
		if slices.Contains(brokers, av.Value.Owner) {
			streams = append(streams, Owned{Stream: name, Owner: av.Value.Owner, Targets: Targets(s, name)})
		}
	}
	return Plan(brokers, streams, max)
}

// randomCluster is streams streams of three copies over four brokers, their
// owners drawn from weights (uneven weights make an unbalanced cluster;
// none, the zero weights, take the brokers in turn: a balanced one),
// each follower in sync or lagging at random, one broker draining at
// random.
func randomCluster(rng *rand.Rand, streams int, weights [4]int) *state.Snapshot {
	nodes := []string{"b1", "b2", "b3", "b4"}
	b := state.Build().Live(nodes...)
	total := weights[0] + weights[1] + weights[2] + weights[3]
	for i := range streams {
		o := i % 4
		if total > 0 {
			w := rng.IntN(total)
			for o = 0; w >= weights[o]; o++ {
				w -= weights[o]
			}
		}
		perm := rng.Perm(3)
		var followers []string
		for _, p := range perm[:2] {
			followers = append(followers, nodes[(o+1+p)%4])
		}
		a := asg(nodes[o], followers...)
		a.Stream = fmt.Sprintf("s%05d", i)
		b.Stream(a).Tails(nodes[o], a.Stream, tails(cluster.RoleOwner, 100))
		for _, f := range followers {
			b.Tails(f, a.Stream, tails(cluster.RoleFollower, uint64(rng.IntN(2))*100))
		}
	}
	if rng.IntN(3) == 0 {
		b.Drain(nodes[rng.IntN(4)])
	}
	return b.Snapshot()
}

// PlanOf, which stops early on a cluster within one of balanced, plans
// what planning with every stream's targets does, on balanced and
// unbalanced clusters alike.
func TestPlanOfMatchesEveryStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	balanced := 0
	for i := range 200 {
		var weights [4]int
		for j := range weights {
			weights[j] = 1 + rng.IntN(4)*rng.IntN(2)
		}
		s := randomCluster(rng, 4+rng.IntN(40), weights)
		max := 1 + rng.IntN(5)
		got, owned := PlanOf(s, max)
		if want := planEveryStream(s, max); !slices.Equal(got, want) {
			t.Fatalf("case %d (owned %v): PlanOf %v, with every stream's targets %v", i, owned, got, want)
		}
		if len(got) == 0 {
			balanced++
		}
	}
	if balanced == 0 || balanced == 200 {
		t.Fatalf("%d of 200 clusters had nothing to move: the cases do not cover both kinds", balanced)
	}
}

// What a pass of the balancing loop costs on a balanced cluster of 10,000
// streams (the loop's every pass once idle).
func BenchmarkPlanOfBalanced(b *testing.B) {
	s := randomCluster(rand.New(rand.NewPCG(1, 1)), 10_000, [4]int{})
	if _, owned := PlanOf(s, 1); len(owned) == 0 {
		b.Fatal("no eligible broker")
	}
	b.ReportAllocs()
	stop := clustertest.CPUPerOp(b)
	for b.Loop() {
		if moves, _ := PlanOf(s, 1); len(moves) != 0 {
			b.Fatalf("moves %v on a balanced cluster", moves)
		}
	}
	stop()
}

// The same with every stream's targets worked out, as before PlanOf
// stopped early.
func BenchmarkPlanEveryStreamBalanced(b *testing.B) {
	s := randomCluster(rand.New(rand.NewPCG(1, 1)), 10_000, [4]int{})
	b.ReportAllocs()
	stop := clustertest.CPUPerOp(b)
	for b.Loop() {
		if moves := planEveryStream(s, 1); len(moves) != 0 {
			b.Fatalf("moves %v on a balanced cluster", moves)
		}
	}
	stop()
}

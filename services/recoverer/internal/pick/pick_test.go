package pick

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

// assignment returns an assignment of E copies n1..nE, n1 the owner.
func assignment(e int, policy cluster.Policy) cluster.Assignment {
	a := cluster.Assignment{Stream: "orders", Epoch: 4, Owner: "n1", Policy: policy}
	for i := 2; i <= e; i++ {
		a.Followers = append(a.Followers, fmt.Sprintf("n%d", i))
	}
	return a
}

func majority() cluster.Policy { return cluster.Policy{Name: cluster.MajorityDurable} }

// The seal threshold R for E = 1..7 and every policy (docs/protocol.md,
// "Safety argument"). Each row lists R for E = 1..7.
func TestThresholdTable(t *testing.T) {
	rows := []struct {
		policy cluster.Policy
		r      [7]int
	}{
		{cluster.Policy{}, [7]int{1, 1, 1, 1, 1, 1, 1}},
		{cluster.Policy{Name: cluster.LocalDurable}, [7]int{1, 1, 1, 1, 1, 1, 1}},
		{cluster.Policy{Name: cluster.MajorityDurable}, [7]int{1, 1, 2, 2, 3, 3, 4}},
		{cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}, [7]int{1, 2, 3, 4, 5, 6, 7}},
		{cluster.Policy{Name: cluster.ReplicaAccepted, Nodes: 1}, [7]int{1, 2, 3, 4, 5, 6, 7}},
		{cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 2}, [7]int{1, 1, 2, 3, 4, 5, 6}},
		{cluster.Policy{Name: cluster.ReplicaAccepted, Nodes: 2}, [7]int{1, 1, 2, 3, 4, 5, 6}},
		{cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 3}, [7]int{1, 1, 1, 2, 3, 4, 5}},
		{cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 9}, [7]int{1, 1, 1, 1, 1, 1, 1}},
		{cluster.Policy{Name: cluster.ReplicaAccepted, Nodes: 9}, [7]int{1, 1, 1, 1, 1, 1, 1}},
		{cluster.Policy{Name: "bogus"}, [7]int{1, 1, 1, 1, 1, 1, 1}},
	}
	for _, row := range rows {
		for e := 1; e <= 7; e++ {
			if got := Threshold(assignment(e, row.policy)); got != row.r[e-1] {
				t.Errorf("%v E=%d: R=%d, want %d", row.policy, e, got, row.r[e-1])
			}
		}
	}
}

// The furthest copy and its tie-break (docs/protocol.md, "Stream failover": highest
// record tail, then highest cursor event tail, then lowest node id).
func TestFurthestTable(t *testing.T) {
	cases := []struct {
		name    string
		answers []Answer
		want    string
	}{
		{"record tail wins over cursor event tail", []Answer{{Node: "a", RecordTail: 10, CursorEventTail: 99}, {Node: "b", RecordTail: 11, CursorEventTail: 0}}, "b"},
		{"record tail wins over node id", []Answer{{Node: "b", RecordTail: 7, CursorEventTail: 1}, {Node: "a", RecordTail: 6, CursorEventTail: 1}, {Node: "c", RecordTail: 5, CursorEventTail: 9}}, "b"},
		{"cursor event tail breaks a record tail tie", []Answer{{Node: "a", RecordTail: 10, CursorEventTail: 3}, {Node: "b", RecordTail: 10, CursorEventTail: 4}}, "b"},
		{"lowest node id breaks a full tie", []Answer{{Node: "c", RecordTail: 10, CursorEventTail: 4}, {Node: "b", RecordTail: 10, CursorEventTail: 4}, {Node: "d", RecordTail: 10, CursorEventTail: 4}}, "b"},
		{"node ids compare byte-wise", []Answer{{Node: "broker-2", RecordTail: 1, CursorEventTail: 1}, {Node: "broker-10", RecordTail: 1, CursorEventTail: 1}}, "broker-10"},
		{"upper case sorts before lower case", []Answer{{Node: "a", RecordTail: 1, CursorEventTail: 1}, {Node: "B", RecordTail: 1, CursorEventTail: 1}}, "B"},
		{"a single answer", []Answer{{Node: "z", RecordTail: 0, CursorEventTail: 0}}, "z"},
		{"all empty copies tie on node id", []Answer{{Node: "n3", RecordTail: 0, CursorEventTail: 0}, {Node: "n2", RecordTail: 0, CursorEventTail: 0}}, "n2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Furthest(c.answers)
			if !ok || got.Node != c.want {
				t.Fatalf("Furthest = %+v, %v; want %s", got, ok, c.want)
			}
			// The order is total: the answers in reverse pick the same copy.
			rev := slices.Clone(c.answers)
			slices.Reverse(rev)
			if got2, _ := Furthest(rev); got2 != got {
				t.Fatalf("reversed answers picked %+v, want %+v", got2, got)
			}
		})
	}
	if _, ok := Furthest(nil); ok {
		t.Fatal("Furthest(nil) reported a pick")
	}
}

// Waiting when fewer than R copies answer (docs/protocol.md, "Safety argument": "If they
// cannot, the stream waits, as a queue does, instead of guessing").
func TestDecideQuorumTable(t *testing.T) {
	cases := []struct {
		name        string
		old         cluster.Assignment
		answers     []Answer
		want        Verdict
		wantPick    string
		wantSealed  []string
		wantMissing []string
	}{
		{
			name:        "majority of 3, both followers answer",
			old:         assignment(3, majority()),
			answers:     []Answer{{Node: "n2", RecordTail: 5, CursorEventTail: 1}, {Node: "n3", RecordTail: 6, CursorEventTail: 0}},
			want:        Promote,
			wantPick:    "n3",
			wantSealed:  []string{"n2", "n3"},
			wantMissing: []string{"n1"},
		},
		{
			name:        "majority of 3, one follower answers",
			old:         assignment(3, majority()),
			answers:     []Answer{{Node: "n2", RecordTail: 5, CursorEventTail: 1}},
			want:        WaitQuorum,
			wantSealed:  []string{"n2"},
			wantMissing: []string{"n1", "n3"},
		},
		{
			name:        "majority of 3, nobody answers",
			old:         assignment(3, majority()),
			want:        WaitQuorum,
			wantMissing: []string{"n1", "n2", "n3"},
		},
		{
			name:        "every copy confirms, any survivor is enough",
			old:         assignment(3, cluster.Policy{Name: cluster.LocalDurable}),
			answers:     []Answer{{Node: "n3", RecordTail: 2, CursorEventTail: 0}},
			want:        Promote,
			wantPick:    "n3",
			wantSealed:  []string{"n3"},
			wantMissing: []string{"n1", "n2"},
		},
		{
			name:        "a duplicate answer counts once",
			old:         assignment(3, majority()),
			answers:     []Answer{{Node: "n2", RecordTail: 5, CursorEventTail: 1}, {Node: "n2", RecordTail: 9, CursorEventTail: 9}},
			want:        WaitQuorum,
			wantSealed:  []string{"n2"},
			wantMissing: []string{"n1", "n3"},
		},
		{
			name:        "an answer from a node that held no copy does not count",
			old:         assignment(3, majority()),
			answers:     []Answer{{Node: "n2", RecordTail: 5, CursorEventTail: 1}, {Node: "stranger", RecordTail: 99, CursorEventTail: 99}},
			want:        WaitQuorum,
			wantSealed:  []string{"n2"},
			wantMissing: []string{"n1", "n3"},
		},
		{
			name:        "replica_durable(1) of 3 needs every copy",
			old:         assignment(3, cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 1}),
			answers:     []Answer{{Node: "n2", RecordTail: 5, CursorEventTail: 1}, {Node: "n3", RecordTail: 5, CursorEventTail: 1}},
			want:        WaitQuorum,
			wantSealed:  []string{"n2", "n3"},
			wantMissing: []string{"n1"},
		},
		{
			name:        "more than R answers: the furthest of the larger set",
			old:         assignment(5, majority()),
			answers:     []Answer{{Node: "n5", RecordTail: 3, CursorEventTail: 0}, {Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n2", RecordTail: 9, CursorEventTail: 2}, {Node: "n4", RecordTail: 1, CursorEventTail: 0}},
			want:        Promote,
			wantPick:    "n1",
			wantSealed:  []string{"n1", "n2", "n4", "n5"},
			wantMissing: []string{"n3"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.old, nil, c.answers)
			if d.Verdict != c.want {
				t.Fatalf("verdict %v, want %v", d.Verdict, c.want)
			}
			if c.want == Promote && d.Pick.Node != c.wantPick {
				t.Fatalf("pick %q, want %q", d.Pick.Node, c.wantPick)
			}
			if !slices.Equal(d.Sealed, c.wantSealed) || !slices.Equal(d.Missing, c.wantMissing) {
				t.Fatalf("sealed %v missing %v, want %v and %v", d.Sealed, d.Missing, c.wantSealed, c.wantMissing)
			}
			if d.R != Threshold(c.old) {
				t.Fatalf("R %d, want %d", d.R, Threshold(c.old))
			}
		})
	}
}

// A second owner loss waits for the confirmed prefix and promotes once a
// copy at the start answers (docs/protocol.md, "The confirmed prefix").
func TestDecideConfirmedPrefix(t *testing.T) {
	// n1 took over at epoch 4 with 100 records, the only copy holding them;
	// it is lost before n2 and n3 catch up.
	old := assignment(3, majority())
	history := cluster.HistoryStarts{
		{Epoch: 2, RecordTail: 40, CursorEventTail: 3, Node: "n2"},
		{Epoch: 4, RecordTail: 100, CursorEventTail: 7, Node: "n1"},
	}
	steps := []struct {
		name     string
		answers  []Answer
		want     Verdict
		wantPick string
	}{
		{"followers behind the start wait", []Answer{{Node: "n2", RecordTail: 90, CursorEventTail: 9}, {Node: "n3", RecordTail: 80, CursorEventTail: 9}}, WaitPrefix, "n2"},
		{"fewer than R still waits for a quorum first", []Answer{{Node: "n2", RecordTail: 100, CursorEventTail: 9}}, WaitQuorum, "n2"},
		{"a follower just below the start waits", []Answer{{Node: "n2", RecordTail: 99, CursorEventTail: 99}, {Node: "n3", RecordTail: 99, CursorEventTail: 99}}, WaitPrefix, "n2"},
		{"the old owner answers at the start", []Answer{{Node: "n2", RecordTail: 90, CursorEventTail: 9}, {Node: "n3", RecordTail: 80, CursorEventTail: 9}, {Node: "n1", RecordTail: 100, CursorEventTail: 7}}, Promote, "n1"},
		{"a follower caught up exactly to the start", []Answer{{Node: "n2", RecordTail: 100, CursorEventTail: 2}, {Node: "n3", RecordTail: 80, CursorEventTail: 9}}, Promote, "n2"},
		{"a copy past the start", []Answer{{Node: "n3", RecordTail: 120, CursorEventTail: 0}, {Node: "n2", RecordTail: 90, CursorEventTail: 9}}, Promote, "n3"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			d := Decide(old, history, s.answers)
			if d.Verdict != s.want || d.Pick.Node != s.wantPick {
				t.Fatalf("verdict %v pick %q, want %v %q", d.Verdict, d.Pick.Node, s.want, s.wantPick)
			}
			if !d.HasStart || d.Start != history[1] {
				t.Fatalf("start %+v (%v), want the latest %+v", d.Start, d.HasStart, history[1])
			}
		})
	}
	// A stream with no history yet has no prefix to wait for.
	if d := Decide(old, nil, []Answer{{Node: "n2", RecordTail: 0, CursorEventTail: 0}, {Node: "n3", RecordTail: 0, CursorEventTail: 0}}); d.Verdict != Promote || d.HasStart {
		t.Fatalf("no history: verdict %v has start %v, want promote without a start", d.Verdict, d.HasStart)
	}
}

// The new assignment's members (docs/protocol.md, "Stream failover": "The owner is the
// chosen copy, the other sealed copies follow it, and members the proposal
// added that held no copy join as followers too"; left-out copies stay out).
func TestFollowersTable(t *testing.T) {
	cases := []struct {
		name    string
		policy  cluster.Policy
		added   []string
		removed []string
		copies  int
		answers []Answer
		want    []string
	}{
		{"sealed copies follow the pick", majority(), nil, nil, 0, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}, {Node: "n1", RecordTail: 1}}, []string{"n1", "n2"}},
		// The lost owner did not answer: it stays, as a follower, and
		// rejoins when its broker returns.
		{"an old copy that did not answer is kept", majority(), nil, nil, 0, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n1", "n2"}},
		{"an added member that held no copy joins", majority(), []string{"n4"}, nil, 0, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n1", "n2", "n4"}},
		{"an added old member joins once", majority(), []string{"n1", "n4"}, nil, 0, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n1", "n2", "n4"}},
		{"an added member listed twice joins once", majority(), []string{"n5", "n4", "n5"}, nil, 0, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n1", "n2", "n5", "n4"}},
		{"followers keep the old assignment's order", majority(), nil, nil, 0, []Answer{{Node: "n3", RecordTail: 1}, {Node: "n2", RecordTail: 1}, {Node: "n1", RecordTail: 9}}, []string{"n2", "n3"}},
		{"the pick alone keeps the unanswered copies", cluster.Policy{Name: cluster.LocalDurable}, nil, nil, 0, []Answer{{Node: "n2", RecordTail: 5}}, []string{"n1", "n3"}},
		// Replacement: n1 missing past --replace-after is removed and n4
		// takes its place.
		{"a removed copy that did not answer is replaced", majority(), []string{"n4"}, []string{"n1"}, 3, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n2", "n4"}},
		// It answered after all: it stays and its replacement is not
		// needed (4 copies would raise W to 3). Tied with n3 at the
		// furthest tails, the proposed owner n1 keeps the stream.
		{"a removed copy that answered stays and needs no replacement", majority(), []string{"n4"}, []string{"n1"}, 3, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}, {Node: "n1", RecordTail: 6}}, []string{"n2", "n3"}},
		{"a removed copy that answered behind stays as a follower", majority(), []string{"n4"}, []string{"n1"}, 3, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}, {Node: "n1", RecordTail: 4}}, []string{"n1", "n2"}},
		{"a removed follower is left out when the owner stays", majority(), []string{"n4"}, []string{"n3"}, 3, []Answer{{Node: "n1", RecordTail: 6}, {Node: "n2", RecordTail: 6}}, []string{"n2", "n4"}},
		{"replacements stop at the copy count", majority(), []string{"n4", "n5"}, []string{"n1"}, 3, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n2", "n4"}},
		{"no replacement found: the stream shrinks", cluster.Policy{Name: cluster.LocalDurable}, nil, []string{"n1"}, 3, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n3", RecordTail: 6}}, []string{"n2"}},
		{"an unanswered copy not removed stays beside a replacement", majority(), []string{"n4"}, []string{"n3"}, 3, []Answer{{Node: "n2", RecordTail: 5}, {Node: "n1", RecordTail: 5}}, []string{"n2", "n4"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old := assignment(3, c.policy)
			rec := cluster.Recovery{Stream: "orders", FromEpoch: 4, FenceEpoch: 5, OldOwner: "n1", OldFollowers: []string{"n2", "n3"},
				ProposedOwner: "n1", AddedMembers: c.added, RemovedMembers: c.removed, Copies: c.copies}
			d := DecideFor(old, rec, nil, c.answers)
			if d.Verdict != Promote {
				t.Fatalf("verdict %v, want promote", d.Verdict)
			}
			got := Followers(old, rec, d)
			if !slices.Equal(got, c.want) {
				t.Fatalf("followers %v, want %v", got, c.want)
			}
			if slices.Contains(got, d.Pick.Node) {
				t.Fatalf("the pick %s is also a follower", d.Pick.Node)
			}
		})
	}
}

// The pick prefers the recovery's proposed owner among copies tied at the
// furthest tails, and only there.
func TestDecideForPrefersProposedOwner(t *testing.T) {
	old := assignment(3, majority())
	cases := []struct {
		name     string
		proposed string
		answers  []Answer
		want     string
	}{
		{"tied: the proposed owner keeps the stream", "n2", []Answer{{Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n2", RecordTail: 9, CursorEventTail: 2}}, "n2"},
		{"proposed behind on records: the furthest", "n2", []Answer{{Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n2", RecordTail: 8, CursorEventTail: 7}}, "n1"},
		{"proposed behind on cursor events: the furthest", "n2", []Answer{{Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n2", RecordTail: 9, CursorEventTail: 1}}, "n1"},
		{"proposed did not answer: lowest node id", "n3", []Answer{{Node: "n2", RecordTail: 9}, {Node: "n1", RecordTail: 9}}, "n1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := cluster.Recovery{Stream: "orders", FromEpoch: 4, FenceEpoch: 5, OldOwner: "n1", OldFollowers: []string{"n2", "n3"}, ProposedOwner: c.proposed}
			d := DecideFor(old, rec, nil, c.answers)
			if d.Verdict != Promote || d.Pick.Node != c.want {
				t.Fatalf("verdict %v pick %s, want promote %s", d.Verdict, d.Pick.Node, c.want)
			}
		})
	}
}

// The guarded commit's values: epoch = fence, owner = pick, policy from the
// proposal or else the old one, retention kept, the pick's start appended.
func TestCommit(t *testing.T) {
	old := assignment(3, majority())
	old.Retention = cluster.Retention{MaxRecords: 1000, MaxAge: time.Hour}
	history := cluster.HistoryStarts{{Epoch: 2, RecordTail: 40, CursorEventTail: 3, Node: "n2"}}
	rec := cluster.Recovery{Stream: "orders", FromEpoch: 4, FenceEpoch: 5, OldOwner: "n1", OldFollowers: []string{"n2", "n3"}, AddedMembers: []string{"n4"}}
	d := Decide(old, history, []Answer{{Node: "n2", RecordTail: 50, CursorEventTail: 6}, {Node: "n3", RecordTail: 50, CursorEventTail: 8}})
	if d.Verdict != Promote {
		t.Fatalf("verdict %v, want promote", d.Verdict)
	}

	for _, c := range []struct {
		name       string
		recPolicy  cluster.Policy
		wantPolicy cluster.Policy
	}{
		{"the old policy when the proposal carries none", cluster.Policy{}, majority()},
		{"the proposal's policy", cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 2}, cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := rec
			rec.Policy = c.recPolicy
			next, starts := Commit(old, rec, history, d)
			// n1 did not answer and stays; n4 joins, as the proposal
			// sets no copy bound.
			want := cluster.Assignment{Stream: "orders", Epoch: 5, Owner: "n3", Followers: []string{"n1", "n2", "n4"}, Policy: c.wantPolicy, Retention: old.Retention}
			if fmt.Sprint(next) != fmt.Sprint(want) {
				t.Fatalf("assignment %+v, want %+v", next, want)
			}
			wantStarts := cluster.HistoryStarts{history[0], {Epoch: 5, RecordTail: 50, CursorEventTail: 8, Node: "n3"}}
			if !slices.Equal(starts, wantStarts) {
				t.Fatalf("starts %+v, want %+v", starts, wantStarts)
			}
		})
	}
	if len(history) != 1 {
		t.Fatalf("Commit changed the history it was given: %+v", history)
	}
}

// A recovery that does not match the assignment read with it is stale and
// left for the controller.
func TestCheckTable(t *testing.T) {
	old := assignment(3, majority())
	good := cluster.Recovery{Stream: "orders", FromEpoch: 4, FenceEpoch: 5, TransitionID: "t1", OldOwner: "n1", OldFollowers: []string{"n2", "n3"}}
	cases := []struct {
		name    string
		edit    func(*cluster.Recovery)
		history cluster.HistoryStarts
		stale   bool
	}{
		{"matching", func(*cluster.Recovery) {}, nil, false},
		{"old members in another order", func(r *cluster.Recovery) { r.OldOwner, r.OldFollowers = "n3", []string{"n2", "n1"} }, nil, false},
		{"history below the fence", func(*cluster.Recovery) {}, cluster.HistoryStarts{{Epoch: 4, RecordTail: 9}}, false},
		{"from an older epoch", func(r *cluster.Recovery) { r.FromEpoch = 3 }, nil, true},
		{"from a newer epoch", func(r *cluster.Recovery) { r.FromEpoch = 5; r.FenceEpoch = 6 }, nil, true},
		{"fence not past the epoch", func(r *cluster.Recovery) { r.FenceEpoch = 4 }, nil, true},
		{"a missing old member", func(r *cluster.Recovery) { r.OldFollowers = []string{"n2"} }, nil, true},
		{"a foreign old member", func(r *cluster.Recovery) { r.OldFollowers = []string{"n2", "n9"} }, nil, true},
		{"history already at the fence", func(*cluster.Recovery) {}, cluster.HistoryStarts{{Epoch: 5, RecordTail: 9}}, true},
		{"no transition id", func(r *cluster.Recovery) { r.TransitionID = "" }, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := good
			rec.OldFollowers = slices.Clone(good.OldFollowers)
			c.edit(&rec)
			err := Check(old, rec, c.history)
			if c.stale != (err != nil) {
				t.Fatalf("Check = %v, want stale %v", err, c.stale)
			}
			if err != nil && !errors.Is(err, ErrStale) {
				t.Fatalf("Check = %v, want ErrStale", err)
			}
		})
	}
}

// The handover decision: the proposed owner wins the pick only when it is
// tied with the furthest sealed copy on both tails (docs/protocol.md,
// "Handover"); quorum and prefix rules are unchanged by the preference.
func TestDecidePreferringTable(t *testing.T) {
	cases := []struct {
		name      string
		preferred string
		answers   []Answer
		history   cluster.HistoryStarts
		verdict   Verdict
		pick      string
	}{
		{"caught-up target tied with the paused owner is promoted", "n3",
			[]Answer{{Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n2", RecordTail: 9, CursorEventTail: 2}, {Node: "n3", RecordTail: 9, CursorEventTail: 2}}, nil, Promote, "n3"},
		{"target behind on records: the furthest is promoted", "n3",
			[]Answer{{Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n3", RecordTail: 8, CursorEventTail: 2}}, nil, Promote, "n1"},
		{"target behind on cursor events: the furthest is promoted", "n3",
			[]Answer{{Node: "n1", RecordTail: 9, CursorEventTail: 2}, {Node: "n3", RecordTail: 9, CursorEventTail: 1}}, nil, Promote, "n1"},
		{"target did not answer: the furthest of the others", "n3",
			[]Answer{{Node: "n2", RecordTail: 9, CursorEventTail: 2}, {Node: "n1", RecordTail: 9, CursorEventTail: 2}}, nil, Promote, "n1"},
		{"a preference does not lower the quorum", "n3",
			[]Answer{{Node: "n3", RecordTail: 9, CursorEventTail: 2}}, nil, WaitQuorum, "n3"},
		{"a preference does not pass the prefix", "n3",
			[]Answer{{Node: "n2", RecordTail: 4, CursorEventTail: 0}, {Node: "n3", RecordTail: 4, CursorEventTail: 0}},
			cluster.HistoryStarts{{Epoch: 4, RecordTail: 5, Node: "n1"}}, WaitPrefix, "n3"},
		{"a preference that is no member is ignored", "n9",
			[]Answer{{Node: "n2", RecordTail: 9, CursorEventTail: 2}, {Node: "n3", RecordTail: 9, CursorEventTail: 2}, {Node: "n9", RecordTail: 9, CursorEventTail: 2}}, nil, Promote, "n2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := DecidePreferring(assignment(3, majority()), c.history, c.answers, c.preferred)
			if d.Verdict != c.verdict || d.Pick.Node != c.pick {
				t.Fatalf("verdict %v pick %s, want %v pick %s", d.Verdict, d.Pick.Node, c.verdict, c.pick)
			}
		})
	}
}

// A drain's member is left out even when it answered its seal; the member
// added in its place joins. A removed member that answered stays instead.
func TestFollowersLeaveOutDrainedMembers(t *testing.T) {
	old := assignment(3, majority())
	rec := cluster.Recovery{Stream: "orders", FromEpoch: 4, FenceEpoch: 5, OldOwner: "n1", OldFollowers: []string{"n2", "n3"},
		ProposedOwner: "n1", AddedMembers: []string{"n4"}, DrainedMembers: []string{"n3"}, Copies: 3}
	d := DecidePreferring(old, nil, []Answer{{Node: "n1", RecordTail: 9}, {Node: "n2", RecordTail: 9}, {Node: "n3", RecordTail: 9}}, rec.ProposedOwner)
	if d.Verdict != Promote || d.Pick.Node != "n1" {
		t.Fatalf("verdict %v pick %s, want promote n1", d.Verdict, d.Pick.Node)
	}
	if got := Followers(old, rec, d); !slices.Equal(got, []string{"n2", "n4"}) {
		t.Fatalf("followers %v, want [n2 n4]", got)
	}
	rec.RemovedMembers, rec.DrainedMembers = rec.DrainedMembers, nil
	if got := Followers(old, rec, d); !slices.Equal(got, []string{"n2", "n3"}) {
		t.Fatalf("removed, not drained: followers %v, want [n2 n3]", got)
	}
}

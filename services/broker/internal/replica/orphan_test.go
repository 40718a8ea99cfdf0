package replica

import (
	"testing"
	"time"

	"github.com/strandhq/strand/internal/cluster"
)

func TestOrphanVerdict(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	grace := 10 * time.Minute
	long := now.Add(-grace - time.Second)
	with := &cluster.Assignment{Stream: "s", Epoch: 3, Owner: "b1", Followers: []string{"b2", "me"}, Incarnation: "i1"}
	without := &cluster.Assignment{Stream: "s", Epoch: 4, Owner: "b1", Followers: []string{"b2", "b3"}, Incarnation: "i1"}
	recreated := &cluster.Assignment{Stream: "s", Epoch: 1, Owner: "me", Followers: []string{"b2"}, Incarnation: "i2"}
	namesMe := &cluster.Recovery{Stream: "s", FromEpoch: 4, FenceEpoch: 5, OldOwner: "b1", OldFollowers: []string{"me", "b3"}}
	addsMe := &cluster.Recovery{Stream: "s", FromEpoch: 4, FenceEpoch: 5, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, AddedMembers: []string{"me"}}
	other := &cluster.Recovery{Stream: "s", FromEpoch: 4, FenceEpoch: 5, OldOwner: "b1", OldFollowers: []string{"b2", "b3"}}
	cases := []struct {
		name string
		f    orphanFacts
		want orphanVerdict
	}{
		{"included in the view and in etcd", orphanFacts{view: with, current: with, since: long}, orphanIncluded},
		{"included in etcd, the view behind", orphanFacts{view: without, current: with, since: long}, orphanIncluded},
		{"included in the view, etcd's not read yet", orphanFacts{view: with, since: long}, orphanIncluded},
		{"left out past the grace: deleted", orphanFacts{view: without, current: without, since: long}, orphanDelete},
		{"left out past the grace, another recovery pending: deleted", orphanFacts{view: without, current: without, recovery: other, since: long}, orphanDelete},
		{"a pending recovery names us among its old members: held", orphanFacts{view: without, current: without, recovery: namesMe, since: long}, orphanHeld},
		{"a pending recovery adds us: held", orphanFacts{view: without, current: without, recovery: addsMe, since: long}, orphanHeld},
		{"grace not passed", orphanFacts{view: without, current: without, since: now.Add(-grace + time.Second)}, orphanWait},
		{"not seen left out before", orphanFacts{view: without, current: without}, orphanWait},
		{"view does not mirror etcd", orphanFacts{view: without, current: without, since: long, incarnation: "stale"}, orphanWait},
		{"incarnation changed: named by the new stream's assignment, still an orphan", orphanFacts{view: recreated, current: recreated, since: long}, orphanDelete},
		{"incarnation changed, grace not passed", orphanFacts{view: recreated, current: recreated, since: now.Add(-time.Second)}, orphanWait},
		{"incarnation changed: the new stream's recovery does not hold it", orphanFacts{view: recreated, current: recreated, recovery: namesMe, since: long}, orphanDelete},
		{"a copy that never recorded an incarnation counts as the assignment's", orphanFacts{incarnation: "-", view: with, current: with, since: long}, orphanIncluded},
		{"no assignment: the stream's deletion drops it, not the grace", orphanFacts{since: long}, orphanNotMine},
		{"deleted in etcd, the view behind", orphanFacts{view: without, since: long}, orphanNotMine},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.f
			f.node, f.now, f.grace = "me", now, grace
			// The copy is of incarnation i1 and the view mirrors etcd,
			// unless the case says otherwise: "-" for a copy that
			// recorded no incarnation, "stale" for a view that does not
			// mirror etcd.
			f.mirrored = f.incarnation != "stale"
			switch f.incarnation {
			case "", "stale":
				f.incarnation = "i1"
			case "-":
				f.incarnation = ""
			}
			if got := f.verdict(); got != c.want {
				t.Fatalf("verdict = %d, want %d", got, c.want)
			}
		})
	}
}

func TestOrphanSweepInterval(t *testing.T) {
	for _, c := range []struct{ grace, want time.Duration }{
		{10 * time.Minute, 30 * time.Second},
		{time.Minute, 15 * time.Second},
		{200 * time.Millisecond, 50 * time.Millisecond},
		{time.Millisecond, 10 * time.Millisecond},
	} {
		if got := orphanSweepInterval(c.grace); got != c.want {
			t.Errorf("orphanSweepInterval(%v) = %v, want %v", c.grace, got, c.want)
		}
	}
}

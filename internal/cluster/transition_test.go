package cluster

import (
	"fmt"
	"math/bits"
	"slices"
	"testing"
)

func TestIsFastPath(t *testing.T) {
	majority := Policy{Name: MajorityDurable}
	local := Policy{Name: LocalDurable}
	replica := func(n int) Policy { return Policy{Name: ReplicaDurable, Nodes: n} }
	asg := func(p Policy, owner string, followers ...string) Assignment {
		return Assignment{Stream: "s", Epoch: 4, Owner: owner, Followers: followers, Policy: p}
	}
	cases := []struct {
		name      string
		old, next Assignment
		want      bool
	}{
		{"no change", asg(majority, "a", "b", "c"), asg(majority, "a", "b", "c"), true},
		{"follower order changes", asg(majority, "a", "b", "c"), asg(majority, "a", "c", "b"), true},
		// W 2 -> 3: a record confirmed on a and b need not be on any R'=2 of 4.
		{"add follower under majority 3->4", asg(majority, "a", "b", "c"), asg(majority, "a", "b", "c", "d"), false},
		// W 2 -> 2 (majority of 2 is 2, of 3 is 2).
		{"add follower under majority 2->3", asg(majority, "a", "b"), asg(majority, "a", "b", "c"), true},
		{"add follower under replica_durable(2)", asg(replica(2), "a", "b", "c"), asg(replica(2), "a", "b", "c", "d"), true},
		{"local_durable to majority_durable", asg(local, "a", "b", "c"), asg(majority, "a", "b", "c"), true},
		{"zero policy to majority_durable", asg(Policy{}, "a", "b", "c"), asg(majority, "a", "b", "c"), true},
		{"majority_durable to local_durable raises W", asg(majority, "a", "b", "c"), asg(local, "a", "b", "c"), false},
		{"replica_durable 1 to 2 raises W", asg(replica(1), "a", "b"), asg(replica(2), "a", "b"), false},
		{"drop a follower", asg(majority, "a", "b", "c"), asg(majority, "a", "b"), false},
		// W 3 -> 2 with one copy gone: the two left hold every confirmed record.
		{"drop a follower under local_durable", asg(local, "a", "b", "c"), asg(local, "a", "b"), true},
		// W 3, k 1 -> W' 2 <= 2.
		{"replace a follower lowering W", asg(local, "a", "b", "c"), asg(majority, "a", "b", "d"), true},
		{"replace a follower", asg(majority, "a", "b", "c"), asg(majority, "a", "b", "d"), false},
		{"change owner", asg(majority, "a", "b", "c"), asg(majority, "b", "a", "c"), false},
		// Single copy, local_durable W=1 -> majority of 2 = 2.
		{"single copy gains a follower under majority", asg(majority, "a"), asg(majority, "a", "b"), false},
		{"single copy gains a follower under replica_durable(1)", asg(replica(1), "a"), asg(replica(1), "a", "b"), true},
		{"accepted count read as durable", asg(replica(2), "a", "b", "c"), asg(Policy{Name: ReplicaAccepted, Nodes: 2}, "a", "b", "c"), true},
	}
	for _, c := range cases {
		if got := IsFastPath(c.old, c.next); got != c.want {
			t.Errorf("%s: IsFastPath = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestRemovalRuleTable checks IsFastPath against the intersection argument
// itself, by enumeration: for every E in 1..5, every policy before and
// after, every count k of followers removed and every count of empty
// followers added, the change is allowed without a seal exactly when every
// set of W old copies that may hold a confirmed record keeps a member of
// the new assignment in every set of R' new copies a later recovery could
// seal. New copies start empty and hold nothing.
func TestRemovalRuleTable(t *testing.T) {
	policies := []Policy{
		{Name: LocalDurable}, {Name: MajorityDurable},
		{Name: ReplicaDurable, Nodes: 1}, {Name: ReplicaDurable, Nodes: 2}, {Name: ReplicaDurable, Nodes: 3},
		{Name: ReplicaAccepted, Nodes: 4}, {Name: ReplicaDurable, Nodes: 5},
	}
	checked, allowed := 0, 0
	for e := 1; e <= 5; e++ {
		old := Assignment{Stream: "s", Epoch: 3, Owner: "n0"}
		for i := 1; i < e; i++ {
			old.Followers = append(old.Followers, fmt.Sprintf("n%d", i))
		}
		for _, p := range policies {
			old.Policy = p
			w := StreamConfirmPolicy(p, e).W
			for k := 0; k < e; k++ {
				for added := 0; added <= 3; added++ {
					for _, p2 := range policies {
						// The last k followers go; empties x0.. come.
						next := Assignment{Stream: "s", Epoch: 3, Owner: "n0", Policy: p2,
							Followers: slices.Clone(old.Followers[:len(old.Followers)-k])}
						for i := range added {
							next.Followers = append(next.Followers, fmt.Sprintf("x%d", i))
						}
						rule := StreamConfirmPolicy(p2, next.Copies())
						want := intersects(old.Members(), w, next.Members(), rule.R())
						got := IsFastPath(old, next)
						if got != want {
							t.Errorf("E=%d %v (W=%d) remove %d add %d -> E'=%d %v (W'=%d): IsFastPath %v, enumeration %v",
								e, p, w, k, added, next.Copies(), p2, rule.W, got, want)
						}
						if got != (rule.W <= w-k) {
							t.Errorf("E=%d %v remove %d add %d -> %v: IsFastPath %v, want W' <= W-k (%d <= %d-%d)",
								e, p, k, added, p2, got, rule.W, w, k)
						}
						checked++
						if got {
							allowed++
						}
					}
				}
			}
		}
	}
	if allowed == 0 || allowed == checked {
		t.Fatalf("table allowed %d of %d changes: it does not tell the cases apart", allowed, checked)
	}
	// Changing the owner is never the fast path, whatever W does.
	a := Assignment{Owner: "n0", Followers: []string{"n1", "n2"}, Policy: Policy{Name: ReplicaDurable, Nodes: 3}}
	b := Assignment{Owner: "n1", Followers: []string{"n0", "n2"}, Policy: Policy{Name: ReplicaDurable, Nodes: 1}}
	if IsFastPath(a, b) {
		t.Error("owner change allowed on the fast path")
	}
}

// intersects reports whether every w-subset of old, cut down to the
// members new keeps, meets every r-subset of new.
func intersects(old []string, w int, next []string, r int) bool {
	for _, holders := range subsets(old, w) {
		for _, sealed := range subsets(next, r) {
			if !slices.ContainsFunc(sealed, func(n string) bool { return slices.Contains(holders, n) }) {
				return false
			}
		}
	}
	return true
}

// subsets returns every subset of xs of size n.
func subsets(xs []string, n int) [][]string {
	var out [][]string
	for mask := 0; mask < 1<<len(xs); mask++ {
		if bits.OnesCount(uint(mask)) != n {
			continue
		}
		var s []string
		for i, x := range xs {
			if mask&(1<<i) != 0 {
				s = append(s, x)
			}
		}
		out = append(out, s)
	}
	return out
}

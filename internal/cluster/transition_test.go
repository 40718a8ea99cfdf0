package cluster

import "testing"

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

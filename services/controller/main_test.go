package main

import (
	"testing"

	"github.com/strandhq/strand/internal/cluster"
)

func TestParsePolicy(t *testing.T) {
	ok := map[string]cluster.Policy{
		"majority_durable":   {Name: cluster.MajorityDurable},
		"local_durable":      {Name: cluster.LocalDurable},
		"replica_durable:2":  {Name: cluster.ReplicaDurable, Nodes: 2},
		"replica_accepted:3": {Name: cluster.ReplicaAccepted, Nodes: 3},
	}
	for in, want := range ok {
		if got, err := parsePolicy(in); err != nil || got != want {
			t.Errorf("parsePolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"bogus", "replica_durable", "replica_durable:x", "majority_durable:2", ""} {
		if _, err := parsePolicy(bad); err == nil {
			t.Errorf("parsePolicy(%q): want an error", bad)
		}
	}
}

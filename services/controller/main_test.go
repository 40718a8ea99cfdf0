package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/strandhq/strand/internal/cluster"
)

// The rule is cluster.ParsePolicy's (tested there); the flag reads it and
// names itself in the error.
func TestParsePolicy(t *testing.T) {
	if got, err := parsePolicy("replica_durable:2"); err != nil || got != (cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 2}) {
		t.Errorf("parsePolicy(replica_durable:2) = %v, %v", got, err)
	}
	for _, bad := range []string{"bogus", "replica_durable", "replica_durable:x", "majority_durable:2", ""} {
		_, err := parsePolicy(bad)
		if !errors.Is(err, cluster.ErrInvalidPolicy) || !strings.Contains(err.Error(), "--default-policy") {
			t.Errorf("parsePolicy(%q): %v, want ErrInvalidPolicy naming --default-policy", bad, err)
		}
	}
}

package cluster

import (
	"strings"
	"testing"
)

// nameOK is the rule of a name spelled out byte by byte: a first byte of
// first, then at most max-1 bytes of first or "._-".
func nameOK(name string, max int, first func(byte) bool) bool {
	if len(name) < 1 || len(name) > max || !first(name[0]) {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !first(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func lowerOrDigit(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
func alnum(c byte) bool        { return lowerOrDigit(c) || c >= 'A' && c <= 'Z' }

// FuzzValidateNames: the stream and node name checks every request goes
// through accept exactly the names of their rule, and an accepted name is
// one etcd key below its directory (no '/', so it cannot reach another
// stream's or another directory's keys; docs/etcd-schema.md).
func FuzzValidateNames(f *testing.F) {
	for _, s := range []string{"s", "orders.v1", "a-b_c", "", "A", "-a", "a/b", "a\n", strings.Repeat("a", 128), strings.Repeat("a", 129), "b1", "Node-7", "..", "a\x00"} {
		f.Add(s)
	}
	schema := NewSchema("")
	f.Fuzz(func(t *testing.T, name string) {
		streamErr := ValidateStreamName(name)
		if want := nameOK(name, 128, lowerOrDigit); (streamErr == nil) != want {
			t.Fatalf("ValidateStreamName(%q) = %v, the rule says valid: %v", name, streamErr, want)
		}
		if streamErr == nil {
			key := schema.StreamKey(name)
			if got, err := NameIn(schema.StreamsDir(), key); err != nil || got != name {
				t.Fatalf("stream %q has key %q, read back as %q, %v", name, key, got, err)
			}
		}
		nodeErr := ValidateNodeName(name)
		if want := nameOK(name, 64, alnum); (nodeErr == nil) != want {
			t.Fatalf("ValidateNodeName(%q) = %v, the rule says valid: %v", name, nodeErr, want)
		}
		if nodeErr == nil {
			if node, shard, err := schema.ParseHeartbeatKey(schema.HeartbeatKey(name, 3)); err != nil || node != name || shard != 3 {
				t.Fatalf("node %q: heartbeat key parses to %q, %d, %v", name, node, shard, err)
			}
		}
	})
}

// FuzzPolicyValidate: a policy is valid exactly when it is one of the four
// names with a nodes count where, and only where, it takes one.
func FuzzPolicyValidate(f *testing.F) {
	for _, p := range []Policy{{}, {Name: LocalDurable}, {Name: MajorityDurable}, {Name: ReplicaDurable, Nodes: 2},
		{Name: ReplicaAccepted, Nodes: 1}, {Name: ReplicaDurable}, {Name: LocalDurable, Nodes: 1}, {Name: "fast"}} {
		f.Add(p.Name, p.Nodes)
	}
	f.Fuzz(func(t *testing.T, name string, nodes int) {
		p := Policy{Name: name, Nodes: nodes}
		err := p.Validate()
		var want bool
		switch name {
		case "", LocalDurable, MajorityDurable:
			want = nodes == 0
		case ReplicaDurable, ReplicaAccepted:
			want = nodes >= 1
		}
		if (err == nil) != want {
			t.Fatalf("%+v.Validate() = %v, want valid: %v", p, err, want)
		}
		if err == nil {
			if r := StreamConfirmPolicy(p, 3); r.W < 1 || r.W > r.E {
				t.Fatalf("valid %+v gives W %d of E %d", p, r.W, r.E)
			}
		}
	})
}

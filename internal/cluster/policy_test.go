package cluster

import (
	"errors"
	"testing"
)

func TestStreamConfirmPolicyTable(t *testing.T) {
	type want struct{ w, r int }
	majority := func(e int) want { w := e/2 + 1; return want{w, e - w + 1} }
	for e := 1; e <= 7; e++ {
		cases := []struct {
			policy Policy
			want   want
		}{
			{Policy{}, want{e, 1}},
			{Policy{Name: LocalDurable}, want{e, 1}},
			{Policy{Name: MajorityDurable}, majority(e)},
			{Policy{Name: ReplicaDurable, Nodes: 1}, want{1, e}},
			{Policy{Name: ReplicaDurable, Nodes: 2}, want{min(2, e), e - min(2, e) + 1}},
			{Policy{Name: ReplicaAccepted, Nodes: 2}, want{min(2, e), e - min(2, e) + 1}},
			{Policy{Name: ReplicaDurable, Nodes: 9}, want{e, 1}},
			{Policy{Name: ReplicaAccepted, Nodes: 9}, want{e, 1}},
			{Policy{Name: "bogus"}, want{e, 1}},
		}
		for _, c := range cases {
			got := StreamConfirmPolicy(c.policy, e)
			if got.E != e || got.W != c.want.w || got.R() != c.want.r {
				t.Errorf("E=%d %v: got W=%d R=%d, want W=%d R=%d", e, c.policy, got.W, got.R(), c.want.w, c.want.r)
			}
			// The safety argument: any W copies and any R copies intersect.
			if got.W+got.R() != e+1 {
				t.Errorf("E=%d %v: W+R=%d, want E+1", e, c.policy, got.W+got.R())
			}
		}
	}
}

func TestStreamConfirmPolicyExamples(t *testing.T) {
	// docs/protocol.md, "Safety argument": "With W = E (every copy) R = 1"; "With 3 copies and W = 2, R = 2".
	if r := StreamConfirmPolicy(Policy{Name: LocalDurable}, 3).R(); r != 1 {
		t.Fatalf("local_durable E=3: R=%d, want 1", r)
	}
	if c := StreamConfirmPolicy(Policy{Name: MajorityDurable}, 3); c.W != 2 || c.R() != 2 {
		t.Fatalf("majority_durable E=3: W=%d R=%d, want 2 and 2", c.W, c.R())
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, p := range []Policy{{}, {Name: LocalDurable}, {Name: MajorityDurable}, {Name: ReplicaDurable, Nodes: 2}, {Name: ReplicaAccepted, Nodes: 1}} {
		if err := p.Validate(); err != nil {
			t.Errorf("%v: unexpected %v", p, err)
		}
	}
	for _, p := range []Policy{{Name: "bogus"}, {Name: ReplicaDurable}, {Name: MajorityDurable, Nodes: 2}} {
		if err := p.Validate(); err == nil {
			t.Errorf("%v: want an error", p)
		}
	}
}

func TestValidateStreamName(t *testing.T) {
	long := make([]byte, 129)
	for i := range long {
		long[i] = 'a'
	}
	for _, ok := range []string{"a", "orders", "orders.v1-eu_2", string(long[:128])} {
		if err := ValidateStreamName(ok); err != nil {
			t.Errorf("%q: unexpected %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "A", "a/b", "a b", string(long)} {
		if err := ValidateStreamName(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestParsePolicyTable(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Policy
	}{
		{"local_durable", Policy{Name: LocalDurable}},
		{"majority_durable", Policy{Name: MajorityDurable}},
		{"replica_durable:2", Policy{Name: ReplicaDurable, Nodes: 2}},
		{"replica_accepted:3", Policy{Name: ReplicaAccepted, Nodes: 3}},
		{"replica_durable(3)", Policy{Name: ReplicaDurable, Nodes: 3}},
		{"replica_accepted(1)", Policy{Name: ReplicaAccepted, Nodes: 1}},
		{"replica_durable:4294967295", Policy{Name: ReplicaDurable, Nodes: 1<<32 - 1}},
	} {
		got, err := ParsePolicy(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{
		"", "bogus", ":2", "(2)",
		"replica_durable", "replica_durable:", "replica_durable:0", "replica_durable:x", "replica_durable:-1", "replica_durable:+2",
		"replica_durable(2", "replica_durable(2))", "replica_durable:2)", "replica_durable:4294967296",
		"majority_durable:2", "local_durable(1)", "local_durable:0", "majority_durable(0)", "Majority_Durable", " majority_durable",
	} {
		if got, err := ParsePolicy(bad); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("ParsePolicy(%q) = %v, %v; want ErrInvalidPolicy", bad, got, err)
		}
	}
}

// What String prints reads back.
func TestParsePolicyReadsString(t *testing.T) {
	for _, p := range []Policy{{Name: LocalDurable}, {Name: MajorityDurable}, {Name: ReplicaDurable, Nodes: 2}, {Name: ReplicaAccepted, Nodes: 5}} {
		if got, err := ParsePolicy(p.String()); err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", p.String(), got, err, p)
		}
	}
}

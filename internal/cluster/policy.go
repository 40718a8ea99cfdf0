package cluster

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Policy names, as stamped on assignments and accepted by the API.
const (
	LocalDurable    = "local_durable"
	MajorityDurable = "majority_durable"
	ReplicaDurable  = "replica_durable"
	ReplicaAccepted = "replica_accepted"
)

// DefaultPolicy is the cluster assignment policy unless the controller is
// configured otherwise.
var DefaultPolicy = Policy{Name: MajorityDurable}

// Policy is a confirm policy as stamped on an assignment.
type Policy struct {
	Name  string `json:"name,omitempty"`
	Nodes int    `json:"nodes,omitempty"`
}

func (p Policy) String() string {
	switch p.Name {
	case ReplicaDurable, ReplicaAccepted:
		return fmt.Sprintf("%s(%d)", p.Name, p.Nodes)
	case "":
		return LocalDurable
	}
	return p.Name
}

// ErrInvalidPolicy is returned for a policy name or count that is not known.
var ErrInvalidPolicy = errors.New("cluster: invalid confirm policy")

// Validate checks that p is a policy the one rule for W understands. The
// zero Policy is valid: it is what an assignment placed before streams had a
// policy carries.
func (p Policy) Validate() error {
	switch p.Name {
	case "", LocalDurable, MajorityDurable:
		if p.Nodes != 0 {
			return fmt.Errorf("%w: %s takes no nodes count", ErrInvalidPolicy, p.Name)
		}
		return nil
	case ReplicaDurable, ReplicaAccepted:
		if p.Nodes < 1 {
			return fmt.Errorf("%w: %s needs nodes >= 1", ErrInvalidPolicy, p.Name)
		}
		return nil
	}
	return fmt.Errorf("%w: unknown policy %q (want local_durable, majority_durable, replica_durable or replica_accepted)", ErrInvalidPolicy, p.Name)
}

// ParsePolicy is the one reading of a confirm policy as an operator writes
// it (the controller's --default-policy, strandctl's --policy): NAME for
// local_durable and majority_durable, and NAME:N or NAME(N) for
// replica_durable and replica_accepted, so what String prints reads back.
// N is a decimal count of copies from 1 to 2^32-1 (the API's field is 32
// bits). The result is validated (Validate): an empty string, an unknown
// name, a malformed count, a count on a policy that takes none or a
// counted policy without one is ErrInvalidPolicy, naming what is wrong.
func ParsePolicy(s string) (Policy, error) {
	name, count, counted := s, "", false
	if i := strings.IndexAny(s, ":("); i >= 0 {
		name, count, counted = s[:i], s[i+1:], true
		if s[i] == '(' {
			var closed bool
			if count, closed = strings.CutSuffix(count, ")"); !closed {
				return Policy{}, fmt.Errorf("%w: %q: want NAME(N)", ErrInvalidPolicy, s)
			}
		}
	}
	if name == "" {
		return Policy{}, fmt.Errorf("%w: %q: no policy name", ErrInvalidPolicy, s)
	}
	p := Policy{Name: name}
	if counted {
		n, err := strconv.ParseUint(count, 10, 32)
		if err != nil || n == 0 {
			// A written count is a count of copies: 0 is never one, and
			// on a policy that takes no count it is still a count.
			return Policy{}, fmt.Errorf("%w: %q: nodes count %q is not a number from 1 to %d", ErrInvalidPolicy, s, count, uint32(1<<32-1))
		}
		p.Nodes = int(n)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// ConfirmRule is a stream's confirm rule: a record is confirmed once W of
// the E copies, the owner included, hold it durably. R is the seal threshold.
type ConfirmRule struct {
	E int
	W int
}

// R is how many copies a recovery must seal: any W copies and any R copies
// share at least one, since W + R = E + 1 (docs/protocol.md, "Safety argument").
func (c ConfirmRule) R() int { return c.E - c.W + 1 }

// StreamConfirmPolicy is the one rule for W (stream_confirm_policy,
// docs/protocol.md): it turns the policy stamped on an assignment with
// copies E into the stream's confirm rule. The broker confirms by it and the
// controller and recoverer derive R from it; no other code computes W or R,
// so the two sides cannot disagree (docs/protocol.md, "One rule for W").
//
//   - local_durable, and the zero policy, mean every copy: a replicated
//     stream has no owner-only mode.
//   - majority_durable is floor(E/2)+1.
//   - replica_durable(N) and replica_accepted(N) are N copies, capped at E;
//     an accepted count is read as a durable one.
//
// An unknown policy also means every copy: waiting for all copies is the
// only reading that cannot confirm a record a recovery could lose.
func StreamConfirmPolicy(p Policy, copies int) ConfirmRule {
	if copies < 1 {
		copies = 1
	}
	w := copies
	switch p.Name {
	case MajorityDurable:
		w = copies/2 + 1
	case ReplicaDurable, ReplicaAccepted:
		w = max(1, min(p.Nodes, copies))
	}
	return ConfirmRule{E: copies, W: w}
}

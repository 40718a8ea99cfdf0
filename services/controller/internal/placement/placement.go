// Package placement chooses which brokers hold a stream's copies. It is pure:
// the caller passes the live brokers and the copies each already holds.
package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrNotEnoughBrokers is returned when fewer eligible live brokers exist
// than copies asked for.
var ErrNotEnoughBrokers = errors.New("placement: not enough live brokers")

// Load is what placement knows about the cluster: the live brokers, how
// many copies and owned streams each holds, and the zone each is in.
type Load struct {
	Live   []string
	Copies map[string]int
	Owned  map[string]int
	// Zone is each broker's zone (its --zone). A broker missing from it,
	// or with "", counts as one zone shared by all such brokers, so a
	// cluster that sets no zones is placed by load alone.
	Zone map[string]string
	// Draining are brokers an operator drains: live, but they take no new
	// copy (docs/operating.md, "Draining a broker").
	Draining map[string]bool
}

// Pick chooses n distinct live brokers not in exclude. Copies are spread
// over zones first (docs/architecture.md, "Placement and zones"): each pick goes to a
// zone holding the fewest of the stream's copies so far, counting the live
// brokers in exclude (the stream's members, when a stream gains copies) and
// the brokers already picked; within that, fewest assigned copies first,
// ties by node id, so placement is deterministic and spreads load. A
// member that is not in Live covers no zone: the copy replacing it may go
// to its zone again.
func Pick(l Load, n int, exclude []string) ([]string, error) {
	var cand []string
	for _, node := range l.Live {
		if !l.Draining[node] && !slices.Contains(exclude, node) && !slices.Contains(cand, node) {
			cand = append(cand, node)
		}
	}
	if len(cand) < n {
		return nil, fmt.Errorf("%w: want %d, have %d", ErrNotEnoughBrokers, n, len(cand))
	}
	slices.SortFunc(cand, func(a, b string) int {
		if d := l.Copies[a] - l.Copies[b]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	if len(l.Zone) == 0 {
		return cand[:n], nil
	}
	// inZone counts the stream's copies per zone: its live members first.
	// A draining member is leaving, so it covers no zone: the copy that
	// replaces it may take its zone again.
	inZone := make(map[string]int)
	for _, m := range exclude {
		if slices.Contains(l.Live, m) && !l.Draining[m] {
			inZone[l.Zone[m]]++
		}
	}
	chosen := make([]string, 0, n)
	for range n {
		// cand is in load order, so the first candidate of a least
		// covered zone is the least loaded of them.
		best := -1
		for i, node := range cand {
			if best < 0 || inZone[l.Zone[node]] < inZone[l.Zone[cand[best]]] {
				best = i
			}
		}
		node := cand[best]
		chosen = append(chosen, node)
		inZone[l.Zone[node]]++
		cand = slices.Delete(cand, best, best+1)
	}
	return chosen, nil
}

// PickUpTo is Pick for as many as n brokers, fewer when fewer are eligible.
func PickUpTo(l Load, n int, exclude []string) []string {
	for ; n > 0; n-- {
		if got, err := Pick(l, n, exclude); err == nil {
			return got
		}
	}
	return nil
}

// Without returns l with nodes left out of Live: brokers that are
// registered but are not to be picked nor to count as covering a zone (a
// member being replaced, a broker not yet heard from). l itself is left as
// it is, so one load serves many streams.
func (l Load) Without(nodes []string) Load {
	if len(nodes) == 0 {
		return l
	}
	l.Live = slices.DeleteFunc(slices.Clone(l.Live), func(n string) bool { return slices.Contains(nodes, n) })
	return l
}

// Place chooses the owner and followers of a new stream with copies copies.
// The copies go to the brokers Pick chooses; among them the owner is the one
// owning fewest streams (then fewest copies, then node id), so owners, which
// take the publish load, spread too.
func Place(l Load, copies int) (owner string, followers []string, err error) {
	chosen, err := Pick(l, copies, nil)
	if err != nil {
		return "", nil, err
	}
	best := 0
	for i := 1; i < len(chosen); i++ {
		a, b := chosen[i], chosen[best]
		if l.Owned[a] < l.Owned[b] || (l.Owned[a] == l.Owned[b] && l.Copies[a] < l.Copies[b]) {
			best = i
		}
	}
	owner = chosen[best]
	for i, n := range chosen {
		if i != best {
			followers = append(followers, n)
		}
	}
	return owner, followers, nil
}

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

// Load is what placement knows about the cluster: the live brokers and how
// many copies and owned streams each holds.
type Load struct {
	Live   []string
	Copies map[string]int
	Owned  map[string]int
	// Draining are brokers an operator drains: live, but they take no new
	// copy (docs/operating.md, "Draining a broker").
	Draining map[string]bool
}

// Pick chooses n distinct live brokers not in exclude: fewest assigned copies
// first, ties by node id, so placement is deterministic and spreads copies.
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
	return cand[:n], nil
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

// Package rebalance holds the controller's planned ownership moves
// (docs/protocol.md, "Handover"): the handover of one stream to a chosen
// in-sync follower, the drain of a broker (its streams handed over, its
// copies replaced) and the loop that keeps owners balanced over the live,
// non-draining brokers. The decisions are pure functions of a snapshot;
// the moves go through the ordinary seal path, a pending recovery the
// recoverer commits, so a move that fails half way ends as an ordinary
// failover, never with two owners.
package rebalance

import (
	"cmp"
	"maps"
	"slices"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/attention"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// Owned is one stream as the plan sees it: its owner, and the followers a
// handover could move it to (in sync, on a live, non-draining broker).
type Owned struct {
	Stream  string
	Owner   string
	Targets []string
}

// Move is one handover of a plan.
type Move struct {
	Stream string
	From   string
	To     string
}

// Plan returns at most max handovers that bring the number of streams each
// broker owns within one of even, as far as the streams' in-sync
// followers allow: each move takes a stream from a broker owning most to
// one of its targets owning at least two fewer, the fewest first (then the
// lowest node id). Only brokers listed count; a stream whose owner is not
// listed is left alone. The plan is deterministic: the same input gives
// the same moves.
func Plan(brokers []string, streams []Owned, max int) []Move {
	owned := make(map[string]int, len(brokers))
	for _, b := range brokers {
		owned[b] = 0
	}
	byOwner := map[string][]Owned{}
	for _, s := range streams {
		if _, ok := owned[s.Owner]; ok {
			owned[s.Owner]++
			byOwner[s.Owner] = append(byOwner[s.Owner], s)
		}
	}
	for _, list := range byOwner {
		slices.SortFunc(list, func(a, b Owned) int { return cmp.Compare(a.Stream, b.Stream) })
	}
	order := slices.Clone(brokers)
	slices.Sort(order)
	order = slices.Compact(order)
	var moves []Move
	for len(moves) < max {
		slices.SortStableFunc(order, func(a, b string) int { return cmp.Or(-cmp.Compare(owned[a], owned[b]), cmp.Compare(a, b)) })
		m, ok := nextMove(order, owned, byOwner)
		if !ok {
			break
		}
		moves = append(moves, m)
		owned[m.From]--
		owned[m.To]++
		list := byOwner[m.From]
		// A stream moves once per plan: its followers' state after the
		// move is not known yet.
		byOwner[m.From] = slices.DeleteFunc(list, func(o Owned) bool { return o.Stream == m.Stream })
	}
	return moves
}

// nextMove finds the first move from the brokers owning most (order is by
// owned count, most first).
func nextMove(order []string, owned map[string]int, byOwner map[string][]Owned) (Move, bool) {
	for _, hi := range order {
		for _, s := range byOwner[hi] {
			best := ""
			for _, t := range s.Targets {
				n, ok := owned[t]
				if !ok || t == hi || n+1 >= owned[hi] {
					continue
				}
				if best == "" || n < owned[best] || (n == owned[best] && t < best) {
					best = t
				}
			}
			if best != "" {
				return Move{Stream: s.Stream, From: hi, To: best}, true
			}
		}
	}
	return Move{}, false
}

// Eligible returns the live, non-draining brokers: those owners are
// balanced over.
func Eligible(s *state.Snapshot) []string {
	return slices.DeleteFunc(s.LiveBrokers(), s.IsDraining)
}

// Targets returns the followers of stream a handover could move it to: in
// sync (attention's rule), on live, non-draining brokers, in the
// assignment's order. A stream with a pending recovery has none: it is
// moving already.
func Targets(s *state.Snapshot, stream string) []string {
	if _, pending := s.Recoveries[stream]; pending {
		return nil
	}
	r, ok := attention.JudgeReplication(s, stream, nil)
	if !ok {
		return nil
	}
	var out []string
	for _, c := range r.Members {
		if c.Role == cluster.RoleFollower && c.State == attention.InSync && s.Live(c.Node) && !s.IsDraining(c.Node) {
			out = append(out, c.Node)
		}
	}
	return out
}

// PlanOf is Plan over a snapshot: the streams replicated on the eligible
// brokers, each with its targets.
//
// A move takes a stream from a broker to one owning at least two fewer
// (nextMove), so when every eligible broker owns within one of every
// other there is none, and the targets, which judge every stream's
// copies, are not worked out: the balancing loop plans on a balanced
// cluster far more often than on any other, and at 10,000 streams the
// targets were most of an idle controller's work (docs/architecture.md,
// "Coordination only through etcd").
func PlanOf(s *state.Snapshot, max int) (moves []Move, owned map[string]int) {
	brokers := Eligible(s)
	owned = make(map[string]int, len(brokers))
	for _, b := range brokers {
		owned[b] = 0
	}
	for _, av := range s.Assignments {
		if n, ok := owned[av.Value.Owner]; ok {
			owned[av.Value.Owner] = n + 1
		}
	}
	if counts := slices.Collect(maps.Values(owned)); len(counts) == 0 || slices.Max(counts)-slices.Min(counts) < 2 {
		return nil, owned
	}
	var streams []Owned
	for name, av := range s.Assignments {
		if _, ok := owned[av.Value.Owner]; ok {
			streams = append(streams, Owned{Stream: name, Owner: av.Value.Owner, Targets: Targets(s, name)})
		}
	}
	return Plan(brokers, streams, max), owned
}

package transition

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// DefaultReplaceAfter is how long a member may be missing before the
// controller replaces it, unless configured otherwise (--replace-after).
const DefaultReplaceAfter = 10 * time.Minute

// ReasonReplace starts the reason of a pending recovery that replaces a
// missing member.
const ReasonReplace = "replace"

// Replacement is the plan for one member of an assignment whose broker is
// not live (docs/protocol.md, "Replacing a missing copy").
type Replacement struct {
	Node string
	// Since is when the controller first saw the member missing.
	Since time.Time
	// At is when the controller replaces it: Since plus --replace-after,
	// or Since when AtOnce.
	At time.Time
	// AtOnce is set when the stream cannot confirm with its live members
	// (fewer than W): waiting would only keep it refusing publishes.
	AtOnce bool
}

// Due reports whether the replacement is due at now.
func (r Replacement) Due(now time.Time) bool { return r.AtOnce || !now.Before(r.At) }

// CannotConfirm reports whether a's live members are fewer than W: the
// stream refuses every publish until a member returns or is replaced.
func CannotConfirm(s *state.Snapshot, a cluster.Assignment) bool {
	live := 0
	for _, m := range a.Members() {
		if s.Live(m) {
			live++
		}
	}
	return live < cluster.StreamConfirmPolicy(a.Policy, a.Copies()).W
}

// PlanReplacements returns a plan for every member of a whose broker is
// not live, ordered by since (then node): since says when the controller
// first saw each missing, zero when it has not (read as now). A
// single-copy stream has nothing to replace from and gets none.
//
// The clock is the controller leader's memory: a new leader starts it
// again, which only delays a replacement, never hastens one.
func PlanReplacements(s *state.Snapshot, a cluster.Assignment, since func(node string) time.Time, after time.Duration, now time.Time) []Replacement {
	if a.Copies() < 2 {
		return nil
	}
	if after <= 0 {
		after = DefaultReplaceAfter
	}
	atOnce := CannotConfirm(s, a)
	var out []Replacement
	for _, m := range a.Members() {
		if s.Live(m) {
			continue
		}
		r := Replacement{Node: m, AtOnce: atOnce}
		if since != nil {
			r.Since = since(m)
		}
		if r.Since.IsZero() {
			r.Since = now
		}
		r.At = r.Since.Add(after)
		if atOnce {
			r.At = r.Since
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y Replacement) int {
		return cmp.Or(x.Since.Compare(y.Since), cmp.Compare(x.Node, y.Node))
	})
	return out
}

// ReplacementCandidates returns up to n live brokers placement picks to
// take a copy of a's stream: never a member, never a broker whose
// heartbeat names the stream (it holds a copy already, left out of the
// assignment), never one in down, never one that has written no heartbeat
// yet (still starting).
func ReplacementCandidates(s *state.Snapshot, load placement.Load, a cluster.Assignment, n int, down []string) []string {
	// Brokers that may not take the copy are left out of the live set
	// rather than excluded: Pick counts the excluded live brokers as the
	// stream's members covering their zones, and these cover none (a member
	// lost by probe included), so the replacement keeps the stream's spread
	// over zones (docs/architecture.md, "Placement and zones").
	without := slices.Clone(down)
	for _, node := range s.LiveBrokers() {
		hb, ok := s.Heartbeats[node]
		if !ok {
			without = append(without, node)
			continue
		}
		if hb.Holds(a.Stream) && !a.Includes(node) {
			without = append(without, node)
		}
	}
	return placement.PickUpTo(load.Without(without), n, a.Members())
}

// ReplaceDecision is what the controller does about a's missing members at
// now.
type ReplaceDecision struct {
	// Remove are the members replaced now; Add the brokers that replace
	// them (fewer than Remove only for a lost owner's recovery of a stream
	// that cannot confirm, when placement found too few: it then shrinks,
	// which lets its live copies confirm again).
	Remove, Add []string
	// Drain are members left out even when they answer their seal: a
	// draining broker's copies (DecideDrain), where a removed member that
	// answers stays (cluster.Recovery, DrainedMembers and RemovedMembers).
	Drain []string
	// Next is a with Remove (or Drain) left out and Add added as followers.
	Next cluster.Assignment
	// FastPath is set when Next may commit without a seal
	// (cluster.IsFastPath); otherwise it goes through a pending recovery.
	FastPath bool
	// Waiting lists the due members left in place because no live broker
	// holding no copy was found.
	Waiting []string
}

// DecideReplacement decides which of plans to carry out at now: every due
// one that placement finds a replacement for (candidates, in placement's
// order), the earliest missing first. A due member with no replacement
// stays and waits: removing it would only lose a copy that may yet
// return, and would lower the copies new records are confirmed on.
//
// shrink is set only for the recovery of a lost owner: a missing member
// due at once (the stream cannot confirm) is then removed even without a
// replacement, as that recovery always left out copies that did not
// answer, so the stream confirms again on its live copies. A missing owner
// is removed only by that recovery, whose new owner is a live follower;
// Next and FastPath then mean nothing.
func DecideReplacement(a cluster.Assignment, plans []Replacement, candidates []string, now time.Time, shrink bool) ReplaceDecision {
	var d ReplaceDecision
	for _, p := range plans {
		if !p.Due(now) {
			continue
		}
		switch {
		case len(d.Add) < len(candidates):
			d.Remove = append(d.Remove, p.Node)
			d.Add = append(d.Add, candidates[len(d.Add)])
		case p.AtOnce && shrink:
			d.Remove = append(d.Remove, p.Node)
		default:
			d.Waiting = append(d.Waiting, p.Node)
		}
	}
	d.Next = replaced(a, d.Remove, d.Add)
	d.FastPath = len(d.Remove) > 0 && !slices.Contains(d.Remove, a.Owner) && cluster.IsFastPath(a, d.Next)
	return d
}

// DecideDrain decides the replacement of member, a follower of a on a
// draining broker, by the first of candidates (ReplacementCandidates;
// none: nothing to decide, Add is empty). member is drained, not removed:
// left out even though it answers its seal, which is safe because the
// recovery seals it like every old copy, so the promoted copy holds every
// record it confirmed (docs/protocol.md, "Safety argument"). It never takes
// the fast path: the drain always goes through a pending recovery
// (docs/operating.md, "Draining a broker").
func DecideDrain(a cluster.Assignment, member string, candidates []string) ReplaceDecision {
	d := ReplaceDecision{Drain: []string{member}, Add: slices.Clone(candidates[:min(1, len(candidates))])}
	d.Next = replaced(a, d.Drain, d.Add)
	return d
}

// replaced is a with the followers in out left out and add added.
func replaced(a cluster.Assignment, out, add []string) cluster.Assignment {
	a.Followers = slices.DeleteFunc(slices.Clone(a.Followers), func(f string) bool { return slices.Contains(out, f) })
	a.Followers = append(a.Followers, add...)
	return a
}

// ReplaceReason is the reason of a pending recovery that replaces the
// members of d.
func ReplaceReason(plans []Replacement, d ReplaceDecision, after time.Duration) string {
	var parts []string
	for _, p := range plans {
		if !slices.Contains(d.Remove, p.Node) {
			continue
		}
		if p.AtOnce {
			parts = append(parts, fmt.Sprintf("%s missing since %s and the stream cannot confirm without it", p.Node, p.Since.UTC().Format(time.RFC3339)))
		} else {
			parts = append(parts, fmt.Sprintf("%s missing since %s, past --replace-after %s", p.Node, p.Since.UTC().Format(time.RFC3339), after))
		}
	}
	by := "no replacement found"
	if len(d.Add) > 0 {
		by = "replaced by " + strings.Join(d.Add, ", ")
	}
	return fmt.Sprintf("%s: %s; %s", ReasonReplace, strings.Join(parts, "; "), by)
}

// WithReplacement makes rec, proposed for a's stream, remove d's members,
// drain d's drained ones and add d's replacements; Copies bounds the
// recovered assignment at a's copies, so a removed member that answers its
// seal after all keeps its place and its replacement stays out.
func WithReplacement(rec cluster.Recovery, a cluster.Assignment, d ReplaceDecision) cluster.Recovery {
	rec.RemovedMembers = slices.Clone(d.Remove)
	rec.DrainedMembers = slices.Clone(d.Drain)
	rec.AddedMembers = slices.Clone(d.Add)
	rec.Copies = a.Copies()
	return rec
}

// ProposeReplacement builds the pending recovery that carries out d for
// stream, whose owner is live: the proposed owner is the current owner,
// which the recoverer's pick prefers among copies tied at the furthest
// tails (cluster.FurthestPreferring), so a healthy owner keeps its stream.
// TransitionID and Created are left for the caller.
func ProposeReplacement(s *state.Snapshot, stream string, d ReplaceDecision, reason string) (cluster.Recovery, error) {
	av, ok := s.Assignments[stream]
	if !ok {
		return cluster.Recovery{}, ErrNoStream
	}
	if _, ok := s.Recoveries[stream]; ok {
		return cluster.Recovery{}, ErrPending
	}
	a := av.Value
	if !s.Live(a.Owner) {
		return cluster.Recovery{}, fmt.Errorf("%w: owner %s is not live; its recovery goes first", ErrNotLive, a.Owner)
	}
	policy := a.Policy
	if spec, ok := s.Streams[stream]; ok {
		policy = spec.Value.Policy
	}
	rec := cluster.Recovery{
		Stream:        stream,
		FromEpoch:     a.Epoch,
		FenceEpoch:    a.Epoch + 1,
		OldOwner:      a.Owner,
		OldFollowers:  slices.Clone(a.Followers),
		ProposedOwner: a.Owner,
		Policy:        policy,
		Reason:        reason,
	}
	return WithReplacement(rec, a, d), nil
}

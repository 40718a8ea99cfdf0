// Package pick holds the recovery worker's pure decisions (docs/protocol.md,
// "Stream failover"): whether a pending recovery still belongs to the assignment it
// was read with, the seal threshold R, the furthest sealed copy and its
// tie-break, when to wait instead of promoting, and the assignment and
// history starts one guarded commit writes. Nothing here talks to etcd or to
// a broker, so every rule is a table test away.
package pick

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/strandhq/strand/internal/cluster"
)

// ErrStale is returned when a pending recovery does not match the assignment
// read with it. The recoverer leaves such a recovery for the controller,
// which withdraws or rewrites it; committing it could move a stream from an
// assignment whose copies were never sealed.
var ErrStale = errors.New("pick: stale recovery")

// Check reports whether rec is a recovery of old, read at the same etcd
// revision together with history.
//
//   - The recovery starts from the assignment's epoch; any other epoch means
//     the assignment moved after the controller recorded it.
//   - Its old members are the assignment's copies, so sealing them seals
//     copies of the assignment whose W confirmed the records (docs/protocol.md,
//     "Safety argument").
//   - The fence epoch is past the old epoch, since sealing fences each copy
//     at the next epoch (docs/protocol.md, "Safety argument").
//   - No history start exists at or past the fence epoch, so the appended
//     start keeps the list ordered by epoch (docs/protocol.md, "The confirmed prefix").
//   - It names a transition: a seal carries it, and a newer transition at
//     the same fence epoch takes an existing seal over (docs/protocol.md,
//     "Withdrawing a recovery").
func Check(old cluster.Assignment, rec cluster.Recovery, history cluster.HistoryStarts) error {
	if rec.TransitionID == "" {
		return fmt.Errorf("%w: no transition id", ErrStale)
	}
	if rec.FromEpoch != old.Epoch {
		return fmt.Errorf("%w: recovery from epoch %d, assignment at epoch %d", ErrStale, rec.FromEpoch, old.Epoch)
	}
	if rec.FenceEpoch <= old.Epoch {
		return fmt.Errorf("%w: fence epoch %d not past assignment epoch %d", ErrStale, rec.FenceEpoch, old.Epoch)
	}
	if !sameMembers(old.Members(), rec.OldMembers()) {
		return fmt.Errorf("%w: recovery old members %v, assignment members %v", ErrStale, rec.OldMembers(), old.Members())
	}
	if latest, ok := history.Latest(); ok && latest.Epoch >= rec.FenceEpoch {
		return fmt.Errorf("%w: history already starts epoch %d, fence epoch %d", ErrStale, latest.Epoch, rec.FenceEpoch)
	}
	return nil
}

func sameMembers(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// Threshold is R for a recovery of old: the seal threshold of the confirm
// rule old's records were confirmed under, from the policy stamped on old
// and its copy count E. It comes from cluster.StreamConfirmPolicy, the one
// rule for W, so the recoverer cannot disagree with the broker that
// confirmed (docs/protocol.md, "One rule for W").
func Threshold(old cluster.Assignment) int {
	return cluster.StreamConfirmPolicy(old.Policy, old.Copies()).R()
}

// Answer is one copy's reply to a stream seal: the tails it was fenced at.
type Answer = cluster.Candidate

// Further reports whether a is ahead of b in the pick order, the one order
// of cluster.ComparePick (record tail, cursor event tail, lowest node id), so
// every recoverer and the controller's proposal pick the same copy.
func Further(a, b Answer) bool { return cluster.ComparePick(a, b) < 0 }

// Furthest returns the furthest answer; ok is false when there is none.
func Furthest(answers []Answer) (best Answer, ok bool) { return cluster.Furthest(answers) }

// Verdict is what a recovery does with one round of seal answers.
type Verdict int

const (
	// Promote commits the pick as the new owner.
	Promote Verdict = iota + 1
	// WaitQuorum waits because fewer than R copies answered: the answers
	// may not include a copy holding every confirmed record, and the stream
	// waits instead of guessing (docs/protocol.md, "Safety argument").
	WaitQuorum
	// WaitPrefix waits because the pick's record tail is below the latest
	// history start, the confirmed prefix (docs/protocol.md, "The confirmed prefix").
	WaitPrefix
)

func (v Verdict) String() string {
	switch v {
	case Promote:
		return "promote"
	case WaitQuorum:
		return "fewer than R copies answered"
	case WaitPrefix:
		return "waiting for the confirmed prefix"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Decision is the outcome of one seal round.
type Decision struct {
	Verdict Verdict
	// R is the seal threshold of the old assignment.
	R int
	// Sealed are the old copies that answered, in the old assignment's order.
	Sealed []string
	// Missing are the old copies that did not answer, in the same order.
	Missing []string
	// Pick is the furthest sealed copy (zero when none answered).
	Pick Answer
	// Start is the latest history start; HasStart is false for a stream
	// that has none yet.
	Start    cluster.HistoryStart
	HasStart bool
}

// Decide judges one round of seal answers for a recovery of old. Answers
// from nodes that hold no copy of old are ignored, and a node counts once.
//
// With at least R answers the furthest copy holds every record confirmed
// under old, since any W copies and any R copies share one and each copy's
// log is a prefix of the old owner's (docs/protocol.md, "Safety argument"). Sealing more
// than R only adds followers. Records confirmed before old lie below the
// latest history start, so a pick below it would lose them: the recovery
// waits for a copy at or past it (docs/protocol.md, "The confirmed prefix").
func Decide(old cluster.Assignment, history cluster.HistoryStarts, answers []Answer) Decision {
	return DecidePreferring(old, history, answers, "")
}

// DecideFor is Decide for the pending recovery rec: among sealed copies
// tied at the furthest tails it picks rec's proposed owner
// (cluster.FurthestPreferring), so a recovery that keeps a healthy owner
// (the replacement of a missing follower) leaves the stream where it is,
// and a handover, which pauses the owner until its target holds the same
// tails, promotes the target. It is a tie-break only: the pick is still a
// furthest copy (docs/protocol.md, "Handover").
func DecideFor(old cluster.Assignment, rec cluster.Recovery, history cluster.HistoryStarts, answers []Answer) Decision {
	return DecidePreferring(old, history, answers, rec.ProposedOwner)
}

// DecidePreferring is Decide with preferred as the last tie-break of the
// pick (cluster.FurthestPreferring).
func DecidePreferring(old cluster.Assignment, history cluster.HistoryStarts, answers []Answer, preferred string) Decision {
	byNode := make(map[string]Answer, len(answers))
	for _, a := range answers {
		if _, dup := byNode[a.Node]; !dup && old.Includes(a.Node) {
			byNode[a.Node] = a
		}
	}
	d := Decision{R: Threshold(old)}
	d.Start, d.HasStart = history.Latest()
	var sealed []Answer
	for _, node := range old.Members() {
		if slices.Contains(d.Sealed, node) || slices.Contains(d.Missing, node) {
			continue
		}
		if a, ok := byNode[node]; ok {
			d.Sealed = append(d.Sealed, node)
			sealed = append(sealed, a)
		} else {
			d.Missing = append(d.Missing, node)
		}
	}
	d.Pick, _ = cluster.FurthestPreferring(sealed, preferred)
	switch {
	case len(sealed) < d.R:
		d.Verdict = WaitQuorum
	case d.HasStart && d.Pick.RecordTail < d.Start.RecordTail:
		d.Verdict = WaitPrefix
	default:
		d.Verdict = Promote
	}
	return d
}

// Followers are the new assignment's followers: every old copy but the
// pick, in the old assignment's order, sealed or not, except those the
// proposal removes (RemovedMembers) that did not answer their seal, and
// those it drains (DrainedMembers), answered or not; then
// the members the proposal added that held no copy, in the proposal's
// order, while the assignment has fewer than rec.Copies copies (when set).
//
// An old copy that did not answer is kept: its broker is away, and when it
// returns it follows the new owner by the ordinary path, its longer tail
// cut at the new history start (docs/protocol.md, "Copies with a longer
// tail"), instead of the stream re-replicating onto another broker. The
// controller replaces it only once it has been missing for --replace-after
// (docs/protocol.md, "Replacing a missing copy"), through a recovery that
// removes it. A removed copy that answered its seal after all stays, and
// the copy bound then leaves its replacement out: the stream never grows
// past its copy count, and W with it. A drained copy is left out even when
// it answered: its broker is being emptied. Zero Copies lets every added
// member join: a change that grows the stream.
func Followers(old cluster.Assignment, rec cluster.Recovery, d Decision) []string {
	followers := []string{}
	add := func(node string) {
		if node != d.Pick.Node && !slices.Contains(followers, node) && !slices.Contains(rec.DrainedMembers, node) {
			followers = append(followers, node)
		}
	}
	for _, node := range old.Members() {
		if slices.Contains(rec.RemovedMembers, node) && !slices.Contains(d.Sealed, node) {
			continue
		}
		add(node)
	}
	for _, node := range rec.AddedMembers {
		if rec.Copies > 0 && 1+len(followers) >= rec.Copies {
			break
		}
		if node != "" && !old.Includes(node) {
			add(node)
		}
	}
	return followers
}

// Commit returns what the guarded commit of a Promote decision writes: the
// new assignment at the fence epoch owned by the pick, and the history
// starts with the pick's start appended, its record and cursor event tails
// at the new epoch (docs/protocol.md, "Stream failover"). The policy is the one the
// proposal carries, else the old assignment's; retention is kept.
func Commit(old cluster.Assignment, rec cluster.Recovery, history cluster.HistoryStarts, d Decision) (cluster.Assignment, cluster.HistoryStarts) {
	policy := old.Policy
	if rec.Policy != (cluster.Policy{}) {
		policy = rec.Policy
	}
	next := cluster.Assignment{
		Stream:    cmp.Or(old.Stream, rec.Stream),
		Epoch:     rec.FenceEpoch,
		Owner:     d.Pick.Node,
		Followers: Followers(old, rec, d),
		Policy:    policy,
		Retention: old.Retention,
		// The stream's incarnation carries over: same stream, new epoch.
		Incarnation: old.Incarnation,
	}
	starts := append(slices.Clone(history), cluster.HistoryStart{
		Epoch:           rec.FenceEpoch,
		RecordTail:      d.Pick.RecordTail,
		CursorEventTail: d.Pick.CursorEventTail,
		Node:            d.Pick.Node,
	})
	return next, starts
}

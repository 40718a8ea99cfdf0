package attention

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/state"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// States of a copy in a replication judgement, as named in admin.proto.
const (
	InSync  = "in_sync"
	Lagging = "lagging"
	Down    = "down"
	Missing = "missing"
)

// Copy is one copy's standing in a stream's replication.
type Copy struct {
	// Node is empty for a missing copy the controller cannot name.
	Node string
	// Role is owner or follower: the copy's role in the assignment, or the
	// one it had when a change of assignment left it out.
	Role  string
	State string
	Live  bool
	// Tails are what the copy last published, when Published.
	Tails     cluster.CopyTails
	Published bool
	// Lag is how far Tails' record tail is behind the owner's, when
	// LagKnown (both published).
	Lag      uint64
	LagKnown bool
	// Since is when the controller first saw the copy out of sync; zero
	// when in sync or not known.
	Since time.Time
	// LeftAt is the epoch of the assignment that left a missing copy out
	// (0 when not known).
	LeftAt uint64
}

// Replication is the judgement of one stream's copies: the members of its
// assignment, then the copies the spec counts that the assignment lacks.
type Replication struct {
	Stream string
	// Copies is E: the spec's copies (the assignment's when it has no spec).
	Copies int
	// InSync counts the copies in state InSync.
	InSync  int
	Members []Copy
	Missing []Copy
}

// Under reports whether the stream has fewer live, in-sync copies than E:
// it is under-replicated. A single-copy stream (E = 1) has no replicas to
// lack; its owner down is single_copy_owner_down.
func (r Replication) Under() bool { return r.Copies > 1 && r.InSync < r.Copies }

// JudgeReplication judges the copies of stream in s; ok is false when the
// stream has no assignment. mem, which may be nil, names the copies a change
// of assignment left out and says since when copies are out of sync.
//
// A member is in sync when its broker is registered, it published tails at
// the assignment's epoch (or sealed past it), and, for a follower, its record tail reaches the
// owner's published confirm watermark or is within cluster.InSyncSlack of the
// owner's record tail: it then holds (nearly) every confirmed record. A
// follower whose owner published nothing is taken as in sync: its lag
// cannot be measured, and the owner's own state says what is wrong.
func JudgeReplication(s *state.Snapshot, stream string, mem *Memory) (Replication, bool) {
	av, ok := s.Assignments[stream]
	if !ok {
		return Replication{}, false
	}
	a := av.Value
	r := Replication{Stream: stream, Copies: a.Copies()}
	if spec, ok := s.Streams[stream]; ok {
		r.Copies = spec.Value.Copies
	}
	owner, ownerOK := s.Tails(a.Owner, stream)
	r.Members = make([]Copy, 0, a.Copies())
	for _, node := range a.Members() {
		c := judgeMember(s, a, node, owner, ownerOK)
		if c.State == InSync {
			r.InSync++
		} else {
			c.Since = mem.since(stream, a.Incarnation, node)
		}
		r.Members = append(r.Members, c)
	}
	if slots := r.Copies - a.Copies(); slots > 0 {
		left := mem.left(stream, a)
		// The newest left-out copies name the slots; older ones were
		// replaced already.
		left = left[max(0, len(left)-slots):]
		for _, l := range slices.Backward(left) {
			c := Copy{Node: l.Node, Role: l.Role, State: Missing, Live: s.Live(l.Node), Since: l.Since, LeftAt: l.Epoch}
			c.Tails, c.Published = s.Tails(l.Node, stream)
			if c.Published && ownerOK {
				c.LagKnown = true
				if owner.RecordTail > c.Tails.RecordTail {
					c.Lag = owner.RecordTail - c.Tails.RecordTail
				}
			}
			r.Missing = append(r.Missing, c)
		}
		for range slots - len(left) {
			r.Missing = append(r.Missing, Copy{State: Missing})
		}
	}
	return r, true
}

// judgeMember judges one member of a, given the owner's tails (ownerOK
// when it published them): the one place the in-sync rule is written.
func judgeMember(s *state.Snapshot, a cluster.Assignment, node string, owner cluster.CopyTails, ownerOK bool) Copy {
	c := Copy{Node: node, Role: cluster.RoleFollower, Live: s.Live(node)}
	if node == a.Owner {
		c.Role = cluster.RoleOwner
	}
	c.Tails, c.Published = s.Tails(node, a.Stream)
	// A member whose broker is not live has no lag to measure: tails it
	// published before it went say nothing about what it holds now.
	if c.Published && ownerOK && c.Live {
		c.LagKnown = true
		if owner.RecordTail > c.Tails.RecordTail {
			c.Lag = owner.RecordTail - c.Tails.RecordTail
		}
	}
	switch {
	case !c.Live:
		c.State = Down
	case !c.Published || (c.Tails.Epoch != a.Epoch && c.Tails.SealEpoch <= a.Epoch):
		// A copy sealed past the assignment, for a pending recovery or
		// one withdrawn, is not behind: it holds its records and waits
		// for the recovery that takes the seal over, and attention
		// reports the wait itself.
		c.State = Lagging
	case node == a.Owner || !ownerOK || c.Tails.RecordTail >= owner.ConfirmWatermark || c.Lag <= cluster.InSyncSlack:
		c.State = InSync
	default:
		c.State = Lagging
	}
	return c
}

// judgeUnderReplicated returns the under_replicated entry of a stream with
// fewer live, in-sync copies than E.
func judgeUnderReplicated(s *state.Snapshot, a cluster.Assignment, mem *Memory) (Entry, bool) {
	r, ok := JudgeReplication(s, a.Stream, mem)
	if !ok || !r.Under() {
		return Entry{}, false
	}
	e := Entry{Stream: a.Stream, Kind: UnderReplicated}
	var parts []string
	unnamed := 0
	for _, c := range append(slices.Clone(r.Members), r.Missing...) {
		if c.State == InSync {
			continue
		}
		if !c.Since.IsZero() && (e.Since.IsZero() || c.Since.Before(e.Since)) {
			e.Since = c.Since
		}
		if c.Node == "" {
			unnamed++
			continue
		}
		e.Missing = append(e.Missing, c.Node)
		parts = append(parts, describeCopy(c, a))
	}
	if unnamed > 0 {
		parts = append(parts, fmt.Sprintf("%d not in the assignment (left out before this controller led)", unnamed))
	}
	e.Reason = fmt.Sprintf("%d of %d copies live and in sync at epoch %d; %s", r.InSync, r.Copies, a.Epoch, strings.Join(parts, "; "))
	e.Action = underReplicatedAction(s, a, r, mem)
	return e, true
}

func describeCopy(c Copy, a cluster.Assignment) string {
	var b strings.Builder
	switch c.State {
	case Down:
		fmt.Fprintf(&b, "%s copy on %s is down", c.Role, c.Node)
	case Missing:
		fmt.Fprintf(&b, "%s copy on %s was left out of the assignment", c.Role, c.Node)
		if c.LeftAt != 0 {
			fmt.Fprintf(&b, " at epoch %d", c.LeftAt)
		}
	case Lagging:
		switch {
		case !c.Published:
			fmt.Fprintf(&b, "%s copy on %s has published no tails", c.Role, c.Node)
		case c.Tails.Epoch != a.Epoch:
			fmt.Fprintf(&b, "%s copy on %s is at epoch %d, not %d", c.Role, c.Node, c.Tails.Epoch, a.Epoch)
		default:
			fmt.Fprintf(&b, "%s copy on %s is %d records behind", c.Role, c.Node, c.Lag)
		}
	}
	if !c.Since.IsZero() {
		fmt.Fprintf(&b, " (since %s)", c.Since.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// underReplicatedAction says what the controller will do about an
// under-replicated stream, and when: what the liveness loop does today
// (services/controller/internal/liveness), nothing more.
func underReplicatedAction(s *state.Snapshot, a cluster.Assignment, r Replication, mem *Memory) string {
	var replacing []string
	if rec, ok := s.Recoveries[a.Stream]; ok {
		replacing = append(slices.Clone(rec.Value.RemovedMembers), rec.Value.DrainedMembers...)
	}
	replace := replaceAction(s, a, mem, replacing)
	if rec, ok := s.Recoveries[a.Stream]; ok {
		out := fmt.Sprintf("the pending recovery to epoch %d goes first (see its entries); it keeps every copy it does not replace, and a returning copy rejoins as a follower", rec.Value.FenceEpoch)
		if len(replacing) > 0 {
			out += fmt.Sprintf("; it replaces %s", strings.Join(replacing, ", "))
			if len(rec.Value.AddedMembers) > 0 {
				out += " with " + strings.Join(rec.Value.AddedMembers, ", ")
			}
		}
		if replace != "" {
			out += "; after it: " + replace
		}
		return out
	}
	if !s.Live(a.Owner) {
		if a.Copies() == 1 {
			return "nothing: a single copy has nothing to fail over to; bring its broker back or accept the loss"
		}
		out := "the controller records a pending recovery at its next pass: the owner is lost; the recovery keeps the old owner as a follower, so it rejoins if its broker returns"
		if replace != "" {
			out += "; " + replace
		}
		return out
	}
	if len(r.Missing) > 0 {
		var spare []string
		for _, n := range s.LiveBrokers() {
			if _, started := s.Heartbeats[n]; started && !a.Includes(n) {
				spare = append(spare, n)
			}
		}
		if len(spare) == 0 {
			return "nothing: every live broker holds a copy already; one that registers, or a left-out copy whose broker comes back, is added on the fast path at the next pass"
		}
		grown := a
		grown.Followers = append(slices.Clone(a.Followers), spare[0])
		if !cluster.IsFastPath(a, grown) {
			return fmt.Sprintf("the controller records a pending recovery that adds followers at its next pass (%d live brokers hold no copy; one more copy raises W)", len(spare))
		}
		return fmt.Sprintf("the controller adds followers on the fast path at its next pass (%d live brokers hold no copy; each is probed first)", len(spare))
	}
	var lagging []string
	for _, c := range r.Members {
		if c.State == Lagging {
			lagging = append(lagging, c.Node)
		}
	}
	var out []string
	if replace != "" {
		out = append(out, replace)
	}
	if len(lagging) > 0 {
		out = append(out, fmt.Sprintf("a lagging copy (%s) catches up by following its owner; if its lag grows, look at its broker", strings.Join(lagging, ", ")))
	}
	if replace == "" {
		return "nothing: " + strings.Join(out, "; ")
	}
	return strings.Join(out, "; ")
}

// replaceAction says, for each member of a whose broker is not live, since
// when it is missing and when the controller replaces it
// (docs/protocol.md, "Replacing a missing copy"); empty when none is.
// replacing are the members a pending recovery replaces already.
func replaceAction(s *state.Snapshot, a cluster.Assignment, mem *Memory, replacing []string) string {
	now := time.Now()
	plans := transition.PlanReplacements(s, a, func(node string) time.Time { return mem.MissingSince(a.Stream, a.Incarnation, node) },
		mem.replaceWindow(), now)
	// Members a pending recovery replaces already are said by its caller.
	plans = slices.DeleteFunc(plans, func(p transition.Replacement) bool { return slices.Contains(replacing, p.Node) })
	if len(plans) == 0 {
		return ""
	}
	spare := false
	for _, n := range s.LiveBrokers() {
		hb, started := s.Heartbeats[n]
		if started && !hb.Holds(a.Stream) && !a.Includes(n) {
			spare = true
			break
		}
	}
	var out []string
	for _, p := range plans {
		since := p.Since.UTC().Format(time.RFC3339)
		switch {
		case p.AtOnce && spare:
			out = append(out, fmt.Sprintf("%s missing since %s: replacing now: the stream cannot confirm with its live members", p.Node, since))
		case p.AtOnce && !s.Live(a.Owner):
			out = append(out, fmt.Sprintf("%s missing since %s: replacing now: the stream cannot confirm with its live members; no live broker holds no copy, so the owner's recovery leaves it out and the stream goes on with its live copies", p.Node, since))
		case p.AtOnce:
			out = append(out, fmt.Sprintf("%s missing since %s: replacing now: the stream cannot confirm with its live members; but every live broker holds a copy, so it waits for one to register or for its broker to return", p.Node, since))
		case !spare:
			out = append(out, fmt.Sprintf("%s missing since %s: replace at %s, once a live broker holds no copy (every live broker holds one now); it rejoins as a follower if its broker returns first",
				p.Node, since, p.At.UTC().Format(time.RFC3339)))
		default:
			out = append(out, fmt.Sprintf("%s missing since %s: replace at %s, unless its broker returns first and it rejoins as a follower",
				p.Node, since, p.At.UTC().Format(time.RFC3339)))
		}
	}
	return strings.Join(out, "; ")
}

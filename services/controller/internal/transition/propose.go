// Package transition decides and commits changes to a stream's assignment:
// proposing a pending recovery when the owner is lost (docs/protocol.md,
// "Stream failover"), fast-path changes that commit without recovery, and an
// operator's accepted owner loss. Decisions are pure functions of a
// snapshot; commits are guarded etcd transactions.
package transition

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// Errors of the transition package; the RPC edge maps them to codes.
var (
	ErrNoStream       = errors.New("transition: no such stream")
	ErrPending        = errors.New("transition: a recovery is already pending")
	ErrNoRecovery     = errors.New("transition: no pending recovery")
	ErrNoCandidate    = errors.New("transition: no live copy to promote")
	ErrOwnerLive      = errors.New("transition: owner is live")
	ErrNotCopy        = errors.New("transition: node holds no copy of the stream")
	ErrNotLive        = errors.New("transition: node is not live")
	ErrNotFastPath    = errors.New("transition: change needs recovery")
	ErrSingleCopy     = errors.New("transition: single-copy stream has no copy to fail over to")
	ErrConflict       = errors.New("transition: state changed while committing")
	ErrDroppingCopies = errors.New("transition: dropping copies is not supported")
)

// Candidate is a copy that could be promoted, with the tails its broker last
// published in a heartbeat (zero when it published none).
// Candidate is a copy with the tails it last published.
type Candidate = cluster.Candidate

// Better orders candidates as the seal pick does (cluster.ComparePick).
func Better(a, b Candidate) int { return cluster.ComparePick(a, b) }

// Furthest returns the best candidate by the seal pick's order.
func Furthest(cands []Candidate) (Candidate, bool) { return cluster.Furthest(cands) }

// Candidates returns the live copies among nodes with their published tails.
func Candidates(s *state.Snapshot, stream string, nodes []string) []Candidate {
	var out []Candidate
	for _, n := range nodes {
		if !s.Live(n) {
			continue
		}
		t, _ := s.Tails(n, stream)
		out = append(out, Candidate{Node: n, RecordTail: t.RecordTail, CursorEventTail: t.CursorEventTail})
	}
	return out
}

// LoadOf is what placement needs from a snapshot.
func LoadOf(s *state.Snapshot) placement.Load {
	copies, owned := s.CopyCounts()
	return placement.Load{Live: s.LiveBrokers(), Copies: copies, Owned: owned, Zone: s.Zones(), Draining: DrainingOf(s)}
}

// CountProposals counts each pending recovery of s in load as owned by its
// proposed owner instead of its old owner: the recovery promotes it unless
// the sealed tails say otherwise. A liveness pass proposing for a mass
// failover counts this way the proposals of the passes before it, which
// s holds as pending recoveries, and spreads its own over the other
// survivors (ProposeRecoveryWith). LoadOf itself counts assignments only,
// as the admin's incremental counts (admin.loads) do.
func CountProposals(s *state.Snapshot, load placement.Load) {
	for stream, rv := range s.Recoveries {
		av, ok := s.Assignments[stream]
		if p := rv.Value.ProposedOwner; ok && p != "" && p != av.Value.Owner {
			load.Owned[p]++
			load.Owned[av.Value.Owner]--
		}
	}
}

// DrainingOf is the set of brokers an operator drains, for placement.
func DrainingOf(s *state.Snapshot) map[string]bool {
	out := make(map[string]bool, len(s.Draining))
	for n := range s.Draining {
		out[n] = true
	}
	return out
}

// ProposeRecovery builds the pending recovery for stream, whose current
// owner is to be replaced: lost lists members known lost beyond those whose
// broker key is gone (an owner whose probe failed). The proposed owner is the
// furthest live follower by its heartbeat tails. It adds no member: the
// recovered assignment keeps every old copy, the lost owner as a follower,
// so a copy that returns rejoins by the ordinary path and catches up from
// its own tail; a copy missing past --replace-after is replaced by a
// recovery of its own (docs/protocol.md, "Replacing a missing copy").
// TransitionID and Created are left for the caller.
func ProposeRecovery(s *state.Snapshot, stream string, lost []string, reason string) (cluster.Recovery, error) {
	// Nothing is placed, so no load is taken.
	return ProposeRecoveryWith(s, placement.Load{}, stream, lost, reason)
}

// ProposeRecoveryWith is ProposeRecovery for a caller proposing for many
// streams of one snapshot with its placement load taken already (with
// CountProposals). Among the live followers tied for furthest it proposes
// the one owning fewest streams, and counts the proposal in load, so a lost owner's streams
// spread over the survivors instead of all going to the follower whose
// id sorts first: that one broker would take on every seal answer, epoch
// advance and new follow of the failover, and the balancing would hand
// half of them over again a minute later. Tied copies hold the same
// records (docs/protocol.md, "Invariants"), so any of them is a correct
// owner; the proposal is only the recoverer's tie-break among sealed
// copies (pick.DecideFor). The proposal itself places nothing; the caller
// places replacements due now with WithReplacement.
func ProposeRecoveryWith(s *state.Snapshot, load placement.Load, stream string, lost []string, reason string) (cluster.Recovery, error) {
	av, ok := s.Assignments[stream]
	if !ok {
		return cluster.Recovery{}, ErrNoStream
	}
	a := av.Value
	if _, ok := s.Recoveries[stream]; ok {
		return cluster.Recovery{}, ErrPending
	}
	if a.Copies() < 2 {
		return cluster.Recovery{}, ErrSingleCopy
	}
	down := func(n string) bool { return !s.Live(n) || slices.Contains(lost, n) }
	var proposed string
	live := slices.DeleteFunc(Candidates(s, stream, a.Followers), func(c Candidate) bool { return down(c.Node) })
	if best, ok := Furthest(live); ok {
		proposed = best.Node
		for _, c := range live {
			if c.RecordTail == best.RecordTail && c.CursorEventTail == best.CursorEventTail && load.Owned[c.Node] < load.Owned[proposed] {
				proposed = c.Node
			}
		}
		if load.Owned != nil {
			load.Owned[proposed]++
			load.Owned[a.Owner]--
		}
	} else {
		// No follower is live: propose the lowest follower; the recovery
		// waits under attention until enough copies answer its seals.
		proposed = slices.Min(a.Followers)
	}
	policy := a.Policy
	if spec, ok := s.Streams[stream]; ok {
		policy = spec.Value.Policy
	}
	return cluster.Recovery{
		Stream:        stream,
		FromEpoch:     a.Epoch,
		FenceEpoch:    a.Epoch + 1,
		OldOwner:      a.Owner,
		OldFollowers:  slices.Clone(a.Followers),
		ProposedOwner: proposed,
		// The stream keeps its copy count: nothing is added here, and a
		// replacement added later replaces a removed copy.
		Copies: a.Copies(),
		Policy: policy,
		Reason: reason,
	}, nil
}

// NewTransitionID returns a random transition id.
func NewTransitionID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Stamp fills a proposed recovery's transition id and creation time.
func Stamp(r cluster.Recovery, now time.Time) cluster.Recovery {
	r.TransitionID = NewTransitionID()
	r.Created = now.UTC()
	return r
}

// AcceptedLoss is the outcome of an operator accepting owner loss.
type AcceptedLoss struct {
	Assignment cluster.Assignment
	// Start is the history start recorded for the new epoch; nil when the
	// new owner had published no tails for the stream.
	Start *cluster.HistoryStart
}

// AcceptLoss moves stream to node (or, when node is empty, the best live
// copy) without sealing (docs/limits.md): epoch + 1, the old owner left
// out, the other copies following. The start recorded is the new owner's tails
// as last published in its heartbeat, at the new epoch; none if it published
// nothing. A stream whose copies are all down moves to a live broker
// placement picks, starting empty: that is the loss the operator accepts.
func AcceptLoss(s *state.Snapshot, stream, node string) (AcceptedLoss, error) {
	av, ok := s.Assignments[stream]
	if !ok {
		return AcceptedLoss{}, ErrNoStream
	}
	a := av.Value
	if s.Live(a.Owner) {
		return AcceptedLoss{}, fmt.Errorf("%w: %s; fail over instead", ErrOwnerLive, a.Owner)
	}
	switch {
	case node != "":
		if !s.Live(node) {
			return AcceptedLoss{}, fmt.Errorf("%w: %s", ErrNotLive, node)
		}
		if !a.Includes(node) && a.Copies() > 1 {
			return AcceptedLoss{}, fmt.Errorf("%w: %s", ErrNotCopy, node)
		}
	default:
		if best, ok := Furthest(Candidates(s, stream, a.Followers)); ok {
			node = best.Node
		} else {
			picked, err := placement.Pick(LoadOf(s), 1, a.Members())
			if err != nil {
				return AcceptedLoss{}, ErrNoCandidate
			}
			node = picked[0]
		}
	}
	next := a
	next.Epoch = a.Epoch + 1
	if r, ok := s.Recoveries[stream]; ok {
		// Copies may already be sealed at the fence epoch; the new
		// assignment must be at or past it for them to release their seal.
		next.Epoch = max(next.Epoch, r.Value.FenceEpoch)
	}
	next.Owner = node
	next.Followers = slices.DeleteFunc(slices.Clone(a.Followers), func(f string) bool { return f == node })
	if spec, ok := s.Streams[stream]; ok {
		next.Policy = spec.Value.Policy
	}
	out := AcceptedLoss{Assignment: next}
	if t, ok := s.Tails(node, stream); ok {
		out.Start = &cluster.HistoryStart{Epoch: next.Epoch, RecordTail: t.RecordTail, CursorEventTail: t.CursorEventTail, Node: node}
	}
	return out, nil
}

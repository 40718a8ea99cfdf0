package cluster

import (
	"cmp"
	"slices"
)

// Candidate is a copy as the furthest-copy pick sees it: the controller's
// proposal judges from heartbeat tails, the recoverer from seal answers.
type Candidate struct {
	Node            string
	RecordTail      uint64
	CursorEventTail uint64
}

// ComparePick is the one order of the seal pick (docs/protocol.md, "Stream failover"):
// the highest record tail, then the highest cursor event tail, then the
// lowest node id in byte-wise order, so every party picks the same copy from
// the same tails. It is negative when a is picked before b.
func ComparePick(a, b Candidate) int {
	return cmp.Or(
		-cmp.Compare(a.RecordTail, b.RecordTail),
		-cmp.Compare(a.CursorEventTail, b.CursorEventTail),
		cmp.Compare(a.Node, b.Node),
	)
}

// Furthest returns the candidate ComparePick puts first; ok is false when
// there is none.
func Furthest(cands []Candidate) (Candidate, bool) {
	if len(cands) == 0 {
		return Candidate{}, false
	}
	return slices.MinFunc(cands, ComparePick), true
}

// FurthestPreferring is Furthest with one tie-break before the node id:
// among the candidates tied with the furthest on both tails, preferred is
// picked when it is one of them. The furthest rule is unchanged: copies
// tied on the record tail and the cursor event tail hold the same records
// and cursor events (docs/protocol.md, "Invariants", prefixes), so any of
// them holds every confirmed record. A recovery prefers its proposed owner
// this way, so a recovery that keeps a healthy owner (a replacement, a
// handover) does not move the stream to a follower that merely caught up
// and sorts first by node id (docs/protocol.md, "Stream failover"). An
// empty preferred is Furthest.
func FurthestPreferring(cands []Candidate, preferred string) (Candidate, bool) {
	best, ok := Furthest(cands)
	if !ok || preferred == "" || best.Node == preferred {
		return best, ok
	}
	for _, c := range cands {
		if c.Node == preferred && c.RecordTail == best.RecordTail && c.CursorEventTail == best.CursorEventTail {
			return c, true
		}
	}
	return best, true
}

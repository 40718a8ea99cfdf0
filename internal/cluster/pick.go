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

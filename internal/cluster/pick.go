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

// FurthestPreferring is Furthest with one more tie-break: among the
// candidates tied with the furthest on both tails, preferred wins when it
// is one of them (docs/protocol.md, "Handover"). The furthest rule itself
// is unchanged, so a preference never picks a copy behind another: a
// handover or a replacement names the copy it wants, and gets it only when
// that copy holds everything the furthest does.
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

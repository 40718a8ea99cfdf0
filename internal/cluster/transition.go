package cluster

import "slices"

// IsFastPath reports whether changing a stream from assignment old to
// assignment next may commit directly, without a pending recovery (docs/protocol.md,
// "The fast path": a change that keeps the owner and every follower and
// needs no more copies to confirm commits without recovery).
//
// It holds when next keeps old's owner, keeps every old follower (it may add
// followers) and confirms with W' <= W, both taken from the one rule for W.
// A record confirmed on W old copies then meets any E' - W' + 1 new copies,
// since the W old copies are all still members and W + E' - W' + 1 > E', so
// new copies may start empty and catch up. Dropping a copy, changing the
// owner or raising W needs a recovery.
//
// A fast-path change keeps the epoch: nothing is sealed or fenced, and
// brokers pick up the new follower set and policy from their assignment watch.
func IsFastPath(old, next Assignment) bool {
	if old.Owner != next.Owner {
		return false
	}
	for _, f := range old.Followers {
		if !slices.Contains(next.Followers, f) {
			return false
		}
	}
	w := StreamConfirmPolicy(old.Policy, old.Copies()).W
	wNext := StreamConfirmPolicy(next.Policy, next.Copies()).W
	return wNext <= w
}

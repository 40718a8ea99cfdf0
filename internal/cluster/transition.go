package cluster

import "slices"

// IsFastPath reports whether changing a stream from assignment old to
// assignment next may commit directly, at the same epoch, without a
// pending recovery (docs/protocol.md, "The fast path" and "Removing a
// copy").
//
// It holds when next keeps old's owner and, with k the old followers next
// leaves out, confirms with W' <= W - k, both W taken from the one rule for
// W. Followers next adds start empty and catch up from the owner.
//
// Why: a record confirmed under old is on W of old's copies, and at least
// W - k of them are still members of next. A later recovery of next seals
// R' = E' - W' + 1 of next's copies, and (W - k) + R' > E' exactly when
// W' <= W - k, so the sealed copies meet a holder of every confirmed
// record. With k = 0 this is the plain fast path: keep every copy, add
// followers, do not raise W. A change that fails the rule, or changes the
// owner, needs a recovery: sealing R copies of old finds every confirmed
// record whatever the new membership (docs/protocol.md, "Safety
// argument"), and the history start it records makes a later recovery wait
// for a copy at it (docs/protocol.md, "The confirmed prefix").
//
// A fast-path change keeps the epoch: nothing is sealed or fenced, and
// brokers pick up the new follower set and policy from their assignment watch.
func IsFastPath(old, next Assignment) bool {
	if old.Owner != next.Owner {
		return false
	}
	removed := 0
	for _, f := range old.Followers {
		if !slices.Contains(next.Followers, f) {
			removed++
		}
	}
	w := StreamConfirmPolicy(old.Policy, old.Copies()).W
	wNext := StreamConfirmPolicy(next.Policy, next.Copies()).W
	return wNext <= w-removed
}

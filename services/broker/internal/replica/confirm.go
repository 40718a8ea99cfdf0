package replica

import (
	"slices"
	"sync"

	"github.com/strandhq/strand/internal/cluster"
)

// confirmTracker computes an owner's confirm watermark: the record tail below
// which W copies, the owner included, hold every record durably.
type confirmTracker struct {
	mu        sync.Mutex
	rule      cluster.ConfirmRule
	followers []string
	ownerTail uint64
	acks      map[string]uint64
	watermark uint64
	changed   chan struct{}
	// onAdvance, when set, is called with each new watermark under mu:
	// the owner records it in storage there, so retention (which only
	// drops confirmed records) runs on owners too and a restarted copy
	// knows what was confirmed.
	onAdvance func(uint64)
}

func newConfirmTracker(rule cluster.ConfirmRule, followers []string, ownerTail, watermark uint64) *confirmTracker {
	t := &confirmTracker{
		rule:      rule,
		followers: slices.Clone(followers),
		ownerTail: ownerTail,
		acks:      make(map[string]uint64),
		watermark: min(watermark, ownerTail),
		changed:   make(chan struct{}),
	}
	t.recomputeLocked()
	return t
}

// setMembers applies a fast-path change (followers added, W lowered) at the
// same epoch.
func (t *confirmTracker) setMembers(rule cluster.ConfirmRule, followers []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rule = rule
	t.followers = slices.Clone(followers)
	t.recomputeLocked()
}

func (t *confirmTracker) ownerDurable(tail uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tail > t.ownerTail {
		t.ownerTail = tail
	}
	t.recomputeLocked()
}

func (t *confirmTracker) followerDurable(node string, tail uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !slices.Contains(t.followers, node) {
		return
	}
	if tail > t.acks[node] {
		t.acks[node] = tail
	}
	t.recomputeLocked()
}

// recomputeLocked takes the W-th highest durable tail. Followers that have
// not reported count as holding nothing, so the watermark never runs ahead
// of what W copies hold. It only moves forward: a record once shown as
// confirmed stays confirmed.
func (t *confirmTracker) recomputeLocked() {
	tails := make([]uint64, 0, 1+len(t.followers))
	tails = append(tails, t.ownerTail)
	for _, f := range t.followers {
		tails = append(tails, min(t.acks[f], t.ownerTail))
	}
	slices.Sort(tails)
	slices.Reverse(tails)
	w := max(1, t.rule.W)
	var wm uint64
	if w <= len(tails) {
		wm = tails[w-1]
	}
	if wm > t.watermark {
		t.watermark = wm
		close(t.changed)
		t.changed = make(chan struct{})
		if t.onAdvance != nil {
			t.onAdvance(wm)
		}
	}
}

// get returns the watermark and a channel closed when it next moves.
func (t *confirmTracker) get() (uint64, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark, t.changed
}

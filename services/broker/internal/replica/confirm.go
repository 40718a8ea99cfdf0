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
	// evAcks are the followers' acknowledged cursor event tails, and
	// acked is closed and replaced on every acknowledgement: a handover
	// waits on them for its target (handover.go). They count for nothing
	// toward the watermark.
	evAcks    map[string]uint64
	acked     chan struct{}
	watermark uint64
	changed   chan struct{}
	// onAdvance, when set, is called with each new watermark under mu:
	// the owner records it in storage there, so retention (which only
	// drops confirmed records) runs on owners too and a restarted copy
	// knows what was confirmed.
	onAdvance func(uint64)
	// watchers are told each new watermark under mu: the follows this
	// owner serves, whose call's sender ships it to their followers
	// (followServer.noteWatermark), so a moving watermark wakes no
	// goroutine per stream.
	watchers map[*servedFollow]struct{}
}

// watch has w told every new watermark until unwatch; it returns the
// watermark now, which w has not been told.
func (t *confirmTracker) watch(w *servedFollow) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.watchers == nil {
		t.watchers = make(map[*servedFollow]struct{})
	}
	t.watchers[w] = struct{}{}
	return t.watermark
}

func (t *confirmTracker) unwatch(w *servedFollow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.watchers, w)
}

func newConfirmTracker(rule cluster.ConfirmRule, followers []string, ownerTail, watermark uint64) *confirmTracker {
	t := &confirmTracker{
		rule:      rule,
		followers: slices.Clone(followers),
		ownerTail: ownerTail,
		acks:      make(map[string]uint64),
		evAcks:    make(map[string]uint64),
		acked:     make(chan struct{}),
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
	t.signalAckLocked()
}

// followerEvents takes a follower's durable cursor event tail.
func (t *confirmTracker) followerEvents(node string, tail uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !slices.Contains(t.followers, node) {
		return
	}
	if tail > t.evAcks[node] {
		t.evAcks[node] = tail
	}
	t.signalAckLocked()
}

func (t *confirmTracker) signalAckLocked() {
	close(t.acked)
	t.acked = make(chan struct{})
}

// follower returns a follower's acknowledged tails and a channel closed
// on the next acknowledgement.
func (t *confirmTracker) follower(node string) (recordTail, eventTail uint64, next <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.acks[node], t.evAcks[node], t.acked
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
		for w := range t.watchers {
			w.noteWatermark(wm)
		}
	}
}

// get returns the watermark and a channel closed when it next moves.
func (t *confirmTracker) get() (uint64, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark, t.changed
}

package coord

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// historyWatchWait bounds how long a History call at a revision waits for
// the history watch to reach it before it reads etcd instead. A new
// epoch's assignment and its history start are one transaction, so the
// watch brings the start with, or just after, the assignment that asks for
// it; a transaction that wrote no start (an accepted loss whose new owner
// published no tails) is covered by a progress notification, which etcd
// sends once the watch has every event up to its revision. The read
// after the bound is the one History made before the watch: slower, never
// wrong.
const historyWatchWait = 250 * time.Millisecond

// historyProgressEvery spaces the progress requests of the History calls
// waiting together: one notification answers every waiter.
const historyProgressEvery = 10 * time.Millisecond

// historyWatch keeps every stream's history starts as the broker's watch
// of the history directory delivers them, so a copy taking a role at an
// assignment's revision finds its stream's starts here instead of reading
// etcd: after a mass failover those reads were thousands at once, behind
// the recoveries' commits, and most of the time from a commit to the new
// role (docs/protocol.md, "Copies with a longer tail"; docs/etcd-schema.md,
// "Reads").
//
// The values are kept as etcd holds them and decoded when asked for: a
// broker holds copies of a fraction of the streams, and an unreadable value
// must fail only its own stream's read, as a read of etcd would.
type historyWatch struct {
	mu sync.Mutex
	// rev is the revision the values are complete at: every event at or
	// below it is applied. 0 while no listing is in force (before the
	// first, and after a watch ended until the next): then nothing is
	// answered from here.
	rev    int64
	values map[string][]byte
	// moved is closed and replaced whenever rev advances or the watch
	// stops (wake).
	moved chan struct{}
	// watching is the running watch's context, nil when none: a progress
	// request goes on the watch's own stream. askedAt is when the last
	// one was sent.
	watching context.Context
	askedAt  time.Time
}

func newHistoryWatch() *historyWatch {
	return &historyWatch{moved: make(chan struct{})}
}

// advance raises rev to r and wakes the waiters. The caller holds h.mu.
func (h *historyWatch) advance(r int64) {
	if r <= h.rev {
		return
	}
	h.rev = r
	h.wake()
}

// wake wakes every call waiting in at, to look again. The caller holds h.mu.
func (h *historyWatch) wake() {
	close(h.moved)
	h.moved = make(chan struct{})
}

// list replaces every value with a listing's, complete at rev, which the
// watch of ctx goes on from.
func (h *historyWatch) list(ctx context.Context, values map[string][]byte, rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.values, h.watching = values, ctx
	h.rev = 0
	h.advance(rev)
}

// apply applies one watch response: its events (each stream's key put or
// deleted at the event's revision), then, for a progress notification,
// the revision etcd says every event up to has been sent. An ordinary
// response's header revision is not used: a watch catching up may send
// the store's current revision with events still to come.
func (h *historyWatch) apply(dir string, wr clientv3.WatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.values == nil {
		return
	}
	top := h.rev
	for _, ev := range wr.Events {
		top = max(top, ev.Kv.ModRevision)
		stream, err := cluster.NameIn(dir, string(ev.Kv.Key))
		if err != nil {
			continue
		}
		if ev.Type == clientv3.EventTypeDelete {
			delete(h.values, stream)
			continue
		}
		h.values[stream] = ev.Kv.Value
	}
	if wr.IsProgressNotify() {
		top = max(top, wr.Header.GetRevision())
	}
	h.advance(top)
}

// stop marks the values stale: the watch ended, so later writes may be
// missing until the next listing. Calls waiting for the watch are woken,
// to read etcd now rather than at the end of their wait.
func (h *historyWatch) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.values, h.rev, h.watching = nil, 0, nil
	h.wake()
}

// askProgress asks etcd, on the running watch's stream, to say how far the
// watch is, unless a request went out within historyProgressEvery.
func (h *historyWatch) askProgress(w clientv3.Watcher) {
	h.mu.Lock()
	ctx := h.watching
	if ctx == nil || time.Since(h.askedAt) < historyProgressEvery {
		h.mu.Unlock()
		return
	}
	h.askedAt = time.Now()
	h.mu.Unlock()
	// A request that fails is a notification that does not come: the
	// waiter reads etcd at its bound.
	_ = w.RequestProgress(ctx)
}

// at returns stream's history starts as of a revision at or past atLeast,
// waiting up to wait for the watch to reach it. If no event has brought it
// there within a tenth of wait, it calls progress (so etcd says how far the
// watch is when no event is coming). ok is false when the watch did not
// reach atLeast in time, or no listing is in force: the caller reads etcd.
// A missing key is an empty list; an unreadable value is an error for this
// stream alone, as the read's would be.
func (h *historyWatch) at(ctx context.Context, stream string, atLeast int64, wait time.Duration, progress func()) (_ cluster.HistoryStarts, ok bool, err error) {
	var deadline, ask *time.Timer
	for {
		h.mu.Lock()
		if h.values != nil && h.rev >= atLeast {
			v, found := h.values[stream]
			h.mu.Unlock()
			if !found {
				return nil, true, nil
			}
			starts, err := cluster.Decode[cluster.HistoryStarts](v)
			if err != nil {
				return nil, true, fmt.Errorf("coord: history starts of %s: %w", stream, err)
			}
			return starts, true, nil
		}
		listed, moved := h.values != nil, h.moved
		h.mu.Unlock()
		if !listed {
			return nil, false, nil
		}
		if deadline == nil {
			deadline, ask = time.NewTimer(wait), time.NewTimer(wait/10)
			defer deadline.Stop()
			defer ask.Stop()
		}
		select {
		case <-moved:
		case <-ask.C:
			if progress != nil {
				progress()
			}
		case <-deadline.C:
			return nil, false, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

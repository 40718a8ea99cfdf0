package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/strandhq/strand/services/controller/internal/state"
)

// freshWait bounds one shared read of a fresh snapshot; a call waiting on
// it gives up sooner when its own context ends.
const freshWait = 10 * time.Second

// fresh shares View.Fresh between the calls that want a snapshot at once.
// Each Fresh is a linearizable read of etcd's revision, a wait for the
// view to reach it, and, when the view lags by more than a second, a read
// of the whole prefix: under a flood of calls, one of each per call made
// a lagging controller read the cluster once per call, which lagged it
// further. Here at most one Fresh runs; the calls arriving meanwhile wait
// for the next one, which starts after they arrived, so each still gets a
// snapshot holding every write finished before it (what lead promises).
type fresh struct {
	view *state.View

	mu sync.Mutex
	// running is set while a Fresh runs; next is the one the calls that
	// arrived since wait for (nil when none waits).
	running bool
	next    *freshRead
}

// freshRead is one shared Fresh: its outcome, once done is closed.
type freshRead struct {
	done chan struct{}
	snap *state.Snapshot
	err  error
}

// get returns a snapshot at least as new as etcd's revision when get was
// called.
func (f *fresh) get(ctx context.Context) (*state.Snapshot, error) {
	f.mu.Lock()
	r := f.next
	if r == nil {
		r = &freshRead{done: make(chan struct{})}
		f.next = r
		if !f.running {
			f.startLocked()
		}
	}
	f.mu.Unlock()
	select {
	case <-r.done:
		if r.err != nil && ctx.Err() == nil && errors.Is(r.err, context.DeadlineExceeded) {
			// The shared read ran out of its own time, not the caller's:
			// etcd did not answer, which the caller is told as
			// Unavailable (toConnect's answer to what no row maps), not
			// as its deadline passing; so the cause is not wrapped.
			return nil, fmt.Errorf("admin: no fresh snapshot within %v: %v", freshWait, r.err)
		}
		return r.snap, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("admin: waiting for a fresh snapshot: %w", ctx.Err())
	}
}

// startLocked starts the waiting read; when it ends, the one the calls
// arriving meanwhile wait for starts.
func (f *fresh) startLocked() {
	r := f.next
	f.next, f.running = nil, true
	go func() {
		// No caller's context: the read serves every call waiting on it,
		// and each of them stops waiting when its own context ends.
		ctx, cancel := context.WithTimeout(context.Background(), freshWait)
		r.snap, r.err = f.view.Fresh(ctx)
		cancel()
		close(r.done)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.running = false
		if f.next != nil {
			f.startLocked()
		}
	}()
}

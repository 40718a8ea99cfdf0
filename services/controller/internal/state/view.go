package state

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
)

// View keeps the controller's Snapshot current from etcd's watch instead
// of reading the whole prefix for every change: it loads once at revision
// R, watches from R+1 and applies each event, with the decoding Load uses.
// A watch that ends (a disconnect, a lost etcd leader) is opened again from
// the last revision the view holds, so no event is missed; only a watch
// that reports its revision compacted makes the view load again. A key
// deleted in a gap covered by that load is then simply absent, which is
// what every reader of a snapshot takes a delete to mean.
//
// Snapshots a View hands out are never changed afterwards: the view
// applies events to a snapshot of its own, and copies a part of it (the
// brokers, the assignments, ...) before the first change after a snapshot
// sharing it was handed out. Readers may keep a snapshot as long as they
// like without locks.
type View struct {
	cli    *clientv3.Client
	schema cluster.Schema
	log    zerolog.Logger

	mu sync.Mutex
	// cur is the view's own snapshot (nil before the first load), changed
	// only under mu; shared are its parts that pub shares.
	cur    *Snapshot
	shared part
	// pub is the last snapshot handed out; it is handed out again while
	// nothing changed since.
	pub *Snapshot
	// changed is closed, and replaced, whenever cur changes.
	changed chan struct{}
	// wctx is the context the current watch runs in: a progress request
	// must go on the same stream.
	wctx context.Context
	// loads counts full loads, for tests.
	loads int
	// trackers follow the streams each change concerns (Track).
	trackers []*Changes

	// freshMu guards the shared fresh read (Fresh): freshRunning is set
	// while one runs, freshNext is the one the calls that arrived since
	// wait for (nil when none waits).
	freshMu      sync.Mutex
	freshRunning bool
	freshNext    *freshRead
}

// Timings of the view: a watch that ended is opened again after retry,
// doubling to maxRetry while it keeps failing; a waiter for a revision
// asks etcd for the watch's progress every progressEvery.
const (
	retry         = 100 * time.Millisecond
	maxRetry      = 2 * time.Second
	progressEvery = 100 * time.Millisecond
)

// NewView returns a view of schema's prefix; Run keeps it current.
func NewView(cli *clientv3.Client, schema cluster.Schema, log zerolog.Logger) *View {
	return &View{cli: cli, schema: schema, log: log, changed: make(chan struct{})}
}

// Run loads and watches until ctx ends.
func (v *View) Run(ctx context.Context) error {
	backoff := retry
	load := true
	for {
		if load {
			snap, err := Load(ctx, v.cli, v.schema)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				v.log.Warn().Err(err).Dur("backoff", backoff).Msg("view: cannot read the cluster; reading again after the backoff")
				if !wait(ctx, &backoff) {
					return ctx.Err()
				}
				continue
			}
			v.install(snap)
		}
		compacted, progressed := v.watch(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		load = compacted
		if progressed || compacted {
			backoff = retry
			continue
		}
		if !wait(ctx, &backoff) {
			return ctx.Err()
		}
	}
}

// wait waits out *backoff and doubles it; false when ctx ended first.
func wait(ctx context.Context, backoff *time.Duration) bool {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	*backoff = min(2**backoff, maxRetry)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// install replaces the view's snapshot with a loaded one.
func (v *View) install(snap *Snapshot) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.cur, v.shared, v.pub = snap, partNone, nil
	v.loads++
	for _, c := range v.trackers {
		// What changed in a gap a load covers is not known.
		c.pending.addAll()
	}
	v.notifyLocked()
}

// watch follows the prefix from the revision after the view's until the
// watch ends. It reports whether the watch ended because that revision was
// compacted (the view must load again), and whether it delivered anything.
func (v *View) watch(ctx context.Context) (compacted, progressed bool) {
	// Requiring a leader ends the watch when the member it runs on loses
	// touch with the cluster, instead of waiting on it silently.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	v.mu.Lock()
	from := v.cur.Rev + 1
	v.wctx = wctx
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		v.wctx = nil
		v.mu.Unlock()
	}()
	wch := v.cli.Watch(wctx, v.schema.Prefix()+"/", clientv3.WithPrefix(), clientv3.WithRev(from))
	for resp := range wch {
		if resp.CompactRevision != 0 {
			v.log.Info().Int64("revision", from).Int64("compact_revision", resp.CompactRevision).
				Msg("view: the watch's revision was compacted; reading the cluster again")
			return true, progressed
		}
		if err := resp.Err(); err != nil {
			v.log.Info().Err(err).Msg("view: the watch ended; watching again from the last revision held")
			return false, progressed
		}
		v.applyResponse(resp)
		progressed = true
	}
	return false, progressed
}

// applyResponse applies one watch response. etcd never splits one
// revision's events across responses, so the view is at a revision after
// each.
func (v *View) applyResponse(resp clientv3.WatchResponse) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var cs *changeSet
	if len(v.trackers) > 0 {
		cs = &changeSet{}
	}
	for _, ev := range resp.Events {
		var kv *mvccpb.KeyValue
		if ev.Type == clientv3.EventTypePut {
			kv = ev.Kv
		}
		v.cur.apply(v.schema, string(ev.Kv.Key), kv, v.ownLocked, cs)
		v.cur.Rev = ev.Kv.ModRevision
	}
	if cs != nil {
		for _, c := range v.trackers {
			c.pending.merge(cs)
		}
	}
	// A progress notification says every event up to its revision was
	// delivered. The header of a response with events says nothing of the
	// kind: catching up, etcd sends at most so many revisions in one
	// response, with the current revision in the header.
	if resp.IsProgressNotify() && resp.Header.Revision > v.cur.Rev {
		v.cur.Rev = resp.Header.Revision
	}
	v.notifyLocked()
}

// ownLocked copies the parts p of the view's snapshot that a handed-out
// snapshot shares, before they change.
func (v *View) ownLocked(p part) {
	if s := v.shared & p; s != 0 {
		v.cur.unshare(s)
		v.shared &^= s
	}
}

func (v *View) notifyLocked() {
	v.pub = nil
	close(v.changed)
	v.changed = make(chan struct{})
}

// snapshotLocked hands out the view's snapshot: a shallow copy sharing
// every part, which the view copies before changing.
func (v *View) snapshotLocked() *Snapshot {
	if v.cur == nil {
		return nil
	}
	if v.pub == nil {
		pub := *v.cur
		v.pub = &pub
		v.shared = partAll
	}
	return v.pub
}

// Current returns the view's snapshot (nil before the first load) and a
// channel closed once the view holds a newer one.
func (v *View) Current() (*Snapshot, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.snapshotLocked(), v.changed
}

// Loads reports how many times the view read the whole prefix.
func (v *View) Loads() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.loads
}

// WaitRev returns the view's snapshot once it is at revision rev or later.
// Events move the view on by themselves; a revision written outside the
// prefix is reached through a progress notification, which it asks for.
func (v *View) WaitRev(ctx context.Context, rev int64) (*Snapshot, error) {
	for {
		v.mu.Lock()
		if v.cur != nil && v.cur.Rev >= rev {
			snap := v.snapshotLocked()
			v.mu.Unlock()
			return snap, nil
		}
		changed, wctx := v.changed, v.wctx
		v.mu.Unlock()
		if wctx != nil {
			// An error means the watch is ending; the next one is asked.
			_ = v.cli.RequestProgress(wctx)
		}
		t := time.NewTimer(progressEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("state: view at revision %d: %w", rev, ctx.Err())
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// freshWait bounds each step of a shared fresh read (Fresh): reading
// etcd's current revision and waiting for the watch to reach it share one,
// and the direct read of the prefix that stands in for a watch that did
// not get there in time has one of its own. It is the one bound of a fresh
// snapshot in the controller, for admin calls and the liveness loop alike:
// long enough for a watch catching up on a flood of writes (a direct read
// of a large prefix costs more than the wait), short enough that a call
// learns of an etcd it cannot reach while the caller still waits. A caller
// whose own context ends sooner stops waiting then.
const freshWait = 2 * time.Second

// freshRead is one shared fresh read: its outcome, once done is closed.
type freshRead struct {
	done chan struct{}
	snap *Snapshot
	err  error
}

// Fresh returns a snapshot at least as new as etcd's revision when Fresh
// was called, so it holds every write that finished before the call: what
// an admin call reads after a write it or another call made, and what the
// liveness loop waits for after its own writes.
//
// Calls at once share one read: at most one runs, and the calls arriving
// meanwhile wait for the next one, which starts after they arrived, so
// each still gets a snapshot holding every write finished before it. Each
// read is a linearizable read of etcd's revision, a wait for the view to
// reach it and, when the watch does not get there within freshWait, a
// read of the whole prefix: one of each per call made a lagging
// controller read the cluster once per call under a flood of calls, which
// lagged it further.
func (v *View) Fresh(ctx context.Context) (*Snapshot, error) {
	v.freshMu.Lock()
	r := v.freshNext
	if r == nil {
		r = &freshRead{done: make(chan struct{})}
		v.freshNext = r
		if !v.freshRunning {
			v.startFreshLocked()
		}
	}
	v.freshMu.Unlock()
	select {
	case <-r.done:
		if r.err != nil && ctx.Err() == nil && errors.Is(r.err, context.DeadlineExceeded) {
			// The shared read ran out of its own time, not the caller's:
			// etcd did not answer. The cause is not wrapped, so that the
			// caller does not take it for its own deadline passing (an
			// admin call answers it Unavailable).
			return nil, fmt.Errorf("state: no fresh snapshot within %v: %v", freshWait, r.err)
		}
		return r.snap, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("state: waiting for a fresh snapshot: %w", ctx.Err())
	}
}

// startFreshLocked starts the waiting read; when it ends, the one the
// calls arriving meanwhile wait for starts.
func (v *View) startFreshLocked() {
	r := v.freshNext
	v.freshNext, v.freshRunning = nil, true
	go func() {
		// No caller's context: the read serves every call waiting on it,
		// and each of them stops waiting when its own context ends.
		r.snap, r.err = v.freshRead()
		close(r.done)
		v.freshMu.Lock()
		defer v.freshMu.Unlock()
		v.freshRunning = false
		if v.freshNext != nil {
			v.startFreshLocked()
		}
	}()
}

// freshRead is one read of Fresh, each step within freshWait.
func (v *View) freshRead() (*Snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), freshWait)
	defer cancel()
	// A count of one key is the cheapest linearizable read; its header
	// carries the current revision.
	resp, err := v.cli.Get(ctx, v.schema.Prefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("state: read the current revision: %w", err)
	}
	if snap, err := v.WaitRev(ctx, resp.Header.Revision); err == nil {
		return snap, nil
	}
	v.log.Warn().Int64("revision", resp.Header.Revision).Dur("waited", freshWait).
		Msg("view: the watch did not reach the current revision in time; read the cluster directly")
	lctx, lcancel := context.WithTimeout(context.Background(), freshWait)
	defer lcancel()
	return Load(lctx, v.cli, v.schema)
}

package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/gather"
	"github.com/strandhq/strand/internal/logging"
)

// errDeposed is reported when a commit finds the leader key gone.
var errDeposed = errors.New("worker: leader key lost")

// term is the work of one leadership term: one task per stream with a
// pending recovery.
type term struct {
	w      *Worker
	leader Leader
	ctx    context.Context
	// depose ends the term when a commit finds the leader key gone.
	depose context.CancelCauseFunc

	// slots holds one token per attempt in flight (Config.MaxInFlight).
	slots chan struct{}
	// commits carries the promotions the attempts decided to the term's
	// committer (runCommits), which writes them in batches.
	commits chan commitReq
	// reads gathers the snapshot reads of the attempts in flight into
	// read-only transactions of many streams (snapshots.go).
	reads *gather.Gatherer[snapshotRead, snapshot]

	mu    sync.Mutex
	tasks map[string]*task
	// committed maps a stream whose task ended with its own commit to the
	// commit's revision, until the watch brings back that commit's delete
	// of the recovery key (or a later change): that event is the task's
	// own write, not a change to read (ensure). A listing clears it.
	committed map[string]int64
	// watchFrom is the revision of the listing the recoveries watch runs
	// from: it brings only events past it.
	watchFrom int64
	wg        sync.WaitGroup

	// senders gathers the seals of the rounds in flight per broker
	// address into SealMany calls (sealsend.go).
	sendersMu sync.Mutex
	senders   map[string]*sealSender
}

// lead runs one leadership term until ctx ends or the leader key is lost.
// It lists /recoveries/, watches the prefix from the revision of that list
// and starts a task for each pending recovery; a compacted or broken watch
// is recovered by listing again. Broker registrations changing wake every
// task, since a copy that was missing may now answer its seal.
func (w *Worker) lead(ctx context.Context, leader Leader) error {
	ctx, depose := context.WithCancelCause(ctx)
	t := &term{w: w, leader: leader, ctx: ctx, depose: depose, tasks: map[string]*task{}, committed: map[string]int64{}, slots: make(chan struct{}, w.cfg.MaxInFlight), commits: make(chan commitReq),
		reads: newSnapshotReader(w.cfg.Client, w.cfg.Schema)}
	// Every task, watch and read stops before the term ends: nothing of a
	// term runs on into the next one. The reads are waited for last, once
	// no task is left to start one.
	defer t.reads.Wait()
	defer t.wg.Wait()
	defer depose(nil)

	t.wg.Add(3)
	go func() { defer t.wg.Done(); t.watchLeaderKey() }()
	go func() { defer t.wg.Done(); t.watchBrokers() }()
	go func() { defer t.wg.Done(); t.runCommits() }()
	for ctx.Err() == nil {
		if err := t.syncRecoveries(); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Warn().Err(err).Msg("recoveries watch broken; listing them again")
			if !sleepCtx(ctx, w.cfg.BackoffMin) {
				break
			}
		}
	}
	if cause := context.Cause(ctx); errors.Is(cause, errDeposed) {
		return cause
	}
	return nil
}

// syncRecoveries lists the pending recoveries and follows the watch from the
// list's revision until the watch breaks (compaction, error) or ctx ends.
func (t *term) syncRecoveries() error {
	cli, dir := t.w.cfg.Client, t.w.cfg.Schema.RecoveriesDir()
	resp, err := cli.Get(t.ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("worker: list recoveries: %w", err)
	}
	t.mu.Lock()
	clear(t.committed) // the watch these awaited events of is gone
	t.watchFrom = resp.Header.Revision
	t.mu.Unlock()
	for _, kv := range resp.Kvs {
		t.ensure(string(kv.Key), resp.Header.Revision)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(t.ctx))
	defer cancel()
	wch := cli.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wresp := range wch {
		if err := wresp.Err(); err != nil {
			return fmt.Errorf("worker: watch recoveries: %w", err)
		}
		for _, ev := range wresp.Events {
			// A delete's Kv carries the deleting revision as its mod
			// revision.
			t.ensure(string(ev.Kv.Key), ev.Kv.ModRevision)
		}
	}
	if t.ctx.Err() != nil {
		return nil
	}
	return errors.New("worker: recoveries watch closed")
}

// watchBrokers wakes every task when a broker registers, re-registers or
// goes away: a copy that did not answer may answer now.
func (t *term) watchBrokers() {
	cli, dir := t.w.cfg.Client, t.w.cfg.Schema.BrokersDir()
	for t.ctx.Err() == nil {
		wch := cli.Watch(clientv3.WithRequireLeader(t.ctx), dir, clientv3.WithPrefix())
		for wresp := range wch {
			if wresp.Err() != nil {
				break
			}
			if len(wresp.Events) > 0 {
				t.forgetSenders()
				t.kickAll()
			}
		}
		// A broken watch may have missed changes; waking every task once
		// costs one retry each.
		t.forgetSenders()
		t.kickAll()
		if !sleepCtx(t.ctx, t.w.cfg.BackoffMin) {
			return
		}
	}
}

// watchLeaderKey ends the term if the leader key is deleted while the
// session still lives (an operator, or a lease revoked elsewhere). Commits
// are guarded by the key anyway; this stops the seals too.
func (t *term) watchLeaderKey() {
	cli := t.w.cfg.Client
	rev := t.leader.Rev
	for t.ctx.Err() == nil {
		wch := cli.Watch(clientv3.WithRequireLeader(t.ctx), t.leader.Key, clientv3.WithRev(rev))
		for wresp := range wch {
			if wresp.CompactRevision != 0 || wresp.Err() != nil {
				break
			}
			for _, ev := range wresp.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != t.leader.Rev {
					t.depose(errDeposed)
					return
				}
			}
			rev = wresp.Header.Revision + 1
		}
		if t.ctx.Err() != nil {
			return
		}
		// The watch broke: check the key directly before watching again.
		resp, err := cli.Get(t.ctx, t.leader.Key)
		if err == nil {
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.leader.Rev {
				t.depose(errDeposed)
				return
			}
			rev = resp.Header.Revision + 1
		}
		if !sleepCtx(t.ctx, t.w.cfg.BackoffMin) {
			return
		}
	}
}

// task finishes the pending recovery of one stream.
type task struct {
	stream string
	// kick wakes the task from a wait, or makes it read again before it
	// exits; it holds at most one pending wake.
	kick chan struct{}
	log  zerolog.Logger
	// wakeRev, under term.mu, is the newest revision of the recovery key's
	// events (the listing's revision for a key listed) that woke the task
	// since it last took it (takeWake), 0 when none did. The task's next
	// read is at or past it, and a task that found nothing left to do reads
	// again only for such a wake past what it read or wrote (finish).
	wakeRev int64
	// brokersChanged, under term.mu, is set when a broker registered or
	// went away since the task last read: its next read is linearizable,
	// to see the registrations. It alone never makes a finished task read
	// again: the recovery key did not change.
	brokersChanged bool
}

// wake notes a change of the task's recovery key at rev and wakes the
// task. Callers hold term.mu.
func (k *task) wake(rev int64) {
	k.wakeRev = max(k.wakeRev, rev)
	k.poke()
}

func (k *task) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// ensure wakes the task of the stream whose recovery key changed at rev,
// starting one if none runs.
func (t *term) ensure(key string, rev int64) {
	stream, err := cluster.NameIn(t.w.cfg.Schema.RecoveriesDir(), key)
	if err != nil {
		t.w.cfg.Logger.Warn().Err(err).Msg("ignoring a key under recoveries that names no stream")
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if k, ok := t.tasks[stream]; ok {
		k.wake(rev)
		return
	}
	if at, ok := t.committed[stream]; ok {
		// The watch is in revision order: once an event at or past the
		// commit came, no older one will.
		if rev >= at {
			delete(t.committed, stream)
		}
		if rev <= at {
			return // the ended task's own commit, or older
		}
	}
	if t.ctx.Err() != nil {
		return
	}
	k := &task{
		stream:  stream,
		kick:    make(chan struct{}, 1),
		log:     t.w.cfg.Logger.With().Str(logging.Stream, stream).Logger(),
		wakeRev: rev,
	}
	t.tasks[stream] = k
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.run(k)
	}()
}

func (t *term) kickAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range t.tasks {
		k.brokersChanged = true
		k.poke()
	}
}

// takeWake returns the revision the task's next read must be at or past
// (0: linearizable) and clears the wakes it covers. After a change of the
// brokers, or with no wake since the last read (a retry after a wait), the
// read is linearizable, as every read of a task was before reads named
// revisions.
func (t *term) takeWake(k *task) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	rev := k.wakeRev
	if k.brokersChanged {
		rev = 0
	}
	k.wakeRev, k.brokersChanged = 0, false
	return rev
}

// finish removes a task that found nothing left to do, unless a wake came
// in since it read, past covered (the revision it read at, or that of its
// own commit when committed): then the recovery key may have changed after
// its read and it must read again. A wake at or below covered is already
// in what the task read or wrote: the delete of the recovery key by its
// own commit, which the watch brings back after every commit, before the
// task ends or after (term.committed), is one. Checking under
// the lock that ensure takes means a change is seen either by this task or
// by a new one.
func (t *term) finish(k *task, covered int64, committed bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-k.kick:
	default:
	}
	if k.wakeRev > covered {
		return false
	}
	delete(t.tasks, k.stream)
	if committed && k.wakeRev < covered && covered > t.watchFrom {
		// Its delete of the recovery key has not come back yet (the watch
		// is in revision order, and that delete is the key's only event at
		// covered) and the running watch will bring it (a watch started
		// after it never will): ensure must not start a task to read it.
		t.committed[k.stream] = covered
	}
	return true
}

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
	reads *gather.Gatherer[string, snapshot]

	mu    sync.Mutex
	tasks map[string]*task
	wg    sync.WaitGroup

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
	t := &term{w: w, leader: leader, ctx: ctx, depose: depose, tasks: map[string]*task{}, slots: make(chan struct{}, w.cfg.MaxInFlight), commits: make(chan commitReq),
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
	for _, kv := range resp.Kvs {
		t.ensure(string(kv.Key))
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(t.ctx))
	defer cancel()
	wch := cli.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wresp := range wch {
		if err := wresp.Err(); err != nil {
			return fmt.Errorf("worker: watch recoveries: %w", err)
		}
		for _, ev := range wresp.Events {
			t.ensure(string(ev.Kv.Key))
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
}

func (k *task) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// ensure wakes the task of the stream whose recovery key changed, starting
// one if none runs.
func (t *term) ensure(key string) {
	stream, err := cluster.NameIn(t.w.cfg.Schema.RecoveriesDir(), key)
	if err != nil {
		t.w.cfg.Logger.Warn().Err(err).Msg("ignoring a key under recoveries that names no stream")
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if k, ok := t.tasks[stream]; ok {
		k.poke()
		return
	}
	if t.ctx.Err() != nil {
		return
	}
	k := &task{
		stream: stream,
		kick:   make(chan struct{}, 1),
		log:    t.w.cfg.Logger.With().Str(logging.Stream, stream).Logger(),
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
		k.poke()
	}
}

// finish removes a task that found nothing left to do, unless a wake came
// in since it read: then the recovery key may have changed after its read
// and it must read again. Checking under the lock that ensure takes means a
// change is seen either by this task or by a new one.
func (t *term) finish(k *task) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-k.kick:
		return false
	default:
	}
	delete(t.tasks, k.stream)
	return true
}

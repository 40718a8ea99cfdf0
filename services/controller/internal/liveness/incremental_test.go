package liveness

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/state"
)

// incFixture is three live brokers and the streams "s" and "t", both owned
// by b1 at epoch 1, with a view and a term for a loop.
type incFixture struct {
	t      *testing.T
	ctx    context.Context
	cli    *clientv3.Client
	schema cluster.Schema
	view   *state.View
	term   *leader.Term
}

func newIncFixture(t *testing.T) *incFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cli := etcdtest.Start(t).Client(t)
	schema := cluster.NewSchema("/strand")
	for _, n := range []string{"b1", "b2", "b3"} {
		if _, err := cli.Put(ctx, schema.BrokerKey(n), cluster.Encode(cluster.BrokerInfo{Node: n, Address: n + ":1"})); err != nil {
			t.Fatal(err)
		}
	}
	pol := cluster.Policy{Name: cluster.MajorityDurable}
	var rev int64
	for _, s := range []string{"s", "t"} {
		if _, err := cli.Put(ctx, schema.StreamKey(s), cluster.Encode(cluster.StreamSpec{Name: s, Copies: 3, Policy: pol})); err != nil {
			t.Fatal(err)
		}
		put, err := cli.Put(ctx, schema.AssignmentKey(s), cluster.Encode(cluster.Assignment{Stream: s, Epoch: 1, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: pol}))
		if err != nil {
			t.Fatal(err)
		}
		rev = put.Header.Revision
	}
	el, err := cli.Put(ctx, schema.ControllerElection()+"/term", "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	f := &incFixture{t: t, ctx: ctx, cli: cli, schema: schema,
		term: leader.NewTerm(cli, schema.ControllerElection()+"/term", el.Header.Revision, make(chan struct{}))}
	f.view = state.NewView(cli, schema, zerolog.Nop())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = f.view.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	if _, err := f.view.WaitRev(ctx, rev); err != nil {
		t.Fatal(err)
	}
	return f
}

// loop is a loop on the fixture's view whose probes all pass, with no
// resync due and a full pass every fullResync.
func (f *incFixture) loop(fullResync time.Duration) *loop {
	return newLoop(Config{View: f.view, Schema: f.schema, Log: zerolog.Nop(), ProbeGrace: time.Second,
		Probe: func(context.Context, string) error { return nil }, Resync: time.Hour, FullResync: fullResync}, f.term)
}

// runPastFirstPass runs l until the test ends and returns once its first
// pass (a full one) has begun.
func (f *incFixture) runPastFirstPass(l *loop) {
	first := make(chan struct{}, 1)
	l.cfg.Pass = func(*state.Snapshot, []string, bool) {
		select {
		case first <- struct{}{}:
		default:
		}
	}
	f.run(l)
	<-first
}

// run runs l until the test ends.
func (f *incFixture) run(l *loop) {
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { _ = l.run(ctx); close(done) }()
	f.t.Cleanup(func() { stop(); <-done })
}

// standDown writes b1's heartbeat shard of stream naming b1 itself suspect
// at epoch 1: the owner stands down, which the loop takes for a lost owner.
func (f *incFixture) standDown(stream string) {
	f.t.Helper()
	shard := cluster.HeartbeatShard(stream)
	hb := cluster.Heartbeat{Node: "b1", Shard: shard, Time: time.Now(), Streams: map[string]cluster.CopyTails{
		stream: {Epoch: 1, Role: cluster.RoleOwner, Suspect: "b1"},
	}}
	if _, err := f.cli.Put(f.ctx, f.schema.HeartbeatKey("b1", shard), cluster.Encode(hb)); err != nil {
		f.t.Fatal(err)
	}
}

// standDownRecovered stands stream's owner down and waits for the pending
// recovery that replaces it.
func (f *incFixture) standDownRecovered(stream string) {
	f.t.Helper()
	from := f.rev() + 1
	f.standDown(stream)
	f.waitRecovery(stream, from)
}

// waitRecovery waits for stream's pending recovery and checks it replaces b1.
func (f *incFixture) waitRecovery(stream string, from int64) {
	f.t.Helper()
	wch := f.cli.Watch(f.ctx, f.schema.RecoveryKey(stream), clientv3.WithRev(from))
	select {
	case resp := <-wch:
		if err := resp.Err(); err != nil || len(resp.Events) == 0 {
			f.t.Fatalf("watching for the recovery of %s: %v", stream, err)
		}
		r, err := cluster.Decode[cluster.Recovery](resp.Events[0].Kv.Value)
		if err != nil {
			f.t.Fatal(err)
		}
		if r.OldOwner != "b1" || r.ProposedOwner == "b1" {
			f.t.Fatalf("recovery %+v, want b1 replaced", r)
		}
	case <-f.ctx.Done():
		f.t.Fatalf("no pending recovery recorded for %s", stream)
	}
}

func (f *incFixture) rev() int64 {
	f.t.Helper()
	resp, err := f.cli.Get(f.ctx, "/none")
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Header.Revision
}

// passLog holds the streams each incremental pass of a loop looked at.
type passLog struct {
	mu     sync.Mutex
	passes [][]string
}

// recordPasses makes l's incremental passes record their streams.
func recordPasses(l *loop) *passLog {
	pl := &passLog{}
	l.incremental = func(streams []string) []string {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		pl.passes = append(pl.passes, slices.Clone(streams))
		return streams
	}
	return pl
}

// check fails t unless an incremental pass looked at acted and none at
// skipped (why names what happened to skipped).
func (pl *passLog) check(t *testing.T, acted, skipped, why string) {
	t.Helper()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	saw := false
	for _, p := range pl.passes {
		if slices.Contains(p, skipped) {
			t.Errorf("an incremental pass looked at %s, %s: %v", skipped, why, p)
		}
		saw = saw || slices.Contains(p, acted)
	}
	if !saw {
		t.Fatalf("no incremental pass looked at %s (passes %v): the recovery came from elsewhere", acted, pl.passes)
	}
}

// An incremental pass looks at the streams whose keys changed, not at
// every stream, and acts on what it finds there: the owner of a changed
// stream standing down is a lost owner, and its pending recovery is
// recorded with neither a full pass nor a resync due.
func TestIncrementalPassActsOnChangedStream(t *testing.T) {
	f := newIncFixture(t)
	l := f.loop(time.Hour)
	passes := recordPasses(l)
	full := make(chan struct{}, 1)
	l.cfg.Pass = func(*state.Snapshot, []string, bool) {
		select {
		case full <- struct{}{}:
		default:
		}
	}
	f.run(l)
	<-full // the first pass, a full one: nothing to do
	f.standDownRecovered("s")
	passes.check(t, "s", "t", "whose keys never changed")
}

// A copy that only progressed (its tails moved, as every copy's do under
// publish load) is no reason for a pass to look at its stream again: no
// judgement of the loop reads progress. Its stream is left to the full
// pass, while another stream's status change is acted on as before.
func TestIncrementalPassSkipsProgress(t *testing.T) {
	f := newIncFixture(t)
	l := f.loop(time.Hour)
	passes := recordPasses(l)
	// t's owner reports its copy, and the view holds that before the
	// loop's first (full) pass; then it only moves its tails. t and s
	// hash to other shards, so s's heartbeat leaves t's status alone.
	if cluster.HeartbeatShard("t") == cluster.HeartbeatShard("s") {
		t.Fatal("s and t share a heartbeat shard; pick other names")
	}
	shard := cluster.HeartbeatShard("t")
	status := func(tail uint64) int64 {
		t.Helper()
		hb := cluster.Heartbeat{Node: "b1", Shard: shard, Time: time.Now(), Streams: map[string]cluster.CopyTails{
			"t": {Epoch: 1, Role: cluster.RoleOwner, RecordTail: tail, ConfirmWatermark: tail},
		}}
		resp, err := f.cli.Put(f.ctx, f.schema.HeartbeatKey("b1", shard), cluster.Encode(hb))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	if _, err := f.view.WaitRev(f.ctx, status(0)); err != nil {
		t.Fatal(err)
	}
	f.runPastFirstPass(l)
	for tail := range uint64(3) {
		status(tail + 1)
	}
	f.standDownRecovered("s")
	passes.check(t, "s", "t", "whose copy only progressed")
}

// A stream under watch for what is not a key of its own (here a member
// whose broker is gone, judged again as time passes) is looked at once a
// Resync, not by every pass a change of another stream brings: with a
// broker gone, that was every stream it holds a copy of at every pass.
func TestWatchedStreamsWaitForTheResync(t *testing.T) {
	f := newIncFixture(t)
	l := f.loop(time.Hour) // and a Resync of an hour
	passes := recordPasses(l)
	// The revision of the latest pass over every stream, set as each
	// begins (its snapshot taken). Never a blocking send: the hook runs
	// on the loop, which must not wait for the test.
	var allRev atomic.Int64
	l.cfg.Pass = func(snap *state.Snapshot, _ []string, all bool) {
		if all {
			allRev.Store(snap.Rev)
		}
	}
	f.run(l)
	// b3 goes: a pass over every stream, which leaves s and t under
	// watch for their missing member. The stand-down below comes after
	// that pass took its snapshot, so a later pass sees it.
	del, err := f.cli.Delete(f.ctx, f.schema.BrokerKey("b3"))
	if err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 30*time.Second, "a pass over every stream after b3 went", func() bool {
		return allRev.Load() >= del.Header.Revision
	})
	f.standDownRecovered("s")
	passes.check(t, "s", "t", "under watch with a Resync not due")
}

// A change the incremental passes miss is found by the full pass, the
// safety net: with every incremental pass blind to s, its owner standing
// down is still acted on, within FullResync.
func TestFullPassFindsWhatIncrementalMissed(t *testing.T) {
	f := newIncFixture(t)
	l := f.loop(200 * time.Millisecond)
	l.incremental = func(streams []string) []string {
		return slices.DeleteFunc(streams, func(s string) bool { return s == "s" })
	}
	f.runPastFirstPass(l)
	f.standDownRecovered("s")
}

// A pass that recorded pending recoveries does not wait for the view to
// hold them before the next pass: the streams it recorded are skipped
// until the view shows them (unseenRecovery), and another owner loss the
// view shows meanwhile is recorded at once. After a mass failover the
// view trails etcd by every heartbeat that changed, and that wait held
// back the recording of the rest of a lost owner's streams. Here the wait
// for a fresh view never ends (within the loop's hour-long Resync), so the
// second stream's recovery is recorded only if the loop does not wait.
func TestRecordedRecoveriesDoNotWaitForTheView(t *testing.T) {
	f := newIncFixture(t)
	l := f.loop(time.Hour)
	waited := make(chan struct{}, 1)
	l.awaitFresh = func(ctx context.Context) {
		select {
		case waited <- struct{}{}:
		default:
		}
		<-ctx.Done()
	}
	f.runPastFirstPass(l)
	f.standDownRecovered("s")
	f.standDownRecovered("t")
	select {
	case <-waited:
		t.Fatal("the loop waited for a fresh view after recording recoveries")
	default:
	}
}

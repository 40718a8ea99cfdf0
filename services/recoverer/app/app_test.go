package app_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/grpchealth"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/internal/etcdtest"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
	"github.com/strandhq/strand/services/recoverer/app"
)

const stream = "orders"

// env is one embedded etcd with Strand's schema.
type env struct {
	etcd   *etcdtest.Server
	cli    *clientv3.Client
	schema cluster.Schema
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := etcdtest.Start(t)
	return &env{etcd: s, cli: s.Client(t), schema: cluster.NewSchema("/strand")}
}

func (e *env) put(t *testing.T, key string, v any) {
	t.Helper()
	if _, err := e.cli.Put(context.Background(), key, cluster.Encode(v)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// get returns the decoded value at key and the key's version (0 if absent).
func get[T any](t *testing.T, e *env, key string) (T, int64) {
	t.Helper()
	var v T
	resp, err := e.cli.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return v, 0
	}
	v, err = cluster.Decode[T](resp.Kvs[0].Value)
	if err != nil {
		t.Fatalf("decode %s: %v", key, err)
	}
	return v, resp.Kvs[0].Version
}

func (e *env) assignment(t *testing.T) (cluster.Assignment, int64) {
	return get[cluster.Assignment](t, e, e.schema.AssignmentKey(stream))
}

func (e *env) history(t *testing.T) (cluster.HistoryStarts, int64) {
	return get[cluster.HistoryStarts](t, e, e.schema.HistoryKey(stream))
}

func (e *env) recoveryPending(t *testing.T) bool {
	_, v := get[cluster.Recovery](t, e, e.schema.RecoveryKey(stream))
	return v != 0
}

// oldAssignment is the assignment every test recovers from: 3 copies at
// epoch 3, b1 the owner.
func oldAssignment(policy cluster.Policy) cluster.Assignment {
	return cluster.Assignment{
		Stream: stream, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"},
		Policy: policy, Retention: cluster.Retention{MaxRecords: 500},
	}
}

// recovery is the pending recovery the controller records for oldAssignment.
// The recovery replaces b1 (as for an owner missing past --replace-after,
// docs/protocol.md, "Replacing a missing copy"), so b1 is left out unless it
// answers its seal; an old copy the recovery does not remove would be kept.
func recovery(transition string, added ...string) cluster.Recovery {
	return cluster.Recovery{
		Stream: stream, FromEpoch: 3, FenceEpoch: 4, TransitionID: transition,
		OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2",
		AddedMembers: added, RemovedMembers: []string{"b1"}, Reason: "owner lease expired", Created: time.Now(),
	}
}

var majority = cluster.Policy{Name: cluster.MajorityDurable}

// logBuffer collects a recoverer's log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) contains(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for line := range strings.SplitSeq(l.buf.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startRecoverer starts a recoverer app on loopback, waits until it is
// ready and closes it at cleanup.
func (e *env) startRecoverer(t *testing.T, name string, tweak func(*app.Config)) (*app.App, *logBuffer) {
	t.Helper()
	a, logs := e.launchRecoverer(t, name, tweak)
	waitReady(t, name, a)
	return a, logs
}

// launchRecoverer starts a recoverer app on loopback without waiting for it
// and closes it at cleanup.
func (e *env) launchRecoverer(t *testing.T, name string, tweak func(*app.Config)) (*app.App, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	logger := zerolog.New(logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	cfg := app.Config{
		Name:        name,
		Listen:      "127.0.0.1:0",
		Etcd:        e.etcd.Endpoints,
		Prefix:      "/strand",
		SealTimeout: 2 * time.Second,
		Logger:      &logger,
		SessionTTL:  2 * time.Second,
		BackoffMin:  10 * time.Millisecond,
		BackoffMax:  100 * time.Millisecond,
		TLS:         tlsconfig.Settings{Insecure: true},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := app.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, logs.String())
		}
	})
	return a, logs
}

func waitReady(t *testing.T, name string, a *app.App) {
	t.Helper()
	select {
	case <-a.Ready():
	case err := <-a.Err():
		t.Fatalf("%s failed: %v", name, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not ready after 10s", name)
	}
}

// committed reports whether the pending recovery was cleared.
func (e *env) committed(t *testing.T) func() bool {
	return func() bool { return !e.recoveryPending(t) }
}

// checkSealCalls asserts every call carried the recovery's stream, fence
// epoch and transition id.
func checkSealCalls(t *testing.T, b *fakeBroker, rec cluster.Recovery) {
	t.Helper()
	calls := b.sealCalls()
	if len(calls) == 0 {
		t.Fatalf("%s was never sealed", b.node)
	}
	for _, c := range calls {
		if c.GetStream() != rec.Stream || c.GetFenceEpoch() != rec.FenceEpoch || c.GetTransitionId() != rec.TransitionID {
			t.Fatalf("%s sealed with %v, want stream %s fence %d transition %s", b.node, c, rec.Stream, rec.FenceEpoch, rec.TransitionID)
		}
	}
}

func assertAssignment(t *testing.T, got, want cluster.Assignment) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("assignment\n got %+v\nwant %+v", got, want)
	}
}

// liveFollowers stores oldAssignment and starts its followers b2 (record
// tail 8) and b3 (6), registered and answering their seals; b1 is not.
func liveFollowers(t *testing.T) (e *env, old cluster.Assignment, b2, b3 *fakeBroker) {
	t.Helper()
	e = newEnv(t)
	old = oldAssignment(majority)
	e.put(t, e.schema.AssignmentKey(stream), old)
	b2 = startFakeBroker(t, "b2", answer, 8, 0)
	b3 = startFakeBroker(t, "b3", answer, 6, 0)
	b2.register(t, e)
	b3.register(t, e)
	return e, old, b2, b3
}

// A pending recovery is committed exactly once: the furthest sealed copy
// owns the new epoch, the other sealed copy and the added member follow, the
// copy that failed its seal is left out, the recovery is cleared and the
// pick's start is appended (docs/protocol.md, "Stream failover").
func TestCommitsPendingRecoveryOnce(t *testing.T) {
	e := newEnv(t)
	old := oldAssignment(majority)
	prior := cluster.HistoryStarts{{Epoch: 1, RecordTail: 0, CursorEventTail: 0, Node: "b1"}}
	e.put(t, e.schema.AssignmentKey(stream), old)
	e.put(t, e.schema.HistoryKey(stream), prior)
	b1 := startFakeBroker(t, "b1", fail, 0, 0)
	b2 := startFakeBroker(t, "b2", answer, 40, 7)
	b3 := startFakeBroker(t, "b3", answer, 40, 9) // ties b2 on records, wins on cursor events
	b4 := startFakeBroker(t, "b4", answer, 0, 0)  // the replacement the proposal adds
	for _, b := range []*fakeBroker{b1, b2, b3, b4} {
		b.register(t, e)
	}

	// A long grace: the round waits for b1's failure, so b1 is surely asked.
	a, _ := e.startRecoverer(t, "r1", func(c *app.Config) { c.QuorumGrace = time.Minute })
	rec := recovery("t-1", "b4")
	e.put(t, e.schema.RecoveryKey(stream), rec)
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))

	got, aVersion := e.assignment(t)
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b3", Followers: []string{"b2", "b4"},
		Policy: majority, Retention: old.Retention,
	})
	history, hVersion := e.history(t)
	want := append(slices.Clone(prior), cluster.HistoryStart{Epoch: 4, RecordTail: 40, CursorEventTail: 9, Node: "b3"})
	if !slices.Equal(history, want) {
		t.Fatalf("history %+v, want %+v", history, want)
	}
	for _, b := range []*fakeBroker{b1, b2, b3} {
		checkSealCalls(t, b, rec)
	}
	if n := len(b4.sealCalls()); n != 0 {
		t.Fatalf("b4 held no copy but was sealed %d times", n)
	}

	// Exactly once: after the recoverer stops, each key was written once.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, v := e.assignment(t); v != aVersion || v != 2 {
		t.Fatalf("assignment version %d (was %d at commit), want 2: written more than once", v, aVersion)
	}
	if _, v := e.history(t); v != hVersion || v != 2 {
		t.Fatalf("history version %d (was %d at commit), want 2: appended more than once", v, hVersion)
	}
}

// The proposal's policy is what the new assignment carries.
func TestCommitTakesTheProposedPolicy(t *testing.T) {
	e := newEnv(t)
	e.put(t, e.schema.AssignmentKey(stream), oldAssignment(cluster.Policy{Name: cluster.LocalDurable}))
	for _, b := range []*fakeBroker{startFakeBroker(t, "b2", answer, 5, 0), startFakeBroker(t, "b3", answer, 6, 0)} {
		b.register(t, e)
	}
	e.startRecoverer(t, "r1", nil)
	rec := recovery("t-1")
	rec.Policy = cluster.Policy{Name: cluster.ReplicaDurable, Nodes: 2}
	e.put(t, e.schema.RecoveryKey(stream), rec)
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))
	got, _ := e.assignment(t)
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b3", Followers: []string{"b2"},
		Policy: rec.Policy, Retention: oldAssignment(cluster.Policy{}).Retention,
	})
}

// Fewer than R answers: the stream waits instead of guessing, and commits
// once the missing copy answers (docs/protocol.md, "Safety argument").
func TestWaitsForRAnswers(t *testing.T) {
	e := newEnv(t)
	old := oldAssignment(majority) // E=3, W=2, R=2
	e.put(t, e.schema.AssignmentKey(stream), old)
	b2 := startFakeBroker(t, "b2", answer, 10, 1)
	b3 := startFakeBroker(t, "b3", fail, 12, 1)
	b2.register(t, e)
	b3.register(t, e) // b1, the old owner, is gone: no broker key.

	_, logs := e.startRecoverer(t, "r1", nil)
	rec := recovery("t-1")
	e.put(t, e.schema.RecoveryKey(stream), rec)

	// Several rounds decided to wait.
	clustertest.Eventually(t, 10*time.Second, "b3 is asked to seal three times", func() bool { n, _, _ := b3.counts(); return n >= 3 })
	if got, v := e.assignment(t); v != 1 || got.Epoch != 3 {
		t.Fatalf("committed with one answer of R=2: %+v (version %d)", got, v)
	}
	if !e.recoveryPending(t) {
		t.Fatal("the recovery was cleared with fewer than R answers")
	}
	if _, v := e.history(t); v != 0 {
		t.Fatal("a history start was recorded with fewer than R answers")
	}
	if !logs.contains("fewer than R copies answered", `"missing":["b1","b3"]`) {
		t.Fatalf("no wait log naming the missing copies:\n%s", logs)
	}

	b3.set(answer, 12, 1)
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))
	got, _ := e.assignment(t)
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b3", Followers: []string{"b2"},
		Policy: majority, Retention: old.Retention,
	})
	history, _ := e.history(t)
	if want := (cluster.HistoryStarts{{Epoch: 4, RecordTail: 12, CursorEventTail: 1, Node: "b3"}}); !slices.Equal(history, want) {
		t.Fatalf("history %+v, want %+v", history, want)
	}
	checkSealCalls(t, b2, rec)
	checkSealCalls(t, b3, rec)
}

// A second owner loss right after a failover: the surviving followers are
// below the latest history start, so the recovery waits for the confirmed
// prefix and commits once a copy at the start (the returning owner) answers
// (docs/protocol.md, "The confirmed prefix").
func TestWaitsForConfirmedPrefix(t *testing.T) {
	e := newEnv(t)
	old := oldAssignment(majority)
	prior := cluster.HistoryStarts{
		{Epoch: 2, RecordTail: 60, CursorEventTail: 2, Node: "b2"},
		{Epoch: 3, RecordTail: 100, CursorEventTail: 5, Node: "b1"},
	}
	e.put(t, e.schema.AssignmentKey(stream), old)
	e.put(t, e.schema.HistoryKey(stream), prior)
	b2 := startFakeBroker(t, "b2", answer, 90, 9)
	b3 := startFakeBroker(t, "b3", answer, 80, 9)
	b2.register(t, e)
	b3.register(t, e)

	_, logs := e.startRecoverer(t, "r1", nil)
	rec := recovery("t-1")
	e.put(t, e.schema.RecoveryKey(stream), rec)

	clustertest.Eventually(t, 10*time.Second, "b2 is asked to seal three times", func() bool { n, _, _ := b2.counts(); return n >= 3 })
	if got, v := e.assignment(t); v != 1 || got.Epoch != 3 {
		t.Fatalf("promoted a copy below the confirmed prefix: %+v", got)
	}
	if !e.recoveryPending(t) {
		t.Fatal("the recovery was cleared below the confirmed prefix")
	}
	if _, v := e.history(t); v != 1 {
		t.Fatalf("history version %d, want 1 (unchanged)", v)
	}
	if !logs.contains("confirmed prefix", `"record_tail":100`, `"node":"b1"`) {
		t.Fatalf("no wait log with the start's record tail and node:\n%s", logs)
	}

	// The old owner comes back holding the prefix; its registration wakes
	// the recovery.
	b1 := startFakeBroker(t, "b1", answer, 100, 5)
	b1.register(t, e)
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))
	got, _ := e.assignment(t)
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b1", Followers: []string{"b2", "b3"},
		Policy: majority, Retention: old.Retention,
	})
	history, v := e.history(t)
	want := append(slices.Clone(prior), cluster.HistoryStart{Epoch: 4, RecordTail: 100, CursorEventTail: 5, Node: "b1"})
	if !slices.Equal(history, want) || v != 2 {
		t.Fatalf("history %+v (version %d), want %+v at version 2", history, v, want)
	}
	checkSealCalls(t, b1, rec)
}

// Two recoverers started together: one leads, and the recovery is
// committed exactly once.
func TestRacingRecoverersCommitOnce(t *testing.T) {
	e := newEnv(t)
	old := oldAssignment(majority)
	e.put(t, e.schema.AssignmentKey(stream), old)
	for _, b := range []*fakeBroker{startFakeBroker(t, "b1", answer, 7, 0), startFakeBroker(t, "b2", answer, 8, 0), startFakeBroker(t, "b3", answer, 6, 0)} {
		b.register(t, e)
	}
	rec := recovery("t-1")
	e.put(t, e.schema.RecoveryKey(stream), rec)

	var apps [2]*app.App
	for i := range apps {
		apps[i], _ = e.launchRecoverer(t, fmt.Sprintf("r%d", i+1), nil)
	}
	for i, a := range apps {
		waitReady(t, fmt.Sprintf("r%d", i+1), a)
	}
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))
	for _, a := range apps {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	got, aVersion := e.assignment(t)
	history, hVersion := e.history(t)
	if aVersion != 2 || hVersion != 1 || len(history) != 1 {
		t.Fatalf("assignment version %d, history version %d with %d starts: want one commit (2, 1, 1)", aVersion, hVersion, len(history))
	}
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: rec.FenceEpoch, Owner: "b2", Followers: []string{"b1", "b3"},
		Policy: majority, Retention: old.Retention,
	})
	if history[0] != (cluster.HistoryStart{Epoch: 4, RecordTail: 8, Node: "b2"}) {
		t.Fatalf("history start %+v", history[0])
	}
}

// The commit races a controller write between the seals and the commit:
// the guarded transaction fails, the recoverer reads again and commits once
// against the new state (docs/protocol.md, "Stream failover": the
// loser reads again).
func TestCommitRacingAnotherWriterReadsAgain(t *testing.T) {
	e, old, b2, _ := liveFollowers(t)
	// While the first round of seals runs, another writer rewrites the
	// assignment (same value, new mod revision).
	b2.setHook(func(n int) {
		if n == 1 {
			e.put(t, e.schema.AssignmentKey(stream), old)
		}
	})

	_, logs := e.startRecoverer(t, "r1", nil)
	e.put(t, e.schema.RecoveryKey(stream), recovery("t-1"))
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))

	got, aVersion := e.assignment(t)
	if aVersion != 3 {
		t.Fatalf("assignment version %d, want 3 (seeded, rewritten, committed once)", aVersion)
	}
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b2", Followers: []string{"b3"},
		Policy: majority, Retention: old.Retention,
	})
	if n, _, _ := b2.counts(); n < 2 {
		t.Fatalf("b2 sealed %d times, want a second round after the lost commit", n)
	}
	if !logs.contains("recovery state changed since it was read") {
		t.Fatalf("no log of the lost commit:\n%s", logs)
	}
	if history, v := e.history(t); v != 1 || len(history) != 1 {
		t.Fatalf("history %+v (version %d): want one start", history, v)
	}
}

// A recovery recorded for the stream again right after a commit (its new
// owner lost in turn) is recovered too: the watch brings the commit's own
// delete of the recovery key, which starts no read, and then the new
// recovery, which does, whether the first task has ended by then or not.
func TestRecoveryRecordedAgainAfterCommitIsRecovered(t *testing.T) {
	e, old, _, _ := liveFollowers(t)
	e.startRecoverer(t, "r1", nil)

	for round := range 3 {
		from := old.Epoch + uint64(round)
		rec := recovery("t-0") // of oldAssignment: b1 owns it, and is left out
		if round > 0 {
			// Of the assignment the last round committed: b2 owns it.
			rec = cluster.Recovery{
				Stream: stream, FromEpoch: from, FenceEpoch: from + 1, TransitionID: fmt.Sprintf("t-%d", round),
				OldOwner: "b2", OldFollowers: []string{"b3"}, ProposedOwner: "b2",
				Reason: "owner lease expired", Created: time.Now(),
			}
		}
		e.put(t, e.schema.RecoveryKey(stream), rec)
		clustertest.Eventually(t, 10*time.Second, fmt.Sprintf("recovery %d is committed", round), func() bool {
			a, _ := e.assignment(t)
			return a.Epoch == from+1 && !e.recoveryPending(t)
		})
	}
	got, _ := e.assignment(t)
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 6, Owner: "b2", Followers: []string{"b3"},
		Policy: majority, Retention: old.Retention,
	})
}

// The leader is closed while its seals hang: its in-flight work stops at
// once (well before the seal timeout), and the second recoverer takes over
// and finishes the recovery exactly once.
func TestLeaderClosedMidRecoveryHandsOver(t *testing.T) {
	e := newEnv(t)
	old := oldAssignment(majority)
	e.put(t, e.schema.AssignmentKey(stream), old)
	b2 := startFakeBroker(t, "b2", hang, 20, 3)
	b3 := startFakeBroker(t, "b3", hang, 21, 0)
	b2.register(t, e)
	b3.register(t, e)
	const sealTimeout = 60 * time.Second
	long := func(c *app.Config) { c.SealTimeout = sealTimeout }

	r1, _ := e.startRecoverer(t, "r1", long)
	clustertest.Eventually(t, 10*time.Second, "r1 leads", r1.Leading)
	r2, _ := e.startRecoverer(t, "r2", long)
	if r2.Leading() {
		t.Fatal("two recoverers lead at once")
	}

	rec := recovery("t-1")
	e.put(t, e.schema.RecoveryKey(stream), rec)
	clustertest.Eventually(t, 10*time.Second, "r1's seals hang on b2 and b3", func() bool {
		_, f2, _ := b2.counts()
		_, f3, _ := b3.counts()
		return f2 == 1 && f3 == 1
	})
	// From now on the copies answer; r1 is stuck in the round it started.
	b2.set(answer, 20, 3)
	b3.set(answer, 21, 0)

	start := time.Now()
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("closing the leader took %v: its seals were not cancelled (seal timeout %v)", took, sealTimeout)
	}
	clustertest.Eventually(t, 10*time.Second, "r1's hanging seals are cancelled", func() bool {
		_, f2, c2 := b2.counts()
		_, f3, c3 := b3.counts()
		return f2 == 0 && f3 == 0 && c2 == 1 && c3 == 1
	})

	clustertest.Eventually(t, 20*time.Second, "r2 commits the recovery", e.committed(t))
	if !r2.Leading() {
		t.Fatal("r2 committed without leading")
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	got, aVersion := e.assignment(t)
	history, hVersion := e.history(t)
	if aVersion != 2 || hVersion != 1 {
		t.Fatalf("assignment version %d, history version %d: want exactly one commit", aVersion, hVersion)
	}
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b3", Followers: []string{"b2"},
		Policy: majority, Retention: old.Retention,
	})
	if want := (cluster.HistoryStarts{{Epoch: 4, RecordTail: 21, Node: "b3"}}); !slices.Equal(history, want) {
		t.Fatalf("history %+v, want %+v", history, want)
	}
	checkSealCalls(t, b2, rec)
}

// A recovery whose from epoch is not the assignment's is stale: nothing is
// sealed or committed, the recoverer logs it and leaves it to the
// controller, and a rewritten recovery is then finished.
func TestStaleRecoveryNotCommitted(t *testing.T) {
	for _, c := range []struct {
		name  string
		epoch uint64
	}{
		{"the assignment moved on", 5},
		{"the stream was recreated", 1},
	} {
		t.Run(c.name, func(t *testing.T) { testStaleRecovery(t, c.epoch) })
	}
}

func testStaleRecovery(t *testing.T, epoch uint64) {
	e := newEnv(t)
	old := oldAssignment(majority)
	old.Epoch = epoch // the recovery below is from epoch 3
	e.put(t, e.schema.AssignmentKey(stream), old)
	b2 := startFakeBroker(t, "b2", answer, 3, 0)
	b3 := startFakeBroker(t, "b3", answer, 4, 0)
	b2.register(t, e)
	b3.register(t, e)

	_, logs := e.startRecoverer(t, "r1", nil)
	stale := recovery("t-stale") // from epoch 3
	e.put(t, e.schema.RecoveryKey(stream), stale)
	clustertest.Eventually(t, 10*time.Second, "the stale recovery is logged", func() bool {
		return logs.contains("stale pending recovery", `"stream":"orders"`, `"transition_id":"t-stale"`)
	})
	if got, v := e.assignment(t); v != 1 || got.Epoch != epoch {
		t.Fatalf("stale recovery committed: %+v (version %d)", got, v)
	}
	if !e.recoveryPending(t) {
		t.Fatal("the stale recovery was cleared")
	}
	if n := len(b2.sealCalls()) + len(b3.sealCalls()); n != 0 {
		t.Fatalf("a stale recovery sealed copies %d times", n)
	}

	// The controller records a recovery of the current assignment.
	fresh := recovery("t-fresh")
	fresh.FromEpoch, fresh.FenceEpoch = epoch, epoch+1
	e.put(t, e.schema.RecoveryKey(stream), fresh)
	clustertest.Eventually(t, 10*time.Second, "the rewritten recovery is committed", e.committed(t))
	got, _ := e.assignment(t)
	if got.Epoch != epoch+1 || got.Owner != "b3" {
		t.Fatalf("assignment %+v, want epoch %d owned by b3", got, epoch+1)
	}
	checkSealCalls(t, b2, fresh)
}

// Once the answers in hand decide a promotion, a copy that hangs is left
// out after a short grace instead of holding the failover for the whole
// seal timeout.
func TestHangingCopyLeftOutAfterQuorum(t *testing.T) {
	e := newEnv(t)
	old := oldAssignment(majority)
	e.put(t, e.schema.AssignmentKey(stream), old)
	b1 := startFakeBroker(t, "b1", hang, 99, 99) // would be furthest, but never answers
	b2 := startFakeBroker(t, "b2", answer, 5, 0)
	b3 := startFakeBroker(t, "b3", answer, 5, 0)
	for _, b := range []*fakeBroker{b1, b2, b3} {
		b.register(t, e)
	}
	e.startRecoverer(t, "r1", func(c *app.Config) { c.SealTimeout = time.Minute })
	e.put(t, e.schema.RecoveryKey(stream), recovery("t-1"))
	// Well inside the minute-long seal timeout.
	clustertest.Eventually(t, 20*time.Second, "the recovery is committed", e.committed(t))
	got, _ := e.assignment(t)
	assertAssignment(t, got, cluster.Assignment{
		Stream: stream, Epoch: 4, Owner: "b2", Followers: []string{"b3"},
		Policy: majority, Retention: old.Retention,
	})
	// b1 is asked once at most (the grace may end the round before its
	// request even leaves), and never again after the commit.
	if n := len(b1.sealCalls()); n > 1 {
		t.Fatalf("b1 sealed %d times, want at most 1", n)
	}
}

// newEnvAwaitingRecovery is an env holding the stream's old assignment, with
// b2 and b3 registered and answering seals at record tails 5 and 4: a
// recovery put into it can be committed.
func newEnvAwaitingRecovery(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.put(t, e.schema.AssignmentKey(stream), oldAssignment(majority))
	for _, b := range []*fakeBroker{startFakeBroker(t, "b2", answer, 5, 0), startFakeBroker(t, "b3", answer, 4, 0)} {
		b.register(t, e)
	}
	return e
}

// Deleting the leader key deposes the leader; it campaigns again and keeps
// recovering.
func TestCampaignsAgainAfterLosingLeadership(t *testing.T) {
	e := newEnvAwaitingRecovery(t)
	r1, logs := e.startRecoverer(t, "r1", nil)
	clustertest.Eventually(t, 10*time.Second, "r1 leads", r1.Leading)

	ctx := context.Background()
	first, err := e.cli.Get(ctx, e.schema.RecovererElection()+"/", clientv3.WithPrefix())
	if err != nil || len(first.Kvs) != 1 {
		t.Fatalf("election keys: %v %v", first, err)
	}
	if _, err := e.cli.Delete(ctx, string(first.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 10*time.Second, "r1 leads again under a new key", func() bool {
		resp, err := e.cli.Get(ctx, e.schema.RecovererElection()+"/", clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision != first.Kvs[0].CreateRevision && r1.Leading()
	})
	if !logs.contains("no longer leading") {
		t.Fatalf("no log of losing leadership:\n%s", logs)
	}
	e.put(t, e.schema.RecoveryKey(stream), recovery("t-1"))
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))
	if got, _ := e.assignment(t); got.Epoch != 4 || got.Owner != "b2" {
		t.Fatalf("assignment %+v", got)
	}
}

// The recoverer serves gRPC health: SERVING once it campaigns, and it stops
// serving when closed.
func TestServesHealth(t *testing.T) {
	e := newEnv(t)
	a, _ := e.startRecoverer(t, "r1", nil)
	client := grpchealth.NewClient(rpcserver.HTTPClient(), rpcserver.BaseURL(a.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.Check(ctx, &grpchealth.CheckRequest{})
	if err != nil || resp.Status != grpchealth.StatusServing {
		t.Fatalf("health: %v %v, want SERVING", resp, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := client.Check(ctx, &grpchealth.CheckRequest{}); err == nil && resp.Status == grpchealth.StatusServing {
		t.Fatal("still SERVING after Close")
	}
}

// Closing the recoverer while etcd is unreachable still returns: the
// worker's etcd calls are cut off instead of waiting for etcd to return.
func TestCloseWithEtcdDown(t *testing.T) {
	srv, err := etcdtest.StartIn(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{etcd: srv, schema: cluster.NewSchema("/strand")}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			srv.Close()
		}
	})
	a, _ := e.startRecoverer(t, "r1", nil)
	clustertest.Eventually(t, 10*time.Second, "r1 leads", a.Leading)
	srv.Close() // takes a few seconds while clients hold watches
	stopped = true

	done := make(chan error, 1)
	go func() { done <- a.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close hangs while etcd is down")
	}
}

// A leader whose election keep-alives still reach etcd while their answers
// come late keeps its term: the lease lives on in etcd and is resumed, the
// leader key is never deleted, and the term goes on committing.
func TestLeaderKeepsTermThroughLateKeepAliveAnswers(t *testing.T) {
	e := newEnvAwaitingRecovery(t)
	fwd := e.etcd.Forward(t)
	r1, logs := e.startRecoverer(t, "r1", func(c *app.Config) { c.Etcd = []string{"http://" + fwd.Addr()} })
	clustertest.Eventually(t, 10*time.Second, "r1 leads", r1.Leading)
	ctx := context.Background()
	leaderKey := func() int64 {
		t.Helper()
		resp, err := e.cli.Get(ctx, e.schema.RecovererElection()+"/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("election keys: %v %v", resp, err)
		}
		return resp.Kvs[0].CreateRevision
	}
	created := leaderKey()

	fwd.HoldReplies()
	clustertest.Eventually(t, 30*time.Second, "the election session lapsed", func() bool { return r1.SessionsLapsed() >= 1 })
	fwd.ReleaseReplies()
	clustertest.Eventually(t, 15*time.Second, "the election lease resumed", func() bool { return r1.LeasesResumed() >= 1 })
	if got := leaderKey(); got != created {
		t.Fatalf("leader key created at %d, want %d: the term ended", got, created)
	}
	if !r1.Leading() || logs.contains("no longer leading") {
		t.Fatalf("the term ended (leading %v):\n%s", r1.Leading(), logs)
	}
	e.put(t, e.schema.RecoveryKey(stream), recovery("t-1"))
	clustertest.Eventually(t, 10*time.Second, "the recovery is committed", e.committed(t))
}

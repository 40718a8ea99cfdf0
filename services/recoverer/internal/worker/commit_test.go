package worker

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdtest"
)

const stream = "orders"

var schema = cluster.NewSchema("/strand")

type fixture struct {
	cli        *clientv3.Client
	assignment cluster.Assignment
	recovery   cluster.Recovery
	history    cluster.HistoryStarts
}

// newFixture stores a 3-copy assignment at epoch 3, a pending recovery from
// it and, when withHistory, one history start.
func newFixture(t *testing.T, withHistory bool) *fixture {
	t.Helper()
	f := &fixture{
		cli:        etcdtest.Start(t).Client(t),
		assignment: cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b1", Followers: []string{"b2", "b3"}, Policy: cluster.Policy{Name: cluster.MajorityDurable}},
		recovery:   cluster.Recovery{Stream: stream, FromEpoch: 3, FenceEpoch: 4, TransitionID: "t1", OldOwner: "b1", OldFollowers: []string{"b2", "b3"}, ProposedOwner: "b2"},
	}
	f.put(t, schema.AssignmentKey(stream), f.assignment)
	f.put(t, schema.RecoveryKey(stream), f.recovery)
	f.put(t, schema.BrokerKey("b2"), cluster.BrokerInfo{Node: "b2", Address: "127.0.0.1:1"})
	if withHistory {
		f.history = cluster.HistoryStarts{{Epoch: 1, RecordTail: 0, Node: "b1"}}
		f.put(t, schema.HistoryKey(stream), f.history)
	}
	return f
}

func (f *fixture) put(t *testing.T, key string, v any) {
	t.Helper()
	if _, err := f.cli.Put(context.Background(), key, cluster.Encode(v)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// campaign wins the recoverer election with a fresh session.
func campaign(t testing.TB, cli *clientv3.Client) (*concurrency.Session, Leader) {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e := concurrency.NewElection(s, schema.RecovererElection())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Campaign(ctx, "test"); err != nil {
		t.Fatalf("campaign: %v", err)
	}
	return s, Leader{Key: e.Key(), Rev: e.Rev()}
}

func (f *fixture) promotion() (cluster.Assignment, cluster.HistoryStarts) {
	next := cluster.Assignment{Stream: stream, Epoch: 4, Owner: "b2", Followers: []string{"b3"}, Policy: f.assignment.Policy}
	starts := append(slices.Clone(f.history), cluster.HistoryStart{Epoch: 4, RecordTail: 10, CursorEventTail: 2, Node: "b2"})
	return next, starts
}

func TestReadSnapshotAtOneRevision(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	snap, err := readSnapshot(ctx, f.cli, schema, stream)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.hasAssignment() || !snap.hasRecovery() || snap.historyRev == 0 {
		t.Fatalf("snapshot misses a key: %+v", snap)
	}
	if snap.assignment.Owner != "b1" || snap.recovery.TransitionID != "t1" || len(snap.history) != 1 {
		t.Fatalf("snapshot values: %+v", snap)
	}
	if snap.brokers["b2"] != "127.0.0.1:1" || len(snap.brokers) != 1 {
		t.Fatalf("brokers %v", snap.brokers)
	}
	for _, rev := range []int64{snap.assignmentRev, snap.recoveryRev, snap.historyRev} {
		if rev > snap.rev {
			t.Fatalf("mod revision %d after the read revision %d", rev, snap.rev)
		}
	}

	if _, err := f.cli.Put(ctx, schema.HistoryKey(stream), "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := readSnapshot(ctx, f.cli, schema, stream); !errors.Is(err, cluster.ErrCorrupt) {
		t.Fatalf("unreadable history: err %v, want ErrCorrupt (the commit is withheld)", err)
	}
}

// The compares and operations the commit writes are
// cluster.RecoveryCommit's, tested with it (internal/cluster); here, the
// one guard only the recoverer adds.

// A deposed leader can never commit, even if it has not noticed yet and a
// new term of the same process holds a new leader key.
func TestDeposedLeaderCannotCommit(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	session, old := campaign(t, f.cli)
	snap, err := readSnapshot(ctx, f.cli, schema, stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := session.Close(); err != nil {
		t.Fatalf("revoke the session: %v", err)
	}
	_, current := campaign(t, f.cli)
	if current.Key == old.Key && current.Rev == old.Rev {
		t.Fatalf("the new term reused the old leader key %+v", old)
	}
	next, starts := f.promotion()
	ok, _, err := commit(ctx, f.cli, schema, snap, old, next, starts)
	if ok || !errors.Is(err, errDeposed) {
		t.Fatalf("deposed commit: committed %v err %v, want errDeposed", ok, err)
	}
	after, err := readSnapshot(ctx, f.cli, schema, stream)
	if err != nil {
		t.Fatal(err)
	}
	if !after.hasRecovery() || after.assignment.Epoch != 3 || len(after.history) != 1 {
		t.Fatalf("a deposed leader changed the state: %+v", after)
	}
	// The current leader, with the same snapshot, commits.
	if ok, _, err := commit(ctx, f.cli, schema, snap, current, next, starts); !ok || err != nil {
		t.Fatalf("current leader: committed %v err %v", ok, err)
	}
}

func TestBackoffBounds(t *testing.T) {
	b := newBackoff(100*time.Millisecond, 2*time.Second)
	prevStep := time.Duration(0)
	for i := range 12 {
		d := b.next()
		if b.cur < prevStep || b.cur > 2*time.Second {
			t.Fatalf("step %d: %v outside [%v, 2s]", i, b.cur, prevStep)
		}
		if lo, hi := b.cur-b.cur/4, b.cur+b.cur/4; d < lo || d > hi {
			t.Fatalf("step %d: delay %v outside the jitter of %v", i, d, b.cur)
		}
		prevStep = b.cur
	}
	if b.cur != 2*time.Second {
		t.Fatalf("after 12 steps the step is %v, want the 2s cap", b.cur)
	}
	b.reset()
	if d := b.next(); d > 125*time.Millisecond {
		t.Fatalf("after reset: %v, want about 100ms", d)
	}
}

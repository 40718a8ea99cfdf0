package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// An owner's publish that was admitted (its offset assigned) but not yet
// durable when the copy moves to a new epoch as a follower is cut at the
// new epoch's history start like any record past it (docs/protocol.md,
// "Copies with a longer tail"). Here the committer is held while the
// owner (W = 2 of 2, so it confirms nothing alone) has such a publish in
// hand; the new assignment makes b1 a
// follower of b2, whose history starts at b1's durable tail. Decided on
// the durable tail read before the fence, the cut saw nothing to do and
// the advance made the unconfirmed record part of epoch 2's history, at
// the offset b2 gives to its own first record: two copies tied on their
// tails, holding different records there, one of which a later pick may
// promote. (A soak under overload lost a confirmed record this way.)
func TestAdmittedWriteOfTheOldRoleIsCut(t *testing.T) {
	const stream = "admitted"
	var (
		armed   atomic.Bool
		entered = make(chan struct{}, 1)
		release = make(chan struct{})
		once    sync.Once
	)
	db, err := storage.Open(storage.Options{Dir: t.TempDir(), Logger: zerolog.Nop(), WriteFault: func() error {
		if armed.Load() {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	unblock := func() { once.Do(func() { armed.Store(false); close(release) }) }
	history := &historyBox{}
	m, err := NewManager(Config{Node: "b1", Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: 2 * time.Second,
		History: func(context.Context, string, int64) (cluster.HistoryStarts, error) { return history.read(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unblock()
		m.Close()
		_ = db.Close()
	})

	ctx := context.Background()
	// W = 2 of 2: b1 confirms nothing without b2, which never follows
	// here, so what b1 holds past b2's start was never confirmed.
	majority := cluster.Policy{Name: cluster.MajorityDurable}
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Followers: []string{"b2"}, Policy: majority})
	waitOwnerRole(t, m, stream, "b1 owns the stream at epoch 1")
	// Records b2 holds too (as a recovery would have found): the shared
	// prefix below epoch 2's start.
	if _, err := m.copy(stream).st.Append(ctx, 1, []storage.Record{{Payload: []byte("r0")}, {Payload: []byte("r1")}}); err != nil {
		t.Fatal(err)
	}
	durable := m.copy(stream).st.State().RecordTail

	// Hold the committer, then let the owner admit one more publish: its
	// offset is assigned, nothing of it is durable.
	armed.Store(true)
	published := make(chan error, 1)
	go func() {
		_, err := m.Publish(ctx, stream, []storage.Record{{Payload: []byte("unconfirmed")}})
		published <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the committer never took the admitted publish")
	}

	// Epoch 2: b2 owns, from its tails, which are b1's durable ones.
	history.set(cluster.HistoryStarts{{Epoch: 2, RecordTail: durable, Node: "b2"}})
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b2", Followers: []string{"b1"}, Policy: majority})
	// Let the role change begin against the held committer, then release
	// it. (Either order must end cut: nothing here waits on a guess.)
	clustertest.Eventually(t, 10*time.Second, "the role change ended b1's owner role (after its fence)", func() bool {
		_, _, _, ok := m.copy(stream).ownerRole()
		return !ok
	})
	unblock()
	if err := <-published; err == nil {
		t.Fatal("the admitted publish was confirmed: b2 never took it, so W = 2 cannot hold")
	}

	clustertest.Eventually(t, 10*time.Second, "b1 at epoch 2", func() bool {
		return m.copy(stream).st.State().Epoch == 2
	})
	st := m.copy(stream).st.State()
	if st.RecordTail != durable {
		t.Fatalf("b1's record tail at epoch 2 is %d, want %d (the history start): the unconfirmed record escaped the cut", st.RecordTail, durable)
	}
	if last := st.LogEpochs[len(st.LogEpochs)-1]; last.Epoch != 2 || last.RecordStart != durable {
		t.Fatalf("b1's last log epoch %+v, want epoch 2 from %d", last, durable)
	}
}

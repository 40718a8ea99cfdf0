package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/clustertest"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// A stream deleted and created again at once, the delete and the new
// assignment reaching the manager back to back as one watch response can
// deliver them, is applied: the new assignment reaches the deleted
// stream's copy before that copy's loop drops it, and must not be dropped
// with it. Real Badger in a temp dir; no etcd is needed below the watch.
func TestDeletedAndRecreatedAtOnceIsApplied(t *testing.T) {
	// No history starts: a single copy that never failed over.
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const stream = "again"
	// publish waits for the copy of incarnation inc (a publish the deleted
	// copy confirmed before its drop would go with it), then publishes.
	publish := func(inc string) {
		t.Helper()
		clustertest.Eventually(t, 10*time.Second, "the copy of incarnation "+inc, func() bool {
			c := m.copy(stream)
			return c != nil && c.st.State().Incarnation == inc
		})
		clustertest.Eventually(t, 10*time.Second, "a publish to incarnation "+inc+" confirmed", func() bool {
			_, err := m.Publish(context.Background(), stream, []storage.Record{{Payload: []byte(inc)}})
			return err == nil
		})
	}
	for i, inc := range []string{"one", "two", "three"} {
		a := cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Incarnation: inc}
		if i > 0 {
			m.DeleteAssignment(stream)
		}
		m.SetAssignment(a)
		publish(inc)
		res, err := m.Read(t.Context(), stream, 0, 10, 1<<20)
		if err != nil || len(res.Records) != 1 || string(res.Records[0].Payload) != inc {
			t.Fatalf("incarnation %q holds %v, %v; want only its own record", inc, res.Records, err)
		}
	}
}

// newTestManager runs a manager for node on real Badger in a temp dir, its
// history starts read from history. No etcd is needed below the watch.
func newTestManager(t *testing.T, node string, history func() cluster.HistoryStarts) *Manager {
	t.Helper()
	m, _ := openTestManager(t, t.TempDir(), node, history)
	return m
}

// openTestManager is newTestManager on dir, with a stop that closes the
// manager and its store (a restart opens dir again).
func openTestManager(t *testing.T, dir, node string, history func() cluster.HistoryStarts) (*Manager, func()) {
	t.Helper()
	db, err := storage.Open(storage.Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(Config{Node: node, Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: time.Second,
		History: func(context.Context, string, int64) (cluster.HistoryStarts, error) { return history(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			m.Close()
			_ = db.Close()
		})
	}
	t.Cleanup(stop)
	return m, stop
}

// The owner of an epoch is never cut at its own start (docs/limits.md). An accepted owner loss records the new owner's start from the
// tails its last heartbeat showed, which can lag its log: here 7 of its 10
// records. Records 7 to 9 may have been confirmed (on this copy and a lost
// one); cutting them would lose them and give their offsets to new records.
func TestOwnerIsNotCutAtItsOwnStart(t *testing.T) {
	var history historyBox
	m := newTestManager(t, "b1", history.read)
	const stream = "accepted"
	ctx := context.Background()
	ownTenRecords(t, m, stream)
	history.set(cluster.HistoryStarts{{Epoch: 2, RecordTail: 7, Node: "b1"}})
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "the copy at epoch 2", func() bool {
		return m.copy(stream).st.State().Epoch == 2
	})
	var res PublishResult
	clustertest.Eventually(t, 10*time.Second, "the owner at epoch 2 confirms a publish", func() bool {
		var err error
		res, err = m.Publish(ctx, stream, []storage.Record{{Payload: []byte("r10")}})
		return err == nil && res.Epoch == 2
	})
	if res.Offsets[0] != 10 {
		t.Fatalf("the first record at epoch 2 went to offset %d, want 10: the owner was cut at its own start", res.Offsets[0])
	}
	got, err := m.Read(t.Context(), stream, 0, 20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != 11 {
		t.Fatalf("read %d records, want 11", len(got.Records))
	}
	for i, r := range got.Records {
		if want := fmt.Sprintf("r%d", i); string(r.Payload) != want || r.Offset != uint64(i) {
			t.Fatalf("record %d is %q at offset %d, want %q", i, r.Payload, r.Offset, want)
		}
	}
}

// A role change at a new epoch fences the old epoch and stops the old role
// before it cuts (storage.FenceBelow): a write of the old role that was
// already past its role check must not land between the cut and the
// advance, where the advance would make it history of the new epoch. The
// history read comes right before the cut, so a write tried there must be
// refused.
func TestRoleChangeFencesTheOldEpochBeforeTheCut(t *testing.T) {
	const stream = "moved"
	ctx := context.Background()
	var (
		history  historyBox
		m        *Manager
		mu       sync.Mutex
		lateErr  error
		lateTold bool
	)
	m = newTestManager(t, "b1", func() cluster.HistoryStarts {
		starts := history.read()
		mu.Lock()
		defer mu.Unlock()
		if starts != nil && !lateTold {
			// What a publish of the old role past its role check does.
			_, lateErr = m.copy(stream).st.Append(ctx, 1, []storage.Record{{Payload: []byte("late")}})
			lateTold = true
		}
		return starts
	})
	ownTenRecords(t, m, stream)
	// Another copy, b2, was promoted at epoch 2 with 7 records: this copy's
	// last 3 were never confirmed and go.
	history.set(cluster.HistoryStarts{{Epoch: 2, RecordTail: 7, Node: "b2"}})
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b2", Followers: []string{"b1"}})
	clustertest.Eventually(t, 10*time.Second, "the copy at epoch 2", func() bool {
		return m.copy(stream).st.State().Epoch == 2
	})
	mu.Lock()
	err := lateErr
	mu.Unlock()
	if !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("a write at epoch 1 during the role change to epoch 2: %v, want storage.ErrFenced", err)
	}
	st := m.copy(stream).st.State()
	les := st.LogEpochs
	if st.RecordTail != 7 || les[len(les)-1] != (storage.LogEpoch{Epoch: 2, RecordStart: 7}) {
		t.Fatalf("after the role change: record tail %d, log epochs %+v; want 7 and epoch 2 from 7", st.RecordTail, les)
	}
}

// A cut lowers the copy's confirm watermark with its record tail. A copy
// opened after a restart starts from the watermark it stored, 10 here; an
// accepted owner loss (docs/limits.md) may then cut it lower, to 7.
// A watermark left above the tail would be shown to readers and in
// heartbeats, and readers waiting between the two would never be answered.
func TestCutLowersTheConfirmWatermark(t *testing.T) {
	const stream = "lowered"
	dir := t.TempDir()
	var history historyBox
	m, stop := openTestManager(t, dir, "b1", history.read)
	ownTenRecords(t, m, stream)
	stop()

	m, _ = openTestManager(t, dir, "b1", history.read)
	history.set(cluster.HistoryStarts{{Epoch: 2, RecordTail: 7, Node: "b2"}})
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "the reopened copy at watermark 10", func() bool {
		c := m.copy(stream)
		if c == nil {
			return false
		}
		tails, _ := c.tails()
		return tails.ConfirmWatermark == 10
	})
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b2", Followers: []string{"b1"}})
	clustertest.Eventually(t, 10*time.Second, "the copy at epoch 2", func() bool {
		return m.copy(stream).st.State().Epoch == 2
	})
	tails, _ := m.copy(stream).tails()
	if tails.RecordTail != 7 || tails.ConfirmWatermark > tails.RecordTail {
		t.Fatalf("after the cut: record tail %d, confirm watermark %d; want 7 and at most 7", tails.RecordTail, tails.ConfirmWatermark)
	}
	if wm, _, _ := m.copy(stream).visible(); wm > 7 {
		t.Fatalf("readers see below watermark %d after the cut to 7", wm)
	}
}

// A cursor never moves past the confirm watermark: a record durable on the
// owner but not yet on W copies may be lost in a failover, and a cursor
// pointing past it would make a resumed reader skip what the new owner
// stores at those offsets.
func TestCursorStopsAtTheConfirmWatermark(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const stream = "cursors"
	ctx := context.Background()
	// Every copy must confirm, and b2 never follows: records stay
	// unconfirmed on the owner.
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1", Followers: []string{"b2"},
		Policy: cluster.Policy{Name: cluster.LocalDurable}})
	clustertest.Eventually(t, 10*time.Second, "the owner holds 3 unconfirmed records", func() bool {
		_, _ = m.Publish(ctx, stream, []storage.Record{{Payload: []byte("r")}}) // times out: not confirmed
		return m.copy(stream).st.State().RecordTail >= 3
	})
	ev, err := m.CommitCursor(ctx, stream, "c", 3)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Position != 0 {
		t.Fatalf("cursor committed at %d with the confirm watermark at 0", ev.Position)
	}
	if got, _, err := m.Cursor(t.Context(), stream, "c"); err != nil || got != 0 {
		t.Fatalf("cursor reads %d (%v) with the confirm watermark at 0", got, err)
	}
}

// Records the owner made durable count toward W whoever waited for them: a
// publish whose caller went away before the fsync ended must not leave its
// records above the confirm watermark until some later publish.
func TestOwnerCountsRecordsNoPublishWaitedFor(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const stream = "unwaited"
	ctx := context.Background()
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "the owner confirms a publish", func() bool {
		_, err := m.Publish(ctx, stream, []storage.Record{{Payload: []byte("r0")}})
		return err == nil
	})
	// What a publish whose caller left does: the records reach storage,
	// and nobody reports them to the confirm tracker.
	if _, err := m.copy(stream).st.Append(ctx, 1, []storage.Record{{Payload: []byte("r1")}, {Payload: []byte("r2")}}); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 10*time.Second, "the confirm watermark at 3", func() bool {
		tails, _ := m.copy(stream).tails()
		return tails.ConfirmWatermark == 3
	})
	res, err := m.Read(t.Context(), stream, 0, 10, 1<<20)
	if err != nil || len(res.Records) != 3 {
		t.Fatalf("read %d records (%v), want 3", len(res.Records), err)
	}
}

// ownTenRecords makes m's node, b1, the single-copy owner of stream at
// epoch 1 and publishes r0..r9 to it, each confirmed.
// waitOwnerRole waits until m's copy of stream has taken the owner role.
func waitOwnerRole(t *testing.T, m *Manager, stream, what string) {
	t.Helper()
	clustertest.Eventually(t, 10*time.Second, what, func() bool {
		c := m.copy(stream)
		if c == nil {
			return false
		}
		_, _, _, ok := c.ownerRole()
		return ok
	})
}

func ownTenRecords(t *testing.T, m *Manager, stream string) {
	t.Helper()
	ctx := context.Background()
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "the owner at epoch 1 confirms a publish", func() bool {
		_, err := m.Publish(ctx, stream, []storage.Record{{Payload: []byte("r0")}})
		return err == nil
	})
	for i := 1; i < 10; i++ {
		if _, err := m.Publish(ctx, stream, []storage.Record{{Payload: fmt.Appendf(nil, "r%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
}

// A copy found on disk at start serves no reads until an assignment gave
// it a role: it may hold a deleted stream's records under a name created
// again, or records its next role change cuts, and its stored watermark
// belongs to what it was.
func TestReopenedCopyServesNoReadsBeforeItsAssignment(t *testing.T) {
	const stream = "reopened"
	dir := t.TempDir()
	none := func() cluster.HistoryStarts { return nil }
	m, stop := openTestManager(t, dir, "b1", none)
	ownTenRecords(t, m, stream)
	stop()

	m, _ = openTestManager(t, dir, "b1", none)
	if m.copy(stream) == nil {
		t.Fatal("the reopened manager has no copy of the stream on disk; the test needs one")
	}
	if res, err := m.Read(t.Context(), stream, 0, 100, 1<<20); err == nil {
		t.Fatalf("a copy with no assignment yet served %d records", len(res.Records))
	}
	if _, err := m.Subscribe(t.Context(), stream, 0); err == nil {
		t.Fatal("a copy with no assignment yet took a subscription")
	}
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 1, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "reads once the copy is owner again", func() bool {
		res, err := m.Read(t.Context(), stream, 0, 100, 1<<20)
		return err == nil && len(res.Records) == 10
	})
}

// historyBox holds the history starts a test manager reads, set by the
// test while the manager runs.
type historyBox struct {
	mu     sync.Mutex
	starts cluster.HistoryStarts
}

func (h *historyBox) set(starts cluster.HistoryStarts) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts = starts
}

func (h *historyBox) read() cluster.HistoryStarts {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.starts)
}

// A copy runs its reconcile only while there is something to take in
// (copy.go, reconcileRun): assignments that arrive from many goroutines at
// once are all applied, the last one of each stream winning, and once they
// are, no copy keeps a run, so an idle broker parks no goroutine per copy
// for it (docs/limits.md, "Memory grows with the copies a broker holds").
func TestIdleCopiesKeepNoReconcileRun(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const streams, epochs = 40, 5
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			for e := uint64(1); e <= epochs; e++ {
				m.SetAssignment(cluster.Assignment{Stream: fmt.Sprintf("s%02d", i), Epoch: e, Owner: "b1"})
			}
		})
	}
	wg.Wait()
	settled := func(c *Copy) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.applied.Epoch == epochs && c.runDone == nil
	}
	clustertest.Eventually(t, 20*time.Second, "every copy at its last epoch with no reconcile running", func() bool {
		for i := range streams {
			c := m.copy(fmt.Sprintf("s%02d", i))
			if c == nil || !settled(c) {
				return false
			}
		}
		return true
	})
	// A copy woken again after its run ended takes the new assignment in.
	m.SetAssignment(cluster.Assignment{Stream: "s00", Epoch: epochs + 1, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "s00 at the epoch after", func() bool {
		c := m.copy("s00")
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.applied.Epoch == epochs+1 && c.runDone == nil
	})
}

// An owner role runs no goroutine of its own per stream: its copy counts
// toward W through storage (Stream.OnDurable), so a broker owning
// thousands of idle streams parks nothing for them.
func TestOwnerRolesRunNoGoroutinePerStream(t *testing.T) {
	m := newTestManager(t, "b1", func() cluster.HistoryStarts { return nil })
	const streams = 50
	for i := range streams {
		m.SetAssignment(cluster.Assignment{Stream: fmt.Sprintf("own-%02d", i), Epoch: 1, Owner: "b1"})
	}
	for i := range streams {
		waitOwnerRole(t, m, fmt.Sprintf("own-%02d", i), "the owner role")
	}
	// A goroutine a copy starts to apply an assignment ends once it has;
	// what stays is the role's.
	clustertest.Eventually(t, 10*time.Second, "no goroutine left in a copy's code", func() error {
		n := 0
		for _, g := range clustertest.Goroutines() {
			if strings.Contains(g, "replica.(*Copy)") {
				n++
			}
		}
		if n > 0 {
			return fmt.Errorf("%d goroutines in a copy's code with %d owned streams", n, streams)
		}
		return nil
	})
}

// A copy taking a role at a new epoch reads its history starts at or past
// the revision its assignment was read at (Config.History): the epoch's
// start was written in the same transaction, so that read holds it and
// needs no linearizable read (docs/protocol.md, "Stream failover"). An
// assignment of unknown revision reads them through History.
func TestNewEpochReadsHistoryAtItsAssignmentRevision(t *testing.T) {
	db, err := storage.Open(storage.Options{Dir: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var mu sync.Mutex
	// atRevs are the revisions the reads named; plain counts those that
	// named none (linearizable).
	var atRevs []int64
	plain := 0
	// The copy's own epochs, each started at its tail: nothing to cut.
	starts := cluster.HistoryStarts{{Epoch: 1, Node: "b1"}, {Epoch: 2, RecordTail: 10, Node: "b1"}, {Epoch: 3, RecordTail: 10, Node: "b1"}}
	m, err := NewManager(Config{Node: "b1", Storage: db, Logger: zerolog.Nop(), ConfirmTimeout: time.Second,
		History: func(_ context.Context, _ string, rev int64) (cluster.HistoryStarts, error) {
			mu.Lock()
			defer mu.Unlock()
			if rev == 0 {
				plain++
			} else {
				atRevs = append(atRevs, rev)
			}
			return starts, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	const stream = "at-rev"
	ownTenRecords(t, m, stream)
	mu.Lock()
	atRevs, plain = nil, 0
	mu.Unlock()
	m.SetAssignmentAt(cluster.Assignment{Stream: stream, Epoch: 2, Owner: "b1"}, 42)
	clustertest.Eventually(t, 10*time.Second, "the copy at epoch 2", func() bool {
		return m.copy(stream).st.State().Epoch == 2
	})
	m.SetAssignment(cluster.Assignment{Stream: stream, Epoch: 3, Owner: "b1"})
	clustertest.Eventually(t, 10*time.Second, "the copy at epoch 3", func() bool {
		return m.copy(stream).st.State().Epoch == 3
	})
	mu.Lock()
	if !slices.Equal(atRevs, []int64{42}) || plain != 1 {
		t.Fatalf("history read at revisions %v and %d times through History; want [42] and once", atRevs, plain)
	}
	atRevs, plain = nil, 0
	mu.Unlock()
	// A new, empty copy owning a later epoch has nothing to cut; the
	// warning's read of the starts is made at the assignment's revision
	// too.
	const empty = "at-rev-empty"
	m.SetAssignmentAt(cluster.Assignment{Stream: empty, Epoch: 2, Owner: "b1"}, 43)
	// The role starts after the warning's read.
	clustertest.Eventually(t, 10*time.Second, "the empty copy owning epoch 2", func() bool {
		a, _, _, ok := m.copy(empty).ownerRole()
		return ok && a.Epoch == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(atRevs, []int64{43}) || plain != 0 {
		t.Fatalf("empty copy: history read at revisions %v and %d times through History; want [43] and never", atRevs, plain)
	}
}

package storage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestSealAdvanceTable walks one copy through a sequence of role changes and
// seals, checking the outcome and the epochs after each step.
func TestSealAdvanceTable(t *testing.T) {
	type step struct {
		name       string
		do         func(s *Stream) error
		wantErr    error
		epoch      uint64
		seal       uint64
		transition string
		logEpochs  []LogEpoch
		sealed     []LogEpoch
	}
	ctx := context.Background()
	advance := func(e uint64) func(*Stream) error {
		return func(s *Stream) error { return s.AdvanceEpoch(context.Background(), e) }
	}
	seal := func(e uint64, tr string) func(*Stream) error {
		return func(s *Stream) error { _, err := s.Seal(context.Background(), e, tr); return err }
	}
	appends := 0
	appendAt := func(e uint64, n int) func(*Stream) error {
		return func(s *Stream) error {
			appends++ // a new producer each time: not a retry of the last append
			_, err := s.Append(ctx, e, recs(fmt.Sprint("r", appends), n))
			return err
		}
	}
	le := func(e, r, c uint64) LogEpoch { return LogEpoch{Epoch: e, RecordStart: r, CursorEventStart: c} }
	steps := []step{
		{name: "promote at 1", do: advance(1), epoch: 1, logEpochs: []LogEpoch{le(1, 0, 0)}},
		{name: "append 3 at 1", do: appendAt(1, 3), epoch: 1, logEpochs: []LogEpoch{le(1, 0, 0)}},
		{name: "advance to the same epoch is a no-op", do: advance(1), epoch: 1, logEpochs: []LogEpoch{le(1, 0, 0)}},
		{name: "advance below is fenced", do: advance(0), wantErr: ErrFenced, epoch: 1, logEpochs: []LogEpoch{le(1, 0, 0)}},
		{name: "advance to 2", do: advance(2), epoch: 2, logEpochs: []LogEpoch{le(1, 0, 0), le(2, 3, 0)}},
		{name: "advance to 3 with no entries at 2 collapses", do: advance(3), epoch: 3, logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "append 2 at 3", do: appendAt(3, 2), epoch: 3, logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "stale seal is fenced", do: seal(2, "old"), wantErr: ErrFenced, epoch: 3, logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "seal at 4", do: seal(4, "t1"), epoch: 4, seal: 4, transition: "t1",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(4, 5, 0)}, sealed: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "same seal again is idempotent", do: seal(4, "t1"), epoch: 4, seal: 4, transition: "t1",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(4, 5, 0)}, sealed: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "append while sealed", do: appendAt(4, 1), wantErr: ErrSealed, epoch: 4, seal: 4, transition: "t1",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(4, 5, 0)}, sealed: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "newer transition at the same fence takes over", do: seal(4, "t2"), epoch: 4, seal: 4, transition: "t2",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(4, 5, 0)}, sealed: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "seal at a higher fence keeps the replaced epochs", do: seal(6, "t3"), epoch: 6, seal: 6, transition: "t3",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0)}, sealed: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "release below the fence is fenced", do: advance(5), wantErr: ErrFenced, epoch: 6, seal: 6, transition: "t3",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0)}, sealed: []LogEpoch{le(1, 0, 0), le(3, 3, 0)}},
		{name: "advance at the fence releases in place", do: advance(6), epoch: 6,
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0)}},
		{name: "append after release", do: appendAt(6, 1), epoch: 6,
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0)}},
		{name: "a late seal at the epoch the copy serves is stale", do: seal(6, "t4"), wantErr: ErrFenced, epoch: 6,
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0)}},
		{name: "seal above the current epoch", do: seal(7, "t5"), epoch: 7, seal: 7, transition: "t5",
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0), le(7, 6, 0)},
			sealed:    []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0)}},
		{name: "release above the fence", do: advance(8), epoch: 8,
			logEpochs: []LogEpoch{le(1, 0, 0), le(3, 3, 0), le(6, 5, 0), le(8, 6, 0)}},
	}
	dir := t.TempDir()
	db := openDB(t, dir)
	s := openStream(t, db, "seal")
	for i, st := range steps {
		err := st.do(s)
		if st.wantErr == nil && err != nil || st.wantErr != nil && !errors.Is(err, st.wantErr) {
			t.Fatalf("step %d %q: err = %v, want %v", i, st.name, err, st.wantErr)
		}
		check := func(when string, got State) {
			if got.Epoch != st.epoch || got.SealEpoch != st.seal || got.SealTransition != st.transition ||
				!slices.Equal(got.LogEpochs, st.logEpochs) || !slices.Equal(got.SealedLogEpochs, st.sealed) {
				t.Fatalf("step %d %q (%s): state %+v\nwant epoch %d seal %d %q log epochs %v sealed %v",
					i, st.name, when, got, st.epoch, st.seal, st.transition, st.logEpochs, st.sealed)
			}
		}
		check("live", s.State())
		// Every step survives a restart.
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		db = openDB(t, dir)
		s = openStream(t, db, "seal")
		check("after restart", s.State())
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSealReportsTailsAndFencesReplication(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	owner := ownerStream(t, db, "owner", 1)
	out := mustAppend(t, owner, 1, recs("a", 4))
	follower := ownerStream(t, db, "follower", 1)
	ctx := context.Background()
	if err := follower.AppendReplicated(ctx, out[:2], nil); err != nil {
		t.Fatal(err)
	}
	st, err := follower.Seal(context.Background(), 2, "tr")
	if err != nil {
		t.Fatal(err)
	}
	if st.RecordTail != 2 || st.Chain != out[1].Chain || !st.Sealed() {
		t.Fatalf("seal state = %+v", st)
	}
	if err := follower.AppendReplicated(ctx, out[2:], nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("replication into a sealed copy: %v", err)
	}
	if follower.State().RecordTail != 2 {
		t.Fatal("a fenced replicated append moved the tail")
	}
	if err := follower.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if err := follower.AppendReplicated(ctx, out[2:], nil); err != nil {
		t.Fatalf("replication after release: %v", err)
	}
}

// A role change fences the old epoch before its cut (FenceBelow): owner
// writes below the new epoch and replicated batches are refused until the
// copy advances, and nothing they carried is stored.
func TestFenceBelowRefusesTheOldRoleUntilTheAdvance(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	owner := ownerStream(t, db, "owner", 1)
	out := mustAppend(t, owner, 1, recs("a", 4))
	follower := ownerStream(t, db, "follower", 1)
	if err := follower.AppendReplicated(ctx, out[:2], nil); err != nil {
		t.Fatal(err)
	}

	owner.FenceBelow(2)
	follower.FenceBelow(2)
	if _, err := owner.Append(ctx, 1, recs("late", 1)); !errors.Is(err, ErrFenced) {
		t.Fatalf("owner append at epoch 1 after FenceBelow(2): %v, want ErrFenced", err)
	}
	if _, err := owner.CommitCursor(ctx, 1, "c", 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("cursor commit at epoch 1 after FenceBelow(2): %v, want ErrFenced", err)
	}
	if err := follower.AppendReplicated(ctx, out[2:], nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("replicated batch after FenceBelow(2): %v, want ErrFenced", err)
	}
	if rt, ct := owner.State().RecordTail, owner.State().CursorEventTail; rt != 4 || ct != 0 {
		t.Fatalf("owner tails %d/%d after refused writes, want 4/0", rt, ct)
	}
	if rt := follower.State().RecordTail; rt != 2 {
		t.Fatalf("follower record tail %d after a refused batch, want 2", rt)
	}
	// A lower fence does not lower it.
	owner.FenceBelow(1)
	if _, err := owner.Append(ctx, 1, recs("late", 1)); !errors.Is(err, ErrFenced) {
		t.Fatalf("owner append at epoch 1 after FenceBelow(1): %v, want ErrFenced", err)
	}

	// Once advanced, the new role writes.
	if err := owner.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if err := follower.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Append(ctx, 2, recs("b", 1)); err != nil {
		t.Fatalf("owner append at epoch 2: %v", err)
	}
	if err := follower.AppendReplicated(ctx, out[2:], nil); err != nil {
		t.Fatalf("replicated batch at epoch 2: %v", err)
	}
}

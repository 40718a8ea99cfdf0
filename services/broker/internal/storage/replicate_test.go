package storage

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func TestAppendReplicatedMatchesOwner(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	owner := ownerStream(t, db, "owner", 1)
	a := mustAppend(t, owner, 1, recs("a", 3))
	if _, err := owner.CommitCursor(ctx, 1, "c1", 2); err != nil {
		t.Fatal(err)
	}
	if err := owner.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	b := mustAppend(t, owner, 2, recs("b", 2))
	if _, err := owner.CommitCursor(ctx, 2, "c1", 4); err != nil {
		t.Fatal(err)
	}
	if err := owner.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := owner.ReadCursorEvents(0, 0)
	if err != nil || len(evs) != 2 {
		t.Fatalf("owner cursor events = %+v, %v", evs, err)
	}

	f := openStream(t, db, "follower")
	if err := f.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	all := append(a, b...)
	if err := f.AppendReplicated(ctx, all[:2], evs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := f.AppendReplicated(ctx, all[2:], evs[1:]); err != nil {
		t.Fatal(err)
	}
	fs, os := f.State(), owner.State()
	if fs.RecordTail != os.RecordTail || fs.Chain != os.Chain || fs.CursorEventTail != os.CursorEventTail || fs.Bytes != os.Bytes {
		t.Fatalf("follower %+v != owner %+v", fs, os)
	}
	got := mustRead(t, f, 0, 0)
	for i := range all {
		if err := sameRecord(got[i], all[i]); err != nil {
			t.Fatal(err)
		}
	}
	if p, ok := f.Cursor("c1"); !ok || p != 4 {
		t.Fatalf("follower cursor = %d, %v", p, ok)
	}
	fevs, _ := f.ReadCursorEvents(0, 0)
	if len(fevs) != 2 || fevs[1] != evs[1] {
		t.Fatalf("follower events %+v, owner %+v", fevs, evs)
	}
}

func TestAppendReplicatedMismatchChangesNothing(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	owner := ownerStream(t, db, "owner", 3)
	out := mustAppend(t, owner, 3, recs("a", 6))
	if _, err := owner.CommitCursor(ctx, 3, "c", 1); err != nil {
		t.Fatal(err)
	}
	<-owner.WaitCursorEventTail(0)
	evs, err := owner.ReadCursorEvents(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := ownerStream(t, db, "f", 3)
	if err := f.AppendReplicated(ctx, out[:2], nil); err != nil {
		t.Fatal(err)
	}
	before := f.State()

	tampered := append([]Record(nil), out[2:4]...)
	tampered[1].Payload = []byte("tampered")
	gap := append([]Record(nil), out[2], out[4])
	badEpoch := append([]Record(nil), out[2:3]...)
	badEpoch[0].Epoch = 4
	badEv := append([]CursorEvent(nil), evs...)
	badEv[0].Offset = 1
	cases := []struct {
		name string
		recs []Record
		evs  []CursorEvent
		want error
	}{
		{"records past the tail", out[3:5], nil, ErrOffsetMismatch},
		{"records below the tail", out[1:3], nil, ErrOffsetMismatch},
		{"a gap inside the batch", gap, nil, ErrOffsetMismatch},
		{"a changed payload", tampered, nil, ErrChainMismatch},
		{"an epoch above the copy", badEpoch, nil, ErrFenced},
		{"events past the event tail", out[2:3], badEv, ErrOffsetMismatch},
		{"an empty cursor name", nil, []CursorEvent{{Offset: 0, Epoch: 3}}, ErrInvalidArgument},
	}
	for _, c := range cases {
		err := f.AppendReplicated(ctx, c.recs, c.evs)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: err = %v, want %v", c.name, err, c.want)
		}
		after := f.State()
		if after.RecordTail != before.RecordTail || after.Chain != before.Chain || after.CursorEventTail != before.CursorEventTail || after.Bytes != before.Bytes {
			t.Fatalf("%s: state changed from %+v to %+v", c.name, before, after)
		}
		if got := mustRead(t, f, 0, 0); len(got) != 2 {
			t.Fatalf("%s: %d records stored", c.name, len(got))
		}
		if _, ok := f.Cursor("c"); ok {
			t.Fatalf("%s: cursor state changed", c.name)
		}
	}
	// The valid continuation still applies.
	if err := f.AppendReplicated(ctx, out[2:], evs); err != nil {
		t.Fatal(err)
	}
	if f.State().Chain != owner.State().Chain {
		t.Fatal("chains differ after catching up")
	}
}

func TestResetTo(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	owner := ownerStream(t, db, "owner", 1)
	out := mustAppend(t, owner, 1, recs("a", 10))
	f := ownerStream(t, db, "f", 1)
	if err := f.AppendReplicated(ctx, out[:3], nil); err != nil {
		t.Fatal(err)
	}
	if err := f.ResetTo(context.Background(), 7, out[6].Chain); err != nil {
		t.Fatal(err)
	}
	st := f.State()
	if st.Head != 7 || st.RecordTail != 7 || st.Chain != out[6].Chain || st.ConfirmWatermark != 7 {
		t.Fatalf("after reset %+v", st)
	}
	if c, err := f.ChainAt(7); err != nil || c != out[6].Chain {
		t.Fatalf("ChainAt(head) = %#x, %v", c, err)
	}
	if _, err := f.Read(2, 1, 0); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read below the reset head: %v", err)
	}
	if err := f.AppendReplicated(ctx, out[7:], nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	f = openStream(t, db, "f")
	got := mustRead(t, f, 7, 0)
	if len(got) != 3 || f.State().Chain != out[9].Chain || f.State().Head != 7 {
		t.Fatalf("after restart: %d records, state %+v", len(got), f.State())
	}
	// Nothing below the head is left behind in Badger.
	if got := f.storedOffsets(t); !slices.Equal(got, []uint64{7, 8, 9}) {
		t.Fatalf("records stored %v, want [7 8 9]", got)
	}
}

// Sync returns only once every batch queued before it is durable. A
// follower's follow call relies on it when it starts: batches an earlier
// call queued may still be syncing, and the call must report tails that
// cover them, or the owner's first batch would not line up with what
// storage has already taken (replica/follower.go).
func TestSyncCoversQueuedBatches(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	f, all := followerOfSix(t, db)

	inSync, release := holdNextSync(db)
	// Two batches queued, nobody waiting on them: the first holds the
	// committer at its fsync, the second queues behind it.
	if err := f.EnqueueReplicated(ctx, all[:3], nil, nil); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, inSync, "the first batch reaching its fsync")
	if err := f.EnqueueReplicated(ctx, all[3:], nil, nil); err != nil {
		t.Fatal(err)
	}
	if st := f.State(); st.RecordTail != 0 {
		t.Fatalf("durable tail %d while the first batch's fsync is held", st.RecordTail)
	}
	synced := make(chan error, 1)
	go func() { synced <- f.Sync(ctx) }()
	close(release)
	select {
	case err := <-synced:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sync did not return")
	}
	if st := f.State(); st.RecordTail != 6 || st.Chain != all[5].Chain {
		t.Fatalf("after Sync: durable tail %d chain %#x, want 6 and %#x", st.RecordTail, st.Chain, all[5].Chain)
	}
}

// ResetTo only raises the record tail: records past the head leave only by
// Cut, and a lower head changes nothing.
func TestResetToBelowTheTailIsRefused(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 10))
	before := s.State()
	if err := s.ResetTo(context.Background(), 5, 0xabc); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("ResetTo below the tail: %v, want ErrInvalidArgument", err)
	}
	if !equalState(s.State(), before) {
		t.Fatalf("a refused reset changed the copy: %+v, was %+v", s.State(), before)
	}
}

// A batch's onDurable is told its outcome once the durable tails moved over
// it, in queue order, and not while its fsync is held.
func TestEnqueueReplicatedTellsOnDurableAfterTheTailsMoved(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	f, all := followerOfSix(t, db)
	type told struct {
		batch int
		err   error
		tails Tails
	}
	got := make(chan told, 2)
	note := func(batch int) func(error) {
		return func(err error) { got <- told{batch, err, f.Tails()} }
	}
	inSync, release := holdNextSync(db)
	if err := f.EnqueueReplicated(ctx, all[:3], nil, note(1)); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, inSync, "the first batch reaching its fsync")
	if err := f.EnqueueReplicated(ctx, all[3:], nil, note(2)); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		t.Fatalf("batch %d told durable while the first fsync is held", n.batch)
	default:
	}
	close(release)
	for i, want := range []uint64{3, 6} {
		select {
		case n := <-got:
			if n.batch != i+1 || n.err != nil || n.tails.Record != want {
				t.Fatalf("told batch %d (err %v) at durable tail %d, want batch %d at %d", n.batch, n.err, n.tails.Record, i+1, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("batch %d was never told durable", i+1)
		}
	}
}

// followerOfSix is a follower copy at epoch 1 with nothing stored, and the
// six records an owner of epoch 1 stored for it to take.
func followerOfSix(t *testing.T, db *DB) (*Stream, []Record) {
	t.Helper()
	owner := ownerStream(t, db, "owner", 1)
	all := mustAppend(t, owner, 1, recs("a", 6))
	f := openStream(t, db, "follower")
	if err := f.AdvanceEpoch(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	return f, all
}

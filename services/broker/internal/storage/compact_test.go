package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
)

// storedEventOffsets returns the offsets of the cursor event keys s holds.
func (s *Stream) storedEventOffsets(t testing.TB) []uint64 {
	t.Helper()
	var out []uint64
	if err := s.scanKeys(s.eventPrefix, func(k []byte) { out = append(out, keyOffset(k)) }); err != nil {
		t.Fatal(err)
	}
	return out
}

// commitEvents commits n cursor events on s at epoch, over cursors c0..c4,
// each position one past the cursor's last (s must hold n/5 records or
// more), and waits until they are durable.
func commitEvents(t testing.TB, s *Stream, epoch uint64, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		name := fmt.Sprintf("c%d", i%5)
		p, _ := s.Cursor(name)
		if ev, err := s.CommitCursor(ctx, epoch, name, p+1); err != nil || ev.Position != p+1 {
			t.Fatalf("commit %s at %d: %+v, %v", name, p+1, ev, err)
		}
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkCompacted checks that s holds exactly the cursor events [from, tail)
// and serves none below from.
func checkCompacted(t testing.TB, s *Stream, from uint64) {
	t.Helper()
	tail := s.State().CursorEventTail
	got := s.storedEventOffsets(t)
	if uint64(len(got)) != tail-from || (len(got) > 0 && got[0] != from) {
		t.Fatalf("stored cursor events %d from %v, want [%d, %d)", len(got), got[:min(len(got), 1)], from, tail)
	}
	if h := s.CursorEventHead(); h != from {
		t.Fatalf("cursor event head %d, want %d", h, from)
	}
	if from > 0 {
		if _, err := s.ReadCursorEvents(from-1, 0); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("read below the head: %v, want ErrOutOfRange", err)
		}
	}
	evs, err := s.ReadCursorEvents(from, 0)
	if err != nil || uint64(len(evs)) != tail-from {
		t.Fatalf("read from the head: %d events, %v", len(evs), err)
	}
}

func TestSnapshotCompactsCursorEvents(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 100))
	commitEvents(t, s, 1, 40)
	before := cursorState(s)
	if err := s.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkCompacted(t, s, 40)
	if got := cursorState(s); !maps.Equal(got, before) {
		t.Fatalf("cursors after compaction %v, want %v", got, before)
	}
	if snap := s.CursorSnapshot(); snap.Boundary != 40 || snap.Epoch != 1 || !maps.Equal(snap.Cursors, before) {
		t.Fatalf("cursor snapshot %+v", snap)
	}
	commitEvents(t, s, 1, 7)
	after := cursorState(s)
	checkCompacted(t, s, 40)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "s")
	checkCompacted(t, s, 40)
	if got := cursorState(s); !maps.Equal(got, after) {
		t.Fatalf("cursors after reopen %v, want %v", got, after)
	}
}

// Commits alone take snapshots (by count here) and compact behind them.
func TestCommitsSnapshotAndCompactByCount(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", snapshotEvery/5+10)) // room for every commit to move its cursor
	commitEvents(t, s, 1, snapshotEvery+10)
	// The snapshot is durable (commitEvents synced): whatever the
	// background compaction did yet, one more run (serialised with it)
	// leaves exactly the events after the snapshot.
	if snap := s.CursorSnapshot(); snap.Boundary != snapshotEvery {
		t.Fatalf("durable snapshot at %d, want %d", snap.Boundary, snapshotEvery)
	}
	if err := s.compactCursorEvents(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkCompacted(t, s, snapshotEvery)
}

// Long cursor names reach the byte bound first.
func TestSnapshotRuleBySize(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 10))
	long := string(make([]byte, MaxCursorName-3))
	ctx := context.Background()
	var at uint64
	for i := range snapshotEvery {
		name := fmt.Sprintf("%s%03d", long, i%1000)
		if _, err := s.CommitCursor(ctx, 1, name, 1+uint64(i/1000)); err != nil {
			t.Fatal(err)
		}
		s.assigned.mu.Lock()
		b := s.assigned.snapBoundary
		s.assigned.mu.Unlock()
		if b > 0 {
			at = b
			break
		}
	}
	if at == 0 || at >= snapshotEvery {
		t.Fatalf("snapshot at %d, want one before %d events of %d-byte names", at, snapshotEvery, MaxCursorName)
	}
	if per := snapshotEveryBytes / int(at); per < MaxCursorName-3 || per > MaxCursorName+32 {
		t.Fatalf("snapshot after %d events (%d bytes each), want the %d-byte bound", at, per, snapshotEveryBytes)
	}
}

// A stop between the durable snapshot and the deletes: the next open
// compacts, and the cursor state is the same.
func TestCompactionStopAfterSnapshotFinishesOnOpen(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 100))
	commitEvents(t, s, 1, 30)
	want := cursorState(s)
	db.holdCompaction.Store(true) // the snapshot is written, nothing deleted
	if err := s.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.storedEventOffsets(t); len(got) != 30 {
		t.Fatalf("%d events stored with compaction held, want all 30", len(got))
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "s")
	checkCompacted(t, s, 30)
	if got := cursorState(s); !maps.Equal(got, want) {
		t.Fatalf("cursors after reopen %v, want %v", got, want)
	}
	if s.State().CursorEventTail != 30 {
		t.Fatalf("cursor event tail %d", s.State().CursorEventTail)
	}
}

var errStopCompaction = errors.New("stop inside the compaction")

// A stop inside the deletes (after a batch): the purge mark says how far
// they went, the next open deletes the rest, and the cursor state is the
// same.
func TestCompactionStopMidDeleteFinishesOnOpen(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	// Set before any write, so the compaction loop sees it: every run
	// stops after its first batch. The commits' own snapshot (at
	// snapshotEvery), Snapshot's and the background runs take at most
	// three batches, fewer than n holds.
	db.afterCompactBatch = func() error { return errStopCompaction }
	s := ownerStream(t, db, "s", 1)
	const n = 4*compactBatch + 100
	mustAppend(t, s, 1, recs("a", n/5+10))
	commitEvents(t, s, 1, n)
	want := cursorState(s)
	if err := s.Snapshot(context.Background()); !errors.Is(err, errStopCompaction) && err != nil {
		t.Fatal(err)
	}
	// Serialised with a background run that may still hold the stream.
	s.admin.Lock()
	s.assigned.mu.Lock()
	purged := s.assigned.m.CursorEventsPurged
	s.assigned.mu.Unlock()
	s.admin.Unlock()
	got := s.storedEventOffsets(t)
	if purged == 0 || purged >= n || uint64(len(got)) != n-purged || got[0] != purged {
		t.Fatalf("mid-compaction: purge mark %d, %d events stored from %v; want part deleted, the rest from the mark", purged, len(got), got[:min(1, len(got))])
	}
	if h := s.CursorEventHead(); h < purged {
		t.Fatalf("cursor event head %d below the purge mark %d", h, purged)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "s")
	checkCompacted(t, s, n)
	if got := cursorState(s); !maps.Equal(got, want) {
		t.Fatalf("cursors after reopen %v, want %v", got, want)
	}
}

// A cut across a compacted range: old compacted its events below its
// snapshot at 3, and the cut to the new history at cursor event 2 goes
// below them. old's cursor log restarts empty and takes the new owner's
// state: its snapshot when the new owner compacted too, its events when it
// did not. A crash before the cut's end repeats the same cut.
func TestCutBelowCompactedCursorEvents(t *testing.T) {
	for _, ownerCompacted := range []bool{false, true} {
		t.Run(fmt.Sprintf("owner compacted %v", ownerCompacted), func(t *testing.T) {
			dir := t.TempDir()
			db := openDB(t, dir)
			old, _ := failover(t, db, true)
			checkCompacted(t, old, 3)
			db.afterRecordCut = func() error { return errCrash }
			if err := old.Cut(context.Background(), 6, 2); !errors.Is(err, errCrash) {
				t.Fatalf("interrupted cut: %v", err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			db = openDB(t, dir)
			defer db.Close()
			old, nw := openStream(t, db, "old"), openStream(t, db, "new")
			st := old.State()
			if st.RecordTail != 6 || st.CursorEventTail != 0 || len(cursorState(old)) != 0 || old.CursorEventHead() != 0 {
				t.Fatalf("after the cut below the compacted events: %+v, cursors %v, head %d", st, cursorState(old), old.CursorEventHead())
			}
			if ownerCompacted {
				if err := nw.Snapshot(context.Background()); err != nil {
					t.Fatal(err)
				}
				checkCompacted(t, nw, 4)
			}
			if err := old.AdvanceEpoch(context.Background(), 2); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			from := uint64(0)
			if h := nw.CursorEventHead(); h > 0 {
				// What a follower below the owner's retained events is sent.
				if err := old.InstallCursorSnapshot(ctx, nw.CursorSnapshot()); err != nil {
					t.Fatal(err)
				}
				from = h
			}
			evs, err := nw.ReadCursorEvents(from, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := old.AppendReplicated(ctx, mustRead(t, nw, 6, 0), evs); err != nil {
				t.Fatal(err)
			}
			sameLogs(t, old, nw)
			sameCursors(t, old, nw)
		})
	}
}

func TestInstallCursorSnapshot(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	f := ownerStream(t, db, "f", 2)
	if err := f.AppendReplicated(ctx, nil, []CursorEvent{{Offset: 0, Epoch: 1, Cursor: "a", Position: 0}}); err != nil {
		t.Fatal(err)
	}
	snap := CursorSnapshot{Boundary: 10, Epoch: 2, Cursors: map[string]uint64{"a": 4, "b": 7}}
	for _, bad := range []struct {
		snap CursorSnapshot
		want error
	}{
		{CursorSnapshot{Boundary: 1, Epoch: 1}, ErrOffsetMismatch},
		{CursorSnapshot{Boundary: 10, Epoch: 3}, ErrFenced},
		{CursorSnapshot{Boundary: 10, Epoch: 1, Cursors: map[string]uint64{"": 1}}, ErrInvalidArgument},
	} {
		if err := f.InstallCursorSnapshot(ctx, bad.snap); !errors.Is(err, bad.want) {
			t.Fatalf("install %+v: %v, want %v", bad.snap, err, bad.want)
		}
	}
	if st := f.State(); st.CursorEventTail != 1 || !maps.Equal(cursorState(f), map[string]uint64{"a": 0}) {
		t.Fatalf("a refused install changed the copy: %+v %v", st, cursorState(f))
	}
	if err := f.InstallCursorSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := f.AppendReplicated(ctx, nil, []CursorEvent{{Offset: 10, Epoch: 2, Cursor: "c", Position: 0}}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		st := f.State()
		want := map[string]uint64{"a": 0, "b": 0, "c": 0} // clamped to the empty record log
		if st.CursorEventTail != 11 || !maps.Equal(cursorState(f), want) {
			t.Fatalf("%s: %+v cursors %v", when, st, cursorState(f))
		}
		f.assigned.mu.Lock()
		raw := maps.Clone(f.assigned.cursors)
		f.assigned.mu.Unlock()
		if !maps.Equal(raw, map[string]uint64{"a": 4, "b": 7, "c": 0}) {
			t.Fatalf("%s: cursor state %v", when, raw)
		}
		if len(st.LogEpochs) == 0 || st.LogEpochs[len(st.LogEpochs)-1].Epoch != 2 {
			t.Fatalf("%s: log epochs %+v", when, st.LogEpochs)
		}
	}
	check("installed")
	if err := f.compactCursorEvents(ctx); err != nil {
		t.Fatal(err)
	}
	checkCompacted(t, f, 10)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	f = openStream(t, db, "f")
	check("after reopen")
	checkCompacted(t, f, 10)
}

// A sealed copy keeps its purge mark until the seal is released, so the
// cursor event tail it reports for its next cut stays what that cut leaves.
func TestSealedCopyHoldsCompaction(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 20))
	commitEvents(t, s, 1, 10)
	db.holdCompaction.Store(true)
	if err := s.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Seal(context.Background(), 2, "tr"); err != nil {
		t.Fatal(err)
	}
	if got := s.CursorEventTailAfterCut(5); got != 5 {
		t.Fatalf("tail after a cut to 5 = %d, want 5 (nothing compacted yet)", got)
	}
	db.holdCompaction.Store(false)
	if err := s.compactCursorEvents(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.CursorEventTailAfterCut(5); got != 5 || len(s.storedEventOffsets(t)) != 10 {
		t.Fatalf("sealed copy compacted: tail after a cut to 5 = %d, %d events stored", got, len(s.storedEventOffsets(t)))
	}
	if err := s.Cut(context.Background(), 20, 5); err != nil {
		t.Fatal(err)
	}
	if st := s.State(); st.CursorEventTail != 5 {
		t.Fatalf("cut left cursor event tail %d, want the reported 5", st.CursorEventTail)
	}
	if err := s.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	// Released: the cut's snapshot at 5 is compacted behind.
	if err := s.compactCursorEvents(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkCompacted(t, s, 5)
	if got := s.CursorEventTailAfterCut(3); got != 0 {
		t.Fatalf("tail after a cut to 3 below the compacted events = %d, want 0", got)
	}
}

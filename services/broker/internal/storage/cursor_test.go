package storage

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestCursorCommitRules(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	s := ownerStream(t, db, "c", 1)
	mustAppend(t, s, 1, recs("a", 10))

	for _, name := range []string{"", strings.Repeat("x", MaxCursorName+1)} {
		if _, err := s.CommitCursor(ctx, 1, name, 1); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("cursor name of %d bytes: %v", len(name), err)
		}
	}
	if _, err := s.CommitCursor(ctx, 1, strings.Repeat("x", MaxCursorName), 1); err != nil {
		t.Fatalf("longest cursor name: %v", err)
	}
	if _, err := s.CommitCursor(ctx, 0, "r", 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit at a stale epoch: %v", err)
	}

	ev, err := s.CommitCursor(ctx, 1, "r", 4)
	if err != nil || ev.Position != 4 || ev.Offset != 1 || ev.Epoch != 1 || ev.Cursor != "r" {
		t.Fatalf("commit = %+v, %v", ev, err)
	}
	// Backwards and equal commits leave the cursor and append nothing.
	for _, p := range []uint64{2, 4} {
		ev, err = s.CommitCursor(ctx, 1, "r", p)
		if err != nil || ev.Position != 4 || ev.Offset != 2 {
			t.Fatalf("commit of %d below 4 = %+v, %v", p, ev, err)
		}
	}
	// Clamped to the tail.
	if ev, err = s.CommitCursor(ctx, 1, "r", 100); err != nil || ev.Position != 10 {
		t.Fatalf("commit past the tail = %+v, %v", ev, err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if st := s.State(); st.CursorEventTail != 3 {
		t.Fatalf("cursor event tail = %d, want 3", st.CursorEventTail)
	}
	evs, err := s.ReadCursorEvents(1, 0)
	if err != nil || len(evs) != 2 || evs[0].Position != 4 || evs[1].Position != 10 {
		t.Fatalf("events = %+v, %v", evs, err)
	}
	if evs, err := s.ReadCursorEvents(2, 1); err != nil || len(evs) != 1 || evs[0].Offset != 2 {
		t.Fatalf("bounded events = %+v, %v", evs, err)
	}
	if _, err := s.ReadCursorEvents(4, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("events past the tail: %v", err)
	}
	if p, ok := s.Cursor("r"); !ok || p != 10 {
		t.Fatalf("Cursor = %d, %v", p, ok)
	}
	if _, ok := s.Cursor("nobody"); ok {
		t.Fatal("unknown cursor exists")
	}
}

// TestCursorStateFromSnapshotAndEvents proves the state after a restart is
// the snapshot plus the events after its boundary: the events below the
// boundary are deleted behind the store's back and the state survives.
func TestCursorStateFromSnapshotAndEvents(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	ctx := context.Background()
	s := ownerStream(t, db, "c", 1)
	mustAppend(t, s, 1, recs("a", 20))
	commit := func(name string, p uint64) {
		t.Helper()
		if _, err := s.CommitCursor(ctx, 1, name, p); err != nil {
			t.Fatal(err)
		}
	}
	commit("a", 3)
	commit("b", 5)
	commit("a", 7)
	if err := s.Snapshot(context.Background()); err != nil { // boundary 3
		t.Fatal(err)
	}
	commit("b", 9)
	commit("c", 1)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	s = openStream(t, db, "c")
	if err := db.deleteRange(ctx, s.eventPrefix, 0, 3); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "c")
	for name, want := range map[string]uint64{"a": 7, "b": 9, "c": 1} {
		if p, ok := s.Cursor(name); !ok || p != want {
			t.Fatalf("cursor %s = %d, %v; want %d", name, p, ok, want)
		}
	}
	if st := s.State(); st.CursorEventTail != 5 {
		t.Fatalf("cursor event tail = %d", st.CursorEventTail)
	}
}

func TestCursorAutoSnapshot(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	ctx := context.Background()
	s := ownerStream(t, db, "c", 1)
	mustAppend(t, s, 1, recs("a", snapshotEvery+10))
	for i := range snapshotEvery + 1 {
		if _, err := s.CommitCursor(ctx, 1, "r", uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	snap, err := s.readSnapshot()
	if err != nil || snap.Boundary != snapshotEvery || snap.Cursors["r"] != snapshotEvery {
		t.Fatalf("snapshot = %+v, %v", snap, err)
	}
}

package storage

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// holdCommitter holds the committer's next sync until the returned release
// is called (at most once matters; the test's cleanup calls it too, so a
// failing test does not leave the committer held).
func holdCommitter(t *testing.T, db *DB, s *Stream) (release func(), synced <-chan error) {
	t.Helper()
	// Everything queued so far (s's own first metadata, which Open does
	// not wait for) is written first: the hook is set while the committer
	// is idle, as holdNextSync needs.
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	inSync, rel := holdNextSync(db)
	var once sync.Once
	release = func() { once.Do(func() { close(rel) }) }
	t.Cleanup(release)
	done := make(chan error, 1)
	go func() { done <- s.Sync(context.Background()) }()
	<-inSync
	return release, done
}

// openWhileHeld opens name with the committer held (holdCommitter) and
// fails the test if Open does not return: a store whose Open waits for the
// new metadata to be durable never returns while the sync is held.
func openWhileHeld(t *testing.T, db *DB, name string) *Stream {
	t.Helper()
	opened := make(chan struct{})
	var s *Stream
	var err error
	go func() {
		defer close(opened)
		s, err = db.Open(name)
	}()
	select {
	case <-opened:
	case <-time.After(10 * time.Second):
		t.Fatalf("Open(%q) with the committer held did not return within 10s", name)
	}
	if err != nil {
		t.Fatalf("Open(%q): %v", name, err)
	}
	return s
}

// A broker takes in thousands of new streams from one assignment watch:
// opening a new copy must not wait for a group commit, or the watch waits
// one fsync per stream. Opening returns while the committer is held; the
// copy's metadata is durable with the next write after it.
func TestOpenOfANewStreamDoesNotWaitForTheCommitter(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	held := openStream(t, db, "held")
	release, synced := holdCommitter(t, db, held)
	s := openWhileHeld(t, db, "fresh")
	release()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	names, err := db.Streams()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"fresh", "held"}) {
		t.Fatalf("streams after reopening: %v, want [fresh held]", names)
	}
}

// A stream dropped right after it was opened, its first metadata still
// queued, is gone: the queued write does not land after the drop.
func TestDropRightAfterOpenLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	held := openStream(t, db, "held")
	release, synced := holdCommitter(t, db, held)
	openWhileHeld(t, db, "brief")
	dropped := make(chan error, 1)
	go func() { dropped <- db.Drop("brief") }()
	release()
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		names, err := db.Streams()
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(names, "brief") {
			t.Fatalf("%s: dropped stream still listed: %v", when, names)
		}
	}
	// Anything still queued is written by the next sync.
	if err := held.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("after the drop")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	check("after reopening")
}

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

// waitDone fails the test if done does not close within d: the call it
// stands for is blocked.
func waitDone(t *testing.T, done <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %s", what, d)
	}
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

	opened := make(chan struct{})
	var s *Stream
	var err error
	go func() {
		defer close(opened)
		s, err = db.Open("fresh")
	}()
	// On a store whose Open waits for the new metadata to be durable this
	// never returns while the sync is held.
	waitDone(t, opened, 10*time.Second, `Open("fresh") with the committer held`)
	if err != nil {
		t.Fatal(err)
	}
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
	opened := make(chan struct{})
	go func() {
		defer close(opened)
		_, _ = db.Open("brief")
	}()
	waitDone(t, opened, 10*time.Second, `Open("brief") with the committer held`)
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

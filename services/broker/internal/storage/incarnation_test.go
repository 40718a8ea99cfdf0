package storage

import (
	"context"
	"errors"
	"testing"
)

func TestIncarnationBindsOnceAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := openStream(t, db, "inc")
	if err := s.SetIncarnation(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIncarnation(context.Background(), "first"); err != nil {
		t.Fatalf("same incarnation again: %v", err)
	}
	if err := s.SetIncarnation(context.Background(), "second"); !errors.Is(err, ErrIncarnation) {
		t.Fatalf("another incarnation: %v, want ErrIncarnation", err)
	}
	if got := s.State().Incarnation; got != "first" {
		t.Fatalf("incarnation %q after a refused change, want first", got)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	if got := openStream(t, db, "inc").State().Incarnation; got != "first" {
		t.Fatalf("incarnation %q after restart, want first", got)
	}
}

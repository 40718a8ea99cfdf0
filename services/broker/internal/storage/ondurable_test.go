package storage

import (
	"context"
	"slices"
	"sync"
	"testing"
)

// OnDurable tells the tail at once, then every durable move, each before
// the append that made it returns; never after stop.
func TestOnDurableTellsEachDurableTail(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 3))

	var mu sync.Mutex
	var told []uint64
	stop := s.OnDurable(func(tail uint64) {
		// Called by the committer: taking the durable lock must not
		// deadlock, as the owner's tracker does (SetConfirmWatermark).
		s.SetConfirmWatermark(tail)
		mu.Lock()
		told = append(told, tail)
		mu.Unlock()
	})
	last := func() []uint64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(told)
	}
	if got := last(); !slices.Equal(got, []uint64{3}) {
		t.Fatalf("told %v at registration, want [3]", got)
	}
	mustAppend(t, s, 1, recs("b", 2))
	if got := last(); !slices.Equal(got, []uint64{3, 5}) {
		t.Fatalf("told %v once the append returned, want [3 5]", got)
	}
	if _, err := s.Append(context.Background(), 1, recs("b", 2)); err != nil { // a retry: duplicates, nothing stored
		t.Fatal(err)
	}
	if got := last(); !slices.Equal(got, []uint64{3, 5}) {
		t.Fatalf("told %v after a batch of duplicates, want [3 5]", got)
	}
	stop()
	mustAppend(t, s, 1, recs("c", 1))
	if got := last(); !slices.Equal(got, []uint64{3, 5}) {
		t.Fatalf("told %v after stop, want [3 5]", got)
	}
	if st := s.State(); st.RecordTail != 6 || st.ConfirmWatermark != 5 {
		t.Fatalf("tail %d watermark %d, want 6 and 5", st.RecordTail, st.ConfirmWatermark)
	}
}

// A replaced function is not called again, and the first one's stop
// leaves the second in place.
func TestOnDurableReplaced(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	var first, second []uint64
	stopFirst := s.OnDurable(func(tail uint64) { first = append(first, tail) })
	stopSecond := s.OnDurable(func(tail uint64) { second = append(second, tail) })
	defer stopSecond()
	stopFirst()
	mustAppend(t, s, 1, recs("a", 2))
	if !slices.Equal(first, []uint64{0}) || !slices.Equal(second, []uint64{0, 2}) {
		t.Fatalf("first told %v, second %v; want [0] and [0 2]", first, second)
	}
}

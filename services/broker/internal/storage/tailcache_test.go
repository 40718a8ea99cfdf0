package storage

import (
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"
)

// cached reports whether offset is in s's tail cache.
func cached(s *Stream, off uint64) bool {
	s.durable.dmu.Lock()
	defer s.durable.dmu.Unlock()
	_, ok := s.durable.tail.read(off, off+1, 0)
	return ok
}

// The tail cache must serve exactly what Badger holds, under every bound a
// reader passes.
func TestTailCacheServesWhatBadgerHolds(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := ownerStream(t, db, "s", 1)
	for i := range 5 {
		mustAppend(t, s, 1, recs(fmt.Sprint("b", i), 20))
	}
	if !cached(s, 0) || !cached(s, 99) {
		t.Fatal("appended records are not in the tail cache")
	}
	type read struct {
		from          uint64
		max, maxBytes int
	}
	reads := []read{{0, 0, 0}, {0, 7, 0}, {13, 50, 0}, {99, 10, 0}, {100, 10, 0}, {5, 0, 100}, {40, 3, 1}, {60, 0, 1 << 20}}
	got := map[read][]Record{}
	for _, r := range reads {
		out, err := s.Read(r.from, r.max, r.maxBytes)
		if err != nil {
			t.Fatalf("Read%+v: %v", r, err)
		}
		got[r] = out
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopened, the cache is empty and every read goes to Badger.
	db = openDB(t, dir)
	defer db.Close()
	s = openStream(t, db, "s")
	if cached(s, 0) {
		t.Fatal("a reopened stream has a tail cache")
	}
	for _, r := range reads {
		want, err := s.Read(r.from, r.max, r.maxBytes)
		if err != nil {
			t.Fatalf("Read%+v from Badger: %v", r, err)
		}
		if len(got[r]) != len(want) {
			t.Fatalf("Read%+v: %d records from the cache, %d from Badger", r, len(got[r]), len(want))
		}
		for i := range want {
			if err := sameRecord(got[r][i], want[i]); err != nil {
				t.Fatalf("Read%+v: %v", r, err)
			}
		}
	}
}

// After a cut the cache holds only the new owner's entries: a reader never
// sees a cut record from memory.
func TestTailCacheEmptiedByCut(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	old, nw := failover(t, db, false)
	if !cached(old, 9) {
		t.Fatal("old owner's records are not cached")
	}
	if err := old.Cut(context.Background(), 6, 2); err != nil {
		t.Fatal(err)
	}
	if cached(old, 6) || cached(old, 0) {
		t.Fatal("the tail cache kept records across a cut")
	}
	catchUp(t, old, nw)
	sameLogs(t, old, nw)
	if !cached(old, old.State().RecordTail-1) {
		t.Fatal("records taken after the cut are not cached")
	}
}

func TestTailCacheEmptiedByReset(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 10))
	if _, err := s.Seal(context.Background(), 2, "tr"); err != nil {
		t.Fatal(err)
	}
	if err := s.AdvanceEpoch(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if err := s.ResetTo(context.Background(), 50, 0xabc); err != nil {
		t.Fatal(err)
	}
	if cached(s, 9) {
		t.Fatal("the tail cache kept records across a reset")
	}
	if _, err := s.Read(5, 0, 0); err == nil {
		t.Fatal("read below the reset head succeeded")
	}
}

// Both bounds hold: a stream's cache stays within TailCacheBytes and all
// of them within TailCacheTotalBytes, and a stream over budget still reads
// everything from Badger.
func TestTailCacheBounded(t *testing.T) {
	db, err := Open(Options{Dir: t.TempDir(), Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20,
		TailCacheBytes: 4 << 10, TailCacheTotalBytes: 6 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	a, b := ownerStream(t, db, "a", 1), ownerStream(t, db, "b", 1)
	for i := range 10 {
		for _, s := range []*Stream{a, b} {
			if _, err := s.Append(ctx, 1, sizedRecs(fmt.Sprint(s.Name(), i), 5, 500)); err != nil {
				t.Fatal(err)
			}
			s.durable.dmu.Lock()
			n := s.durable.tail.bytes
			s.durable.dmu.Unlock()
			if n > 4<<10 {
				t.Fatalf("stream %s caches %d bytes, bound 4096", s.Name(), n)
			}
			if u := db.tailCacheUsed.Load(); u > 6<<10 || u < 0 {
				t.Fatalf("tail caches hold %d bytes, budget 6144", u)
			}
		}
	}
	if !cached(a, 49) && !cached(b, 49) {
		t.Fatal("neither stream caches its newest record")
	}
	for _, s := range []*Stream{a, b} {
		if got := mustRead(t, s, 0, 0); len(got) != 50 {
			t.Fatalf("stream %s: read %d records, want 50", s.Name(), len(got))
		}
	}
	a.close()
	b.close()
	if u := db.tailCacheUsed.Load(); u != 0 {
		t.Fatalf("closed streams still account %d cached bytes", u)
	}
}

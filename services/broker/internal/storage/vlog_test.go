package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// vlogFiles lists the value log files in dir.
func vlogFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".vlog") {
			out = append(out, e.Name())
		}
	}
	return out
}

// garbageDB is a store whose value log files (1 MiB each) retention left
// mostly garbage, with Badger's garbage counts up to date: the GC has a
// file to rewrite. It returns the store's dir, the stream "s", its record
// tail and the 96 records retention kept.
func garbageDB(t *testing.T) (string, *DB, *Stream, uint64, []Record) {
	t.Helper()
	// Each batch is one 256 KiB segment.
	dir, db, s := valueLogDB(t, 1<<20, 24)
	tail := s.State().RecordTail
	s.SetConfirmWatermark(tail)
	// Keep the last batch and a half: the files before them are garbage
	// but for the segment that straddles the head.
	if h, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 96}, time.Now()); err != nil || h != tail-96 {
		_ = db.Close()
		t.Fatalf("retention: head %d, %v", h, err)
	}
	want := mustRead(t, s, tail-96, 96)
	countGarbage(t, db)
	return dir, db, s, tail, want
}

// liveGarbage appends to two owned streams of db, "s" and "k", so that
// retention on s leaves every value log file mostly garbage while k keeps a
// few records in each: a GC rewrite has values to move. It returns s, its
// record tail and k's records.
func liveGarbage(t *testing.T, db *DB) (*Stream, uint64, []Record) {
	t.Helper()
	s := ownerStream(t, db, "s", 1)
	k := ownerStream(t, db, "k", 1)
	var want []Record
	for i := range 24 {
		mustAppend(t, s, 1, sizedRecs(fmt.Sprint("a", i), 64, 4096))
		if i%4 == 0 {
			want = append(want, mustAppend(t, k, 1, sizedRecs(fmt.Sprint("k", i), 8, 4096))...)
		}
	}
	tail := s.State().RecordTail
	s.SetConfirmWatermark(tail)
	if _, err := s.ApplyRetention(context.Background(), Retention{MaxRecords: 96}, time.Now()); err != nil {
		t.Fatal(err)
	}
	countGarbage(t, db)
	return s, tail, want
}

// countGarbage brings Badger's garbage counts per value log file up to
// date: Badger counts a file's garbage when compaction drops the deleted
// segments, so the memtables are flushed (dropping a prefix that holds a
// key flushes the active one too) and everything is compacted now.
func countGarbage(t *testing.T, db *DB) {
	t.Helper()
	if err := db.eng.FlushAndCompact(); err != nil {
		t.Fatal(err)
	}
}

// valueLogDB opens a store with value log files of fileBytes and appends
// batches of 256 KiB (64 records of 4 KiB, all in the value log) to an
// owned stream "s".
func valueLogDB(t *testing.T, fileBytes int64, batches int) (string, *DB, *Stream) {
	t.Helper()
	dir := t.TempDir()
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: fileBytes})
	if err != nil {
		t.Fatal(err)
	}
	s := ownerStream(t, db, "s", 1)
	for i := range batches {
		if _, err := s.Append(context.Background(), 1, sizedRecs(fmt.Sprint("a", i), 64, 4096)); err != nil {
			_ = db.Close()
			t.Fatal(err)
		}
	}
	return dir, db, s
}

// The value log GC rewrites a file that retention left mostly garbage, and
// Badger deletes the old file only once the rewrite is durable: when the
// rewrite returns, every file it started with is still there (without the
// iterator that pins them, Badger deletes the rewritten file at once, and a
// power loss would then lose the values its rewrite had not yet synced).
// Afterwards the old file is gone and every retained record reads back
// byte-identical, after a reopen too.
func TestValueLogGCKeepsTheOldFileUntilTheRewriteIsDurable(t *testing.T) {
	dir, db, s, tail, want := garbageDB(t)
	before := vlogFiles(t, dir)
	hooked := false
	var during []string
	// That the committer is kept out until the rewrite is durable is
	// engine.TestValueLogGCKeepsTheCommitterOut.
	db.hooks.AfterGCRewrite = func() {
		hooked = true
		during = vlogFiles(t, dir)
	}
	if err := db.eng.RunValueLogGC(); err != nil {
		_ = db.Close()
		t.Fatalf("value log GC: %v (files %v)", err, before)
	}
	if !hooked {
		t.Fatal("the GC rewrote nothing")
	}
	for _, f := range before {
		if !slices.Contains(during, f) {
			t.Errorf("value log file %s was deleted before the rewrite was synced (files before %v, after the rewrite %v)", f, before, during)
		}
	}
	after := vlogFiles(t, dir)
	gone := 0
	for _, f := range before {
		if !slices.Contains(after, f) {
			gone++
		}
	}
	if gone == 0 {
		t.Errorf("no value log file was deleted by the GC: before %v, after %v", before, after)
	}
	check := func(s *Stream) {
		t.Helper()
		got := mustRead(t, s, tail-96, 96)
		if len(got) != len(want) {
			t.Fatalf("read %d records after the GC, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i].Offset != want[i].Offset || got[i].Chain != want[i].Chain || !bytes.Equal(got[i].Payload, want[i].Payload) {
				t.Fatalf("record %d differs after the GC", want[i].Offset)
			}
		}
	}
	check(s)
	// Appends go on after a GC.
	mustAppend(t, s, 1, sizedRecs("after-gc", 4, 4096))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	check(openStream(t, db, "s"))
}

// A rewrite that holds every write longer than gcStallLimit (Badger retries
// a failed memtable flush for ever) fails the store, as a failed write
// does: the broker then stops and its streams fail over, instead of
// keeping its lease with a store that takes no write.
func TestValueLogGCThatHoldsWritesTooLongFailsTheStore(t *testing.T) {
	_, db, s, _, _ := garbageDB(t)
	defer db.Close()
	db.hooks.GCStallLimit = 100 * time.Millisecond
	failed := make(chan error, 1)
	db.onFail = func(err error) { failed <- err }
	release := make(chan struct{})
	db.hooks.AfterGCRewrite = func() { <-release }
	done := make(chan error, 1)
	go func() { done <- db.eng.RunValueLogGC() }()
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("OnFail with no error")
		}
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("the store did not fail while the GC held every write")
	}
	close(release)
	<-done
	if _, err := s.Append(context.Background(), 1, recs("after-stall", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after the stall: %v, want ErrClosed", err)
	}
}

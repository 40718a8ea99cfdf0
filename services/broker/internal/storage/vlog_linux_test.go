package storage

import (
	"testing"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// withFileSizeLimit runs fn with RLIMIT_FSIZE at limit: every write(2) past
// it fails with EFBIG (the Go runtime ignores SIGXFSZ), as on a full disk.
// It is process-wide, so the test must not run in parallel with others.
func withFileSizeLimit(t *testing.T, limit uint64, fn func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lowered := old
	lowered.Cur = limit
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lowered); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}()
	fn()
}

// A value log GC rewrite that fails part way (its writes refused, as on a
// full disk) stops the DB as a failed write does: it may have moved values
// without syncing them, and what the failed write left is not known. The
// marker stays for the next open, and every record reads back after it.
func TestFailedValueLogGCStopsTheDB(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(Options{Dir: dir, Logger: zerolog.Nop(), MemTableBytes: 8 << 20, CacheBytes: 4 << 20, ValueLogFileBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s, tail, want := liveGarbage(t, db)
	var reported error
	db.onFail = func(err error) { reported = err }
	var gcErr error
	// Every value log file exists at its full size, so the rewrite's first
	// write is the first refused; the marker is empty.
	withFileSizeLimit(t, 1, func() { gcErr = db.rewriteValueLogFile() })
	if gcErr == nil {
		_ = db.Close()
		t.Fatal("the value log GC rewrote a file although its writes were refused")
	}
	t.Logf("value log GC: %v", gcErr)
	if db.usable() == nil || reported == nil {
		_ = db.Close()
		t.Fatalf("the value log GC failed (%v) and the DB goes on (OnFail got %v)", gcErr, reported)
	}
	if _, err := s.Append(t.Context(), 1, sizedRecs("after", 1, 16)); err == nil {
		t.Error("an append after the failed GC was taken")
	}
	if !fileExists(dir, gcMarkerFile) {
		t.Error("the GC marker was removed although the rewrite failed")
	}
	if err := db.Close(); err != nil {
		t.Logf("close after the failure: %v", err)
	}
	db = openDB(t, dir)
	defer db.Close()
	if st := openStream(t, db, "s").State(); st.RecordTail != tail {
		t.Fatalf("record tail of s %d after the reopen, want %d", st.RecordTail, tail)
	}
	got := mustRead(t, openStream(t, db, "k"), 0, len(want))
	sameRecords(t, "after the reopen", got, want)
}

package engine

import (
	"os"
	"path/filepath"
	"testing"

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
// full disk) stops the engine as a failed write does: it may have moved
// values without syncing them, and what the failed write left is not
// known. The marker stays for the next open, and every live value reads
// back after it.
func TestFailedValueLogGCStopsTheDB(t *testing.T) {
	dir := t.TempDir()
	var reported error
	e := openEngine(t, dir, Options{OnFail: func(err error) { reported = err }})
	want := liveGarbage(t, e)
	var gcErr error
	// Every value log file exists at its full size, so the rewrite's first
	// write is the first refused; the marker is empty.
	withFileSizeLimit(t, 1, func() { gcErr = e.RunValueLogGC() })
	if gcErr == nil {
		_ = e.Close()
		t.Fatal("the value log GC rewrote a file although its writes were refused")
	}
	t.Logf("value log GC: %v", gcErr)
	if e.Err() == nil || reported == nil {
		_ = e.Close()
		t.Fatalf("the value log GC failed (%v) and the engine goes on (OnFail got %v)", gcErr, reported)
	}
	b := &Batch{}
	b.Set([]byte("after"), []byte("x"))
	if err := e.Do(t.Context(), b); err == nil {
		t.Error("a write after the failed GC was taken")
	}
	if _, err := os.Stat(filepath.Join(dir, gcMarkerFile)); err != nil {
		t.Errorf("the GC marker was removed although the rewrite failed: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Logf("close after the failure: %v", err)
	}
	e = openEngine(t, dir, Options{})
	defer e.Close()
	checkValues(t, e, "after the reopen", want)
}

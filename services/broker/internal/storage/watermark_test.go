package storage

import (
	"fmt"
	"testing"

	"github.com/strandhq/strand/internal/clustertest"
)

// storedWatermark reads the confirm watermark in s's metadata as Badger
// holds it, with the tails entries newer than it (what a restart would
// find).
func storedWatermark(t *testing.T, s *Stream) uint64 {
	t.Helper()
	return storedMeta(t, s).ConfirmWatermark
}

// A raised watermark reaches storage without any other write on the
// stream, within the flush interval.
func TestWatermarkPersistedWithoutOtherWrites(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 10))
	if got := storedWatermark(t, s); got != 0 {
		t.Fatalf("stored watermark %d before any was set", got)
	}
	s.SetConfirmWatermark(7)
	clustertest.Eventually(t, 10*watermarkPersistInterval, "the watermark stored", func() error {
		if w := storedWatermark(t, s); w != 7 {
			return fmt.Errorf("stored watermark %d, want 7", w)
		}
		return nil
	})
}

// The next metadata write carries the watermark, and no separate write
// follows it: a flush finds nothing to do.
func TestWatermarkRidesOnTheNextWrite(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 10))
	s.SetConfirmWatermark(10)
	mustAppend(t, s, 1, recs("b", 1))
	if got := storedWatermark(t, s); got != 10 {
		t.Fatalf("stored watermark %d after the next append, want 10", got)
	}
	if o := s.watermarkTouch(); o != nil {
		t.Fatal("a watermark write is due although the append carried the watermark")
	}
}

// A clean close keeps the latest watermark even inside the flush interval.
func TestWatermarkKeptByCleanClose(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := ownerStream(t, db, "s", 1)
	mustAppend(t, s, 1, recs("a", 10))
	s.SetConfirmWatermark(9)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openDB(t, dir)
	defer db.Close()
	if got := openStream(t, db, "s").State().ConfirmWatermark; got != 9 {
		t.Fatalf("watermark %d after a clean close, want 9", got)
	}
}
